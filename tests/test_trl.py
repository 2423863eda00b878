"""GraftGRPOTrainer inside a real TRL GRPOTrainer loop (CPU, tiny random Qwen3, a few steps)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest
import torch
from conftest import load_script
from trl import GRPOConfig, ModelConfig, TrlParser
from trl_helpers import CHARS, char_tokenizer, length_reward, prompt_dataset, tiny_policy

from rollout_graft.config import METHODS, EngineConfig, RetrievalConfig, SamplingParams
from rollout_graft.engine import RolloutEngine
from trainers import GraftConfig, GraftGRPOTrainer
from trainers.config import PRIOR_FILE

pytestmark = pytest.mark.usefixtures("one_thread")


def grpo_args(tmp_path, **overrides) -> GRPOConfig:
    kwargs = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=12,
        max_steps=2, logging_steps=1, learning_rate=1e-3, report_to="none", save_strategy="no", use_cpu=True,
        bf16=False, disable_tqdm=True, seed=0,
    )
    kwargs.update(overrides)
    return GRPOConfig(**kwargs)


class RecordingTrainer(GraftGRPOTrainer):
    """Keeps what each rollout received and returned."""

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        self.rollouts = getattr(self, "rollouts", []) + [(prompt_ids, completion_ids, logprobs)]
        return completion_ids, logprobs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 2-step run shared by the tests below (conversational prompts, a chat-template kwarg)."""
    tok = char_tokenizer()
    tok.chat_template = "{% if tag %}q{% endif %}" + tok.chat_template
    model = tiny_policy(len(tok))
    modes = []  # model.training during every forward under inference mode (= the engine's forwards)
    model.register_forward_pre_hook(lambda m, a: modes.append(m.training) if torch.is_inference_mode_enabled() else None)
    out = tmp_path_factory.mktemp("grpo")
    trainer = RecordingTrainer(
        model, length_reward, args=grpo_args(out, chat_template_kwargs={"tag": True}),
        graft_config=GraftConfig(method="retrieval"), train_dataset=prompt_dataset(16, conversational=True),
        processing_class=tok,
    )
    trainer.train()
    return trainer, tok, modes


def test_rollout_metrics_are_logged_every_step(trained):
    trainer, _, _ = trained
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2
    for h in steps:
        for name in ("rollout/tokens_per_s", "rollout/mean_accepted_tokens", "rollout/verify_tokens_per_step",
                     "rollout/seconds"):
            assert h[name] > 0, name
        assert h["rollout/mean_accepted_tokens"] >= 1.0  # MAT counts the bonus token


def test_engine_logprobs_match_trl_recompute(trained):
    """TRL's importance-sampling path recomputes every sampled token's logprob with the training
    forward; the engine's logprobs must agree (ratio exp(Δ) ≈ 1)."""
    trainer, _, _ = trained
    for h in (h for h in trainer.state.log_history if "loss" in h):
        assert h["sampling/sampling_logp_difference/max"] < 1e-4
        assert h["sampling/importance_sampling_ratio/min"] == pytest.approx(1.0, abs=1e-3)
        assert h["sampling/importance_sampling_ratio/max"] == pytest.approx(1.0, abs=1e-3)


def test_chat_template_and_kwargs_are_applied(trained):
    trainer, tok, _ = trained
    prompt_ids, completion_ids, logprobs = trainer.rollouts[0]
    texts = {tok.decode(p) for p in prompt_ids}
    assert all(t.startswith("qu:") and t.endswith("\na:") for t in texts), texts  # "q" comes from tag=True
    assert len(prompt_ids) == 8 and len(texts) == 2  # 2 prompts x num_generations=4, repeated consecutively
    assert all(len(c) >= 1 and len(c) == len(lp) for c, lp in zip(completion_ids, logprobs))


def test_generation_runs_in_eval_mode_and_training_resumes(trained):
    trainer, _, modes = trained
    assert modes and not any(modes)
    assert trainer.model.training


def test_greedy_rollouts_equal_plain_greedy(trained):
    trainer, tok, _ = trained
    trainer.temperature = 0.0  # greedy through the trainer's own rollout path
    try:
        prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tag=True)["input_ids"]
                   for q in ("1+2=", "1+2=", "3*4=")]
        completions, _ = trainer._generate_single_turn(prompts, None, {}, 2)
    finally:
        trainer.temperature = trainer.args.temperature
    model = trainer.model.eval()
    for p, c in zip(prompts, completions):
        ref = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=12, eos_token_id=1, pad_token_id=0)
        assert c == ref[0, len(p):].tolist()
    model.train()


def test_save_model_writes_a_loadable_prior(trained, tmp_path):
    trainer, tok, _ = trained
    trainer.save_model(str(tmp_path))
    prior = tmp_path / PRIOR_FILE
    assert prior.exists()
    cfg = EngineConfig(method="retrieval", retrieval=RetrievalConfig(prior_path=str(prior)))
    out = RolloutEngine(trainer.model.eval(), cfg, tokenizer=tok).generate([[3, 4, 5]], SamplingParams(max_new_tokens=4, seed=0))
    trainer.model.train()
    assert len(out.completion_ids[0]) >= 1


def test_grpo_learns_a_trivial_reward(tmp_path):
    """End to end sign check: rewarding the character '7' makes the policy write more 7s."""
    tok = char_tokenizer()

    def sevens(completions, **kwargs):
        return [c.count("7") / max(len(c), 1) for c in completions]

    args = grpo_args(tmp_path, per_device_train_batch_size=16, num_generations=8, max_completion_length=16,
                     max_steps=10, learning_rate=1e-2)
    trainer = GraftGRPOTrainer(tiny_policy(len(tok), sharp=1.0), sevens, args=args, train_dataset=prompt_dataset(64),
                               processing_class=tok)
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert sum(rewards[-3:]) > 2 * sum(rewards[:3]), rewards  # e.g. 0.026 .. 0.12 per character


# ---------------------------------------------------------------------------- configuration
def test_graft_config_parses_next_to_grpo_config(tmp_path):
    parser = TrlParser((GRPOConfig, ModelConfig, GraftConfig))
    grpo, _, graft = parser.parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--bf16", "false", "--num_generations", "4", "--per_device_train_batch_size", "8",
         "--method", "retrieval", "--budget", "16", "--share_in_group", "false", "--rollout_seed", "3",
         "--suffix_depth", "6", "--group_lead", "1"]
    )
    assert grpo.num_generations == 4 and grpo.seed == 42
    assert (graft.method, graft.budget, graft.share_in_group, graft.rollout_seed) == ("retrieval", 16, False, 3)
    engine = graft.engine_config()
    assert engine.method == "retrieval" and engine.budget == 16 and engine.retrieval.share_in_group is False
    assert engine.retrieval.suffix_depth == 6 and engine.group_lead == 1


def test_unset_fields_keep_engine_defaults():
    default, mapped = EngineConfig(method="retrieval"), GraftConfig().engine_config()
    assert (mapped.budget, mapped.max_depth, mapped.retrieval.share_in_group) == (
        default.budget, default.max_depth, default.retrieval.share_in_group)


def test_suffix_depth_never_exceeds_max_depth_however_the_config_is_built():
    """An explicit suffix_depth above max_depth is refused; the default one is cut at max_depth (it was 8 under
    EngineConfig(max_depth=4), and GraftConfig(max_depth=4) was refused for a suffix_depth never set)."""
    assert EngineConfig(method="retrieval", max_depth=4).retrieval.suffix_depth == 4
    assert EngineConfig(method="retrieval", max_depth=16).retrieval.suffix_depth == 8
    assert GraftConfig(max_depth=4).engine_config().retrieval.suffix_depth == 4
    assert GraftConfig(max_depth=4, suffix_depth=0).engine_config().retrieval.suffix_depth == 0
    with pytest.raises(ValueError, match="suffix_depth=8 exceeds max_depth=4"):
        EngineConfig(method="retrieval", max_depth=4, retrieval=RetrievalConfig(suffix_depth=8))
    with pytest.raises(ValueError, match="suffix_depth=6 exceeds max_depth=4"):
        GraftConfig(max_depth=4, suffix_depth=6)
    with pytest.raises(ValueError, match="max_depth must be >= 1, got 0"):
        GraftConfig(max_depth=0)


def test_unknown_method_names_the_choices():
    with pytest.raises(ValueError, match="unknown method 'eagle'") as err:
        GraftConfig(method="eagle")
    assert all(m in str(err.value) for m in METHODS)
    with pytest.raises(TypeError, match="GraftConfig.method must be a string: one of") as err:
        GraftConfig(method=None)  # was silently the engine's default "ar", not GraftConfig's "retrieval"
    assert all(m in str(err.value) for m in METHODS) and str(err.value).endswith("got NoneType None")


def test_unknown_budget_policy_is_rejected():
    with pytest.raises(ValueError, match="budget_policy"):
        GraftConfig(budget_policy="greedy")


def test_drafter_needs_a_drafter_method():
    with pytest.raises(ValueError, match="does not use a draft model"):
        GraftConfig(method="retrieval", draft_model_name_or_path="some/dir")
    with pytest.raises(ValueError, match="set draft_model_name_or_path"):
        GraftConfig(method="graft")


def save_drafter(path, tok, seed=1):
    tiny_policy(len(tok), seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_drafter_with_another_tokenizer_is_rejected(tmp_path):
    tok = char_tokenizer()
    drafter = save_drafter(tmp_path / "draft", char_tokenizer(CHARS[::-1]))  # same size, other ids
    with pytest.raises(ValueError, match="maps .* tokens differently"):
        GraftGRPOTrainer(tiny_policy(len(tok)), length_reward, args=grpo_args(tmp_path / "out"),
                         graft_config=GraftConfig(method="graft", draft_model_name_or_path=drafter),
                         train_dataset=prompt_dataset(), processing_class=tok)


def test_graft_method_with_a_drafter_trains(tmp_path):
    """method 'graft' (drafter trees + retrieval) behind TRL: its logprobs match TRL's recompute too;
    with draft_reload_steps=1 the drafter is re-read from its directory before the second step."""
    tok = char_tokenizer()
    graft = GraftConfig(method="graft", draft_model_name_or_path=save_drafter(tmp_path / "draft", tok), draft_reload_steps=1)
    trainer = GraftGRPOTrainer(tiny_policy(len(tok)), length_reward, args=grpo_args(tmp_path / "out", max_steps=2),
                               graft_config=graft, train_dataset=prompt_dataset(), processing_class=tok)
    trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert len(history) == 2 and trainer._drafter_reloads == 1
    for h in history:
        assert h["rollout/mean_accepted_tokens"] >= 1.0
        assert h["sampling/sampling_logp_difference/max"] < 1e-4


def test_a_drafter_refresh_that_cannot_read_keeps_the_old_drafter(tmp_path, caplog):
    """An outside job may still be writing the drafter's directory when the trainer re-reads it:
    the refresh is skipped with a warning (and retried at the next rollout), training goes on."""
    from transformers import TrainerCallback

    tok = char_tokenizer()
    draft_dir = tmp_path / "draft"
    graft = GraftConfig(method="graft", draft_model_name_or_path=save_drafter(draft_dir, tok), draft_reload_steps=1)

    class HalfWrite(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            (draft_dir / "model.safetensors").write_bytes(b"\x00" * 10)  # a truncated weights file

    trainer = GraftGRPOTrainer(tiny_policy(len(tok)), length_reward, args=grpo_args(tmp_path / "out", max_steps=2),
                               graft_config=graft, train_dataset=prompt_dataset(), processing_class=tok,
                               callbacks=[HalfWrite()])
    with caplog.at_level("WARNING", logger="trainers.grpo"):
        trainer.train()
    assert len([h for h in trainer.state.log_history if "loss" in h]) == 2
    assert trainer._drafter_reloads == 0 and trainer._drafter_reload_failures == 1
    assert "drafter refresh failed" in caplog.text and "could not read the draft model" in caplog.text


def test_draft_reload_needs_a_drafter():
    with pytest.raises(ValueError, match="draft_reload_steps"):
        GraftConfig(method="retrieval", draft_reload_steps=10)


def test_engine_reloads_a_drafter_and_refuses_another_vocabulary(tmp_path):
    tok = char_tokenizer()
    policy = tiny_policy(len(tok))
    engine = RolloutEngine(policy, EngineConfig(method="graft"), tokenizer=tok, draft_model=save_drafter(tmp_path / "a", tok))
    prompts = [tok("Q:1+2=")["input_ids"]] * 2
    greedy = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    before = engine.generate(prompts, greedy).completion_ids
    engine.reload_draft_model(save_drafter(tmp_path / "b", tok, seed=5))
    assert engine.generate(prompts, greedy).completion_ids == before  # another drafter, the same output
    with pytest.raises(ValueError, match="maps .* tokens differently"):
        engine.reload_draft_model(save_drafter(tmp_path / "c", char_tokenizer(CHARS[::-1])))
    (tmp_path / "b" / "model.safetensors").write_bytes(b"\x00" * 10)  # caught mid-write
    with pytest.raises(OSError, match="could not read the draft model .* current drafter is kept"):
        engine.reload_draft_model(tmp_path / "b")
    assert engine.generate(prompts, greedy).completion_ids == before  # the old drafter still drafts
    with pytest.raises(ValueError, match="no draft model"):
        RolloutEngine(policy, EngineConfig(method="retrieval")).reload_draft_model(tmp_path / "a")


def test_num_generations_must_divide_the_batch(tmp_path):
    with pytest.raises(ValueError, match=r"divisible by num_generations \(4\)"):
        grpo_args(tmp_path, per_device_train_batch_size=6, num_generations=4)


@pytest.mark.parametrize("override, match", [
    ({"use_vllm": True}, "set use_vllm=False"),
    ({"generation_kwargs": {"do_sample": False}}, "generation_kwargs"),
    # GRPOConfig accepts these; torch's DataLoader refused 0 only at the first step, -4 failed in a deque
    ({"per_device_train_batch_size": 0}, r"per_device_train_batch_size=0: .*set per_device_train_batch_size to an int >= 1"),
    ({"per_device_train_batch_size": -4}, r"per_device_train_batch_size=-4: .*an int >= 1"),
    ({"per_device_eval_batch_size": 0}, r"per_device_eval_batch_size=0: .*an int >= 1"),
])
def test_grpo_settings_the_engine_cannot_honour(tmp_path, override, match):
    tok = char_tokenizer()
    with pytest.raises(ValueError, match=match):
        GraftGRPOTrainer(tiny_policy(len(tok)), length_reward, args=grpo_args(tmp_path, **override),
                         train_dataset=prompt_dataset(), processing_class=tok)


def test_an_empty_batch_is_refused_on_the_vllm_backend_too(tmp_path):
    tok = char_tokenizer()
    with pytest.raises(ValueError, match=r"per_device_train_batch_size=0: .*an int >= 1"):
        GraftGRPOTrainer(tiny_policy(len(tok)), length_reward, args=grpo_args(tmp_path, per_device_train_batch_size=0),
                         graft_config=GraftConfig(backend="vllm", method="ar"), train_dataset=prompt_dataset(),
                         processing_class=tok)


def test_rollout_func_is_rejected(tmp_path):
    tok = char_tokenizer()
    with pytest.raises(ValueError, match="rollout_func"):
        GraftGRPOTrainer(tiny_policy(len(tok)), length_reward, args=grpo_args(tmp_path), rollout_func=lambda p, t: {},
                         train_dataset=prompt_dataset(), processing_class=tok)


# ---------------------------------------------------------------------------- recipe
def load_recipe():
    return load_script("recipes/grpo_qwen3.py")


@pytest.mark.parametrize("backend", ["engine", "hf"])
def test_recipe_runs_and_writes_logs(tmp_path, backend):
    tok = char_tokenizer()
    tiny_policy(len(tok)).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    rows = [{"prompt": f"Q:{q}\nA:", "answer": "3", "split": split}
            for q in ("1+2=", "3*4=", "9-5=", "7+8=") for split in ("train", "test")]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = load_recipe()
    args = recipe.make_parser().parse_args_into_dataclasses([
        "--backend", backend, "--model_name_or_path", str(tmp_path / "model"),
        "--dataset_path", str(tmp_path / "prompts.jsonl"), "--output_dir", str(tmp_path / "out-{backend}"),
        "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_generations", "4",
        "--max_completion_length", "8", "--use_cpu", "true",
        "--num_eval_prompts", "2", "--eval_steps", "1", "--per_device_eval_batch_size", "8", "--num_generations_eval", "4",
    ])
    summary = recipe.main(*args)
    out = tmp_path / f"out-{backend}"
    assert json.loads((out / "summary.json").read_text())["steps"] == summary["steps"] == 2
    assert summary["rollout_tokens_per_s"] > 0 and 0 < summary["rollout_share"] <= 1
    history = json.loads((out / "log_history.json").read_text())
    assert all("rewards/correctness_reward/mean" in h for h in history if "loss" in h)
    assert (summary["mean_accepted_tokens"] is None) == (backend == "hf")
    assert [step for step, _ in summary["eval_correct"]] == [0, 1, 2]  # held-out set before training + every step
    assert summary["eval_held_out"] is False  # both splits hold the same four questions: not held out
    assert (out / "model.safetensors").exists()


def test_recipe_backend_names_and_model_paths(tmp_path, monkeypatch):
    """One name per backend ("engine", as GraftConfig says; the old "graft" warns and maps to it); a missing
    local folder is named as missing; a Hub id is refused only while HF_HUB_OFFLINE is set."""
    recipe = load_recipe()
    with pytest.warns(FutureWarning, match="--backend graft is deprecated: use --backend engine"):
        assert recipe.RecipeGraftConfig(backend="graft").backend == "engine"
    with pytest.raises(ValueError, match="choose one of"):
        recipe.RecipeGraftConfig(backend="graf")
    assert recipe.model_path(None) == str(recipe.TINY_TARGET)
    with pytest.raises(FileNotFoundError, match="is not a model folder \\(no config.json in it\\)"):
        recipe.model_path(str(tmp_path))  # a folder, but no model's
    (tmp_path / "config.json").write_text("{}")
    assert recipe.model_path(str(tmp_path)) == str(tmp_path)
    adapter = tmp_path / "adapter"  # a PEFT adapter's folder, which transformers loads by its adapter_config.json
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    assert recipe.model_path(str(adapter)) == str(adapter)
    for missing in (str(tmp_path / "nope"), "./nope", f"{tmp_path.name}/nope/model"):
        with pytest.raises(FileNotFoundError, match="no such directory"):
            recipe.model_path(missing)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="unset HF_HUB_OFFLINE"):
        recipe.model_path("Qwen/Qwen3-0.6B")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert recipe.model_path("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"  # left to the Hub client
    assert not recipe._names_a_model(["--max_steps", "2"]) and recipe._names_a_model(["--model_name_or_path=x"])
    assert recipe.output_dir("runs/{backend}-1", "vllm") == "runs/vllm-1"
    for template in ("runs/{date}", "runs/{}", "runs/{backend"):
        with pytest.raises(ValueError, match="only {backend} may appear in braces"):
            recipe.output_dir(template, "engine")
    for name in ("num_train_prompts", "num_eval_prompts", "num_threads"):
        with pytest.raises(ValueError, match=f"--{name} -1: a count, 0 or more"):
            recipe.ScriptArguments(**{name: -1})


def test_recipe_command_line_names_bad_input_inside_main_in_one_line(tmp_path, monkeypatch):
    """A bad setting found inside `main` (a dataset row, read as the trainer is built) ends in one line and a
    nonzero exit, as the parser's checks do, not a traceback; any other exception keeps its traceback."""
    recipe = load_recipe()
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "Q: 1+1?", "answer": "2"}\n{"prompt": "Q: 2+2?", "answer": "four"}\n')
    argv = ["--dataset_path", str(path), "--num_threads", "0", "--output_dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exc:
        recipe.cli(argv)
    said = str(exc.value.code)
    assert said.startswith("recipes/grpo_qwen3.py: ") and "line 2" in said and "\n" not in said, said

    def bug(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(recipe, "main", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        recipe.cli(argv)

    def bug_in_training(*args):  # a ValueError after the trainer was built is a bug's, not bad input
        raise ValueError("a bug in training")

    monkeypatch.setattr(recipe, "main", bug_in_training)
    with pytest.raises(ValueError, match="a bug in training"):
        recipe.cli(argv)


def test_eval_on_training_rows_is_not_called_held_out(capsys):
    from datasets import Dataset

    recipe = load_recipe()
    train = Dataset.from_dict({"prompt": ["a", "b"]})
    assert recipe.eval_is_held_out(train, Dataset.from_dict({"prompt": ["c"]})) is True
    assert recipe.eval_is_held_out(train, Dataset.from_dict({"prompt": ["b"]})) is False
    assert recipe.eval_is_held_out(train, None) is None
    summary = recipe.summarize([{"step": 1, "epoch": 1.0, "reward": 0.5, "rewards/correctness_reward/mean": 0.5}], 1.0,
                               "engine")
    summary.update(eval_correct=[(0, 0.25)], eval_held_out=False)
    recipe.print_summary(summary)
    out = capsys.readouterr().out
    assert "held-out" not in out.replace("not held out", "") and "eval correct, training rows" in out


def test_the_summary_reports_each_epoch_and_why_dcut_decoded_plainly():
    recipe = load_recipe()

    def logged(epoch, tokens_per_s, seconds, mat, drafted, break_even, expected):
        return {"epoch": epoch, "reward": 0.5, "rewards/correctness_reward/mean": 0.5, "rollout/seconds": seconds,
                "rollout/tokens_per_s": tokens_per_s, "rollout/mean_accepted_tokens": mat,
                "rollout/drafted_share": drafted, "rollout/break_even_mat": break_even, "rollout/expected_mat": expected}

    history = [logged(0.5, 100, 1.0, 1.0, 0.0, 2.5, 1.2), logged(1.0, 300, 1.0, 1.0, 0.0, 2.5, 1.4),  # epoch 0
               logged(1.5, 400, 2.0, 3.0, 1.0, 2.0, 3.2), logged(2.0, 200, 1.0, 2.0, 0.5, 2.0, 2.8),  # epoch 1
               {"train_runtime": 9.0, "epoch": 2.0, "step": 4}]
    summary = recipe.summarize(history, 10.0, "engine")
    first, revisits = summary["first_visit"], summary["revisits"]
    assert [e["epoch"] for e in summary["epochs"]] == [0, 1] and revisits["epochs"] == 1
    assert first["tokens_per_s"] == pytest.approx(200.0)  # (100 + 300) tokens in 2 s
    assert revisits["tokens_per_s"] == pytest.approx(1000 / 3) and revisits["mat"] == pytest.approx(2.5)
    assert recipe.verdict(first) == ("decoded plainly in 100% of the steps: a drafting step had to emit 2.50 tokens "
                                     "per row to match plain decoding's rate, and was expected to emit 1.30")
    assert recipe.verdict(revisits).startswith("drafted in 75% of the steps")
    # the means say drafting pays, yet D-cut decoded plainly: the verdict says which steps decided
    held = {"drafted_share": 0.01, "break_even_mat": 2.86, "expected_mat": 3.66, "weighed_share": 0.02,
            "draft_won_share": 0.5}
    text = recipe.verdict(held)
    assert text.startswith("decoded plainly in 99% of the steps") and "2% of the steps that weighed a draft" in text
    assert "pay in 50% of those" in text and "found no draft, or D-cut waited for its next probe" in text
    assert recipe.verdict({"drafted_share": None, "break_even_mat": None}) is None  # a fixed budget: nothing weighed


def test_correctness_and_format_rewards():
    recipe = load_recipe()
    completions = ["3 + 4 = 7\n#### 7", "#### 8", "the answer is 7", [{"role": "assistant", "content": "x\n#### -2"}]]
    assert recipe.correctness_reward(completions, answer=["7", "7", "7", "-2"]) == [1.0, 0.0, 0.0, 1.0]
    assert recipe.format_reward(completions) == [1.0, 1.0, 0.0, 1.0]


def test_demo_trains_on_a_small_revisited_prompt_set_only_by_default(tmp_path):
    recipe = load_recipe()
    demo = recipe.ScriptArguments()  # the embedded prompts: the demo's 16
    assert recipe.train_prompt_limit(demo) == recipe.DEMO_TRAIN_PROMPTS == 16
    assert len(recipe.load_prompts(demo, demo.dataset_split, recipe.train_prompt_limit(demo))) == 16
    assert recipe.train_prompt_limit(recipe.ScriptArguments(num_train_prompts=0)) is None  # 0: every prompt
    assert recipe.train_prompt_limit(recipe.ScriptArguments(num_train_prompts=5)) == 5
    other = recipe.ScriptArguments(dataset_path=str(tmp_path / "mine.jsonl"))
    assert recipe.train_prompt_limit(other) is None  # a user's dataset is never cut silently
