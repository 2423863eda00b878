"""Bad input → ValueError naming the fix; the engine stays usable afterwards."""

import pytest
import torch

from rollout_graft import EngineConfig, RolloutEngine, SamplingParams


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.0}, "min_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_invalid_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_new_tokens": True}, TypeError, "max_new_tokens must be an int"),
        ({"max_new_tokens": 8.0}, TypeError, "max_new_tokens must be an int"),
        ({"stop_token_ids": 5}, TypeError, r"list of token ids, e.g. \[5\]"),
        ({"stop_token_ids": [3.7]}, TypeError, "stop_token_ids must be an int"),
        ({"stop_token_ids": [True]}, TypeError, "stop_token_ids must be an int"),
        ({"stop_token_ids": "2"}, TypeError, "list of token ids"),
        ({"stop_token_ids": [-1]}, ValueError, "negative token id"),
        ({"top_p": "0.9"}, TypeError, "top_p must be a number"),
        ({"top_k": 2.5}, TypeError, "top_k must be an int"),
        ({"temperature": float("inf")}, ValueError, "finite"),
        ({"temperature": True}, TypeError, "temperature must be a number"),
        ({"seed": 2**70}, ValueError, r"\[0, 2\*\*64\)"),
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"ignore_eos": "yes"}, TypeError, "ignore_eos"),
        ({"temperature": 10**400}, ValueError, "temperature must be a number .*401 digits, beyond float's range"),  # was OverflowError
    ],
)
def test_sampling_params_wrong_types_name_the_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_accept_numpy_numbers():
    import numpy as np

    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(4), stop_token_ids=(np.int64(2),), seed=2**64 - 1)
    assert (p.temperature, p.top_k, p.stop_token_ids, p.seed) == (0.5, 4, [2], 2**64 - 1)
    assert type(p.top_k) is int and type(p.stop_token_ids[0]) is int


def test_generate_refuses_strings_floats_bools_and_bad_params(qwen3_model):
    engine = RolloutEngine(qwen3_model)
    params = SamplingParams(temperature=0, max_new_tokens=4)
    with pytest.raises(TypeError, match="string"):  # was read as ids [1, 2, 3, 4, 5]
        engine.generate(["12345"], params)
    with pytest.raises(TypeError, match="float"):
        engine.generate([[3, 3.7]], params)
    with pytest.raises(TypeError, match="bool"):
        engine.generate([[3, True]], params)
    with pytest.raises(TypeError, match=r"\.long\(\)|torch.long"):
        engine.generate(torch.tensor([[3.0, 4.0]]), params)
    with pytest.raises(TypeError, match=r"single prompt pass \[\["):
        engine.generate([3, 4, 5], params)
    with pytest.raises(ValueError, match="stop_token_ids .* outside the model's vocabulary"):
        engine.generate([[3, 4]], SamplingParams(max_new_tokens=4, stop_token_ids=[64]))
    with pytest.raises(TypeError, match=r"SamplingParams\(\*\*params\)"):
        engine.generate([[3, 4]], params={})
    with pytest.raises(TypeError, match="SamplingParams"):
        engine.generate([[3, 4]], params=0.7)
    import numpy as np

    out = engine.generate([np.array([3, 4]), (3, 4)], params)  # numpy ids and tuples are fine
    assert out.completion_ids[0] == out.completion_ids[1]


def test_concurrent_generate_calls_are_serialised(qwen3_model):
    """Two threads on one engine: both calls succeed and return what each returns alone."""
    import threading

    from rollout_graft import RetrievalConfig

    engine = RolloutEngine(qwen3_model, EngineConfig(method="retrieval", budget=8, retrieval=RetrievalConfig(update_prior=False)))
    jobs = {"a": ([[5, 6, 7]] * 4, SamplingParams(max_new_tokens=12, seed=1)),
            "b": ([[8, 9]] * 3, SamplingParams(max_new_tokens=10, seed=2))}
    alone = {k: RolloutEngine(qwen3_model).generate(*job).completion_ids for k, job in jobs.items()}
    results, errors = {}, []

    def run(name):
        try:
            for _ in range(3):
                results.setdefault(name, []).append(engine.generate(*jobs[name]).completion_ids)
        except Exception as exc:  # noqa: BLE001 -- the test reports any failure of a thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(r == alone[k] for k in jobs for r in results[k])  # seed-exact: ar's rows, whatever ran in between


def test_unseeded_calls_differ_and_report_their_seed(qwen3_model):
    engine = RolloutEngine(qwen3_model)
    params = SamplingParams(max_new_tokens=12)
    a, b = engine.generate([[5, 6, 7]] * 4, params), engine.generate([[5, 6, 7]] * 4, params)
    assert a.seed != b.seed and a.completion_ids != b.completion_ids
    from dataclasses import replace

    again = engine.generate([[5, 6, 7]] * 4, replace(params, seed=a.seed))
    assert again.completion_ids == a.completion_ids and again.seed == a.seed


def test_invalid_engine_config():
    with pytest.raises(ValueError, match="unknown method"):
        EngineConfig(method="medusa")
    with pytest.raises(ValueError, match="budget"):
        EngineConfig(budget=-1)
    with pytest.raises(ValueError, match=r"budget must be in \[0, 1024\].*got 100000"):  # not the allocator's raw error
        EngineConfig(method="graft", budget=100000)
    assert EngineConfig(budget=1024).budget == 1024


def test_bad_prompts_raise_and_engine_recovers(qwen3_model):
    engine = RolloutEngine(qwen3_model)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[1, 2], []], params)
    with pytest.raises(ValueError, match="non-empty list"):
        engine.generate([], params)
    with pytest.raises(ValueError, match="context"):
        engine.generate([[3] * 250], SamplingParams(max_new_tokens=10))
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([[3, 64]], params)
    with pytest.raises(TypeError, match="input_ids"):  # a tokenizer's BatchEncoding instead of its ids
        engine.generate([{"input_ids": [3, 4], "attention_mask": [1, 1]}], params)
    out = engine.generate([[3, 4]], params)  # nothing was left half-done
    assert len(out.completion_ids[0]) >= 1


def test_tokenizer_vocabulary_mismatch(qwen3_model):
    from transformers import AutoTokenizer

    from rollout_graft.assets import TINY_TARGET

    tiny_tokenizer = AutoTokenizer.from_pretrained(TINY_TARGET)  # 749 tokens; the model has 64
    with pytest.raises(ValueError, match="tokenizer"):
        RolloutEngine(qwen3_model, tokenizer=tiny_tokenizer)


def test_engine_config_in_the_tokenizers_place_is_refused(qwen3_model):
    """RolloutEngine(model, tokenizer) — the tokenizer where the config goes — names the fix, not a
    tokenizer's missing attribute."""
    from transformers import AutoTokenizer

    from rollout_graft.assets import TINY_TARGET

    with pytest.raises(TypeError, match="tokenizer=") as err:
        RolloutEngine(qwen3_model, AutoTokenizer.from_pretrained(TINY_TARGET))
    assert "EngineConfig" in str(err.value)


def test_nan_logits_raise(qwen3_model):
    with torch.no_grad():
        qwen3_model.lm_head.weight[5].fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        RolloutEngine(qwen3_model).generate([[3, 4]], SamplingParams(max_new_tokens=4))


def test_prompt_of_one_token_and_tensor_input(qwen3_model):
    engine = RolloutEngine(qwen3_model)
    out = engine.generate(torch.tensor([[7], [7]]), SamplingParams(temperature=0, max_new_tokens=5))
    ref = qwen3_model.generate(torch.tensor([[7]]), do_sample=False, max_new_tokens=5, eos_token_id=1, pad_token_id=0)
    assert out.completion_ids == [ref[0, 1:].tolist()] * 2


def test_an_empty_prompt_deep_in_the_dataset_is_named_up_front(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig

    from trainers import GraftGRPOTrainer

    prompts = ["Q:1+2=\nA:"] * 9 + ["   "] + ["Q:3*4=\nA:"] * 6
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match="train_dataset row 9 has an empty prompt"):
        GraftGRPOTrainer("unused-model-path", reward_funcs=[], args=args, train_dataset=Dataset.from_dict({"prompt": prompts}))
    chats = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": ""}]]
    with pytest.raises(ValueError, match="eval_dataset row 1"):
        GraftGRPOTrainer("unused-model-path", reward_funcs=[], args=args, eval_dataset=Dataset.from_dict({"prompt": chats}))


def test_images_in_the_dataset_are_refused_when_the_trainer_is_built(tmp_path):
    """The rollout generates text only: an image column or an image part of a chat prompt is named
    up front, not at the first rollout (where TRL would first have loaded the model)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from trainers import GraftGRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with_column = Dataset.from_dict({"prompt": ["Q:1+2=\nA:"] * 2, "image": [None, None]})
    with pytest.raises(ValueError, match="train_dataset has an 'image' column.*remove_columns"):
        GraftGRPOTrainer("unused-model-path", reward_funcs=[], args=args, train_dataset=with_column)
    from trainers.grpo import _check_dataset_prompts  # an `images` column of empty lists: text only, as TRL reads it

    _check_dataset_prompts(Dataset.from_dict({"prompt": ["Q:1+2=\nA:"] * 2, "images": [[], []]}), "train_dataset")
    with pytest.raises(ValueError, match="train_dataset has an 'images' column"):
        _check_dataset_prompts(Dataset.from_dict({"prompt": ["a", "b"], "images": [[], [b"png"]]}), "train_dataset")
    parts = [[{"role": "user", "content": [{"type": "text", "text": "what is this?"}]}],
             [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and this?"}]}]]
    with pytest.raises(ValueError, match="eval_dataset row 1 has an image in its prompt"):
        GraftGRPOTrainer("unused-model-path", reward_funcs=[], args=args, eval_dataset=Dataset.from_list(
            [{"prompt": p} for p in parts]))


def test_a_dataset_or_config_of_the_wrong_shape_is_named_when_the_trainer_is_built(tmp_path):
    """What TRL would fail on only at its first batch (after loading the model), or deep inside with
    an AttributeError, is refused up front naming the fix."""
    from datasets import Dataset
    from trl import GRPOConfig

    from trainers import GraftConfig, GraftGRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True)

    def build(**kw):
        return GraftGRPOTrainer("unused-model-path", reward_funcs=[], **{"args": args, **kw})

    with pytest.raises(ValueError, match=r"train_dataset has no 'prompt' column \(it has \['question'\]\).*rename_column"):
        build(train_dataset=Dataset.from_dict({"question": ["Q:1+2=\nA:"]}))
    from trainers.grpo import _check_dataset_prompts  # with TRL's environment_factory, its reset() gives the prompts

    _check_dataset_prompts(Dataset.from_dict({"environment": ["counter"]}), "train_dataset", prompt_optional=True)
    with pytest.raises(ValueError, match="train_dataset row 0: a prompt is text or a list of chat messages.*not int"):
        build(train_dataset=Dataset.from_dict({"prompt": [12, 13]}))
    with pytest.raises(ValueError, match="eval_dataset row 0: a prompt is text or a list of chat messages.*not list"):
        build(eval_dataset=Dataset.from_dict({"prompt": [["Q:1+2=", "A:"]]}))
    with pytest.raises(TypeError, match="graft_config is a dict: pass a GraftConfig"):
        build(graft_config={"method": "ar"})
    with pytest.raises(TypeError, match="args is a dict: pass a GRPOConfig"):
        GraftGRPOTrainer("unused-model-path", reward_funcs=[], args={"output_dir": str(tmp_path)}, graft_config=GraftConfig())


def test_a_temperature_too_small_to_divide_float32_logits_is_refused():
    from rollout_graft.config import MIN_TEMPERATURE

    for tiny in (1e-39, 1e-30, MIN_TEMPERATURE / 2):
        with pytest.raises(ValueError, match=f"below {MIN_TEMPERATURE}.*use 0 for greedy"):
            SamplingParams(temperature=tiny)
    assert SamplingParams(temperature=MIN_TEMPERATURE).temperature == MIN_TEMPERATURE


def test_the_smallest_temperature_samples_and_leaves_the_retrieval_engine_whole(qwen3_model):
    from rollout_graft.config import MIN_TEMPERATURE

    engine = RolloutEngine(qwen3_model, EngineConfig(method="retrieval"))
    plain = RolloutEngine(qwen3_model, EngineConfig(method="ar"))
    prompts = [[3, 4, 5]] * 4
    cold = SamplingParams(temperature=MIN_TEMPERATURE, max_new_tokens=12, seed=1)
    assert engine.generate(prompts, cold).completion_ids == plain.generate(prompts, cold).completion_ids
    assert engine.generate(prompts, cold).completion_ids == plain.generate(prompts, SamplingParams(
        temperature=0, max_new_tokens=12)).completion_ids  # T = 1e-5 on these logits: the argmax
    params = SamplingParams(max_new_tokens=12, seed=2)
    params.temperature = 1e-39  # set after validation: generate checks it again
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(prompts, params)
    warm = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    assert engine.generate(prompts, warm).completion_ids == plain.generate(prompts, warm).completion_ids


def test_a_retrieval_top_k_above_the_vocabulary_is_refused_before_allocating(qwen3_model):
    from rollout_graft.config import RetrievalConfig

    vocab = qwen3_model.config.vocab_size
    for top_k in (vocab + 1, 10**7):
        with pytest.raises(ValueError, match=f"top_k={top_k} exceeds the model's vocabulary of {vocab} tokens"):
            RolloutEngine(qwen3_model, EngineConfig(method="retrieval", retrieval=RetrievalConfig(top_k=top_k)))


def test_a_drafter_top_k_above_the_vocabulary_is_refused_when_the_engine_is_built(qwen3_model):
    """It failed in the first drafting step with torch's "selected index k out of range"."""
    from conftest import random_model

    from rollout_graft import DraftConfig

    vocab = qwen3_model.config.vocab_size
    with pytest.raises(ValueError, match=f"DraftConfig.top_k={vocab + 1} exceeds the drafter's vocabulary of {vocab}"):
        RolloutEngine(qwen3_model, EngineConfig(method="graft", draft=DraftConfig(top_k=vocab + 1)),
                      draft_model=random_model(seed=1))
    engine = RolloutEngine(qwen3_model, EngineConfig(method="graft", draft=DraftConfig(top_k=vocab)),
                           draft_model=random_model(seed=1))
    assert engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_new_tokens=4)).completion_ids[0]


def test_numpy_arrays_and_tokenizer_outputs_are_prompts(qwen3_model):
    import numpy as np
    from transformers import BatchEncoding

    engine = RolloutEngine(qwen3_model)
    params = SamplingParams(temperature=0, max_new_tokens=6)
    want = engine.generate([[3, 4, 5], [3, 4, 5]], params).completion_ids
    for prompts in (np.array([[3, 4, 5]] * 2), np.array([[3, 4, 5]] * 2, dtype=np.int32), torch.tensor([[3, 4, 5]] * 2),
                    BatchEncoding({"input_ids": torch.tensor([[3, 4, 5]] * 2)}),
                    BatchEncoding({"input_ids": [[0, 3, 4, 5], [3, 4, 5, 0]], "attention_mask": [[0, 1, 1, 1], [1, 1, 1, 0]]}),
                    {"input_ids": np.array([[3, 4, 5]] * 2)}):
        assert engine.generate(prompts, params).completion_ids == want, type(prompts)
    for bad, match in ((np.array([[3.0, 4.0]]), "token ids are integers"), (np.array([3, 4]), "1-D"),
                       (torch.tensor([3, 4]), "1-D"), (BatchEncoding({"attention_mask": [[1]]}), "without 'input_ids'")):
        with pytest.raises(TypeError, match=match):
            engine.generate(bad, params)
    assert engine.generate([[3, 4, 5]] * 2, params).completion_ids == want


def test_a_top_p_below_float32s_smallest_keeps_the_top_token(qwen3_model):
    """top_p = 1e-46 rounds to 0 against float32 probabilities: every token was dropped and every
    method emitted the last vocabulary id; the top token is always kept (HF's and vLLM's rule)."""
    prompts = [[3, 4, 5]] * 2
    greedy = RolloutEngine(qwen3_model).generate(prompts, SamplingParams(temperature=0, max_new_tokens=8)).completion_ids
    for method in ("ar", "retrieval"):
        engine = RolloutEngine(qwen3_model, EngineConfig(method=method))
        for top_p in (1e-46, 1e-300):
            out = engine.generate(prompts, SamplingParams(top_p=top_p, max_new_tokens=8, seed=1))
            assert out.completion_ids == greedy, (method, top_p)


def test_a_repetition_penalty_too_small_to_divide_float32_logits_is_refused(qwen3_model):
    """A penalty of 1e-40 overflowed the seen tokens' logits to inf and sampling emitted the last
    vocabulary id; it is refused like a temperature too small, naming the smallest accepted."""
    from rollout_graft.config import MIN_REPETITION_PENALTY

    for tiny in (1e-300, 1e-40, MIN_REPETITION_PENALTY / 2):
        with pytest.raises(ValueError, match=f"repetition_penalty={tiny!r} is below {MIN_REPETITION_PENALTY}"):
            SamplingParams(repetition_penalty=tiny)
    params = SamplingParams(max_new_tokens=6, seed=1, repetition_penalty=MIN_REPETITION_PENALTY)
    out = RolloutEngine(qwen3_model).generate([[3, 4, 5]], params)
    assert len(out.completion_ids[0]) == 6  # the smallest accepted samples


@pytest.mark.parametrize("kwargs, error, match", [
    ({"depth": "3"}, TypeError, "TemplateConfig.depth must be an int"),  # was: '<' not supported between str and int
    ({"depth": 2.5}, TypeError, "TemplateConfig.depth must be an int"),  # was accepted
    ({"width": None}, TypeError, "TemplateConfig.width must be an int"),
    ({"rank_acceptance": 0.5}, TypeError, "rank_acceptance must be a tuple of probabilities"),  # was: float has no len()
    ({"rank_acceptance": ("a",) * 8}, TypeError, "rank_acceptance value must be a number"),
    ({"rank_acceptance": (-0.5,) * 8}, ValueError, r"probabilities in \[0, 1\]"),
    ({"rank_acceptance": (float("nan"),) * 8}, ValueError, r"probabilities in \[0, 1\]"),
    ({"width": 9}, ValueError, "up to width=9, got 8"),
])
def test_retrieval_template_settings_name_the_fix(kwargs, error, match):
    from rollout_graft.templates import TemplateConfig

    with pytest.raises(error, match=match):
        TemplateConfig(**kwargs)


def test_a_template_with_list_rank_acceptance_generates(qwen3_model):
    """A list of rank acceptances is kept as a tuple: templates are cached by their config, and a list
    made the first retrieval step fail with `unhashable type: 'list'`."""
    from rollout_graft import RetrievalConfig
    from rollout_graft.templates import DEFAULT_RANK_ACCEPTANCE, TemplateConfig

    template = TemplateConfig(rank_acceptance=list(DEFAULT_RANK_ACCEPTANCE))
    assert template == TemplateConfig()
    engine = RolloutEngine(qwen3_model, EngineConfig(method="retrieval", retrieval=RetrievalConfig(template=template)))
    params = SamplingParams(temperature=0, max_new_tokens=6)
    assert engine.generate([[3, 4, 5]] * 2, params).completion_ids == RolloutEngine(qwen3_model).generate(
        [[3, 4, 5]] * 2, params).completion_ids


@pytest.mark.parametrize("kwargs, error, match", [
    ({"checkpoints": ("a",), "thresholds": (0.3,), "split": ((0, 8),)}, TypeError,
     "every DraftConfig.checkpoints level must be an int"),  # was: invalid literal for int() with base 10
    ({"checkpoints": (0.5,), "thresholds": (0.3,), "split": ((0, 8),)}, TypeError,
     "every DraftConfig.checkpoints level must be an int"),  # was truncated to level 0
    ({"checkpoints": (False, True, 5)}, TypeError, "every DraftConfig.checkpoints level must be an int"),
    ({"thresholds": ("x", 0.1, 0.05)}, TypeError, "every DraftConfig.thresholds value must be a number"),
    ({"split": (0, 8)}, TypeError, r"\(checkpoint level, draft nodes kept\) pairs"),  # was: cannot unpack int
    ({"split": ((0, 8, 1), (1, 24), (5, 40))}, TypeError, r"\(checkpoint level, draft nodes kept\) pairs"),
    ({"split": ((0, "x"), (1, 24), (5, 40))}, TypeError, "every DraftConfig.split node count must be an int"),
    ({"split": ((0, 8.7), (1, 24), (5, 40))}, TypeError, "every DraftConfig.split node count must be an int"),
])
def test_draft_config_sequences_name_the_bad_element(kwargs, error, match):
    from rollout_graft import DraftConfig

    with pytest.raises(error, match=match):
        DraftConfig(**kwargs)


def test_draft_config_sequences_accept_lists_and_numpy_numbers():
    import numpy as np

    from rollout_graft import DraftConfig

    cfg = DraftConfig(checkpoints=[np.int64(0), 1, 5], thresholds=[np.float32(0.5), 0.25, 0.125], split=[[0, 8], (1, 24), (5, 40)])
    assert (cfg.checkpoints, cfg.thresholds, cfg.split) == ((0, 1, 5), (0.5, 0.25, 0.125), ((0, 8), (1, 24), (5, 40)))
    assert type(cfg.checkpoints[0]) is int and type(cfg.thresholds[0]) is float


def test_dcut_calibration_prior_must_be_finite():
    """inf or NaN passed `> 0` checks (NaN) or looked like "trust the raw scores forever" (inf), and
    made every calibrated acceptance rate NaN (inf / inf) for D-cut's decisions."""
    import numpy as np

    from rollout_graft import DCutConfig
    from rollout_graft.dcut.core import ScoreCalibration

    assert np.isnan(ScoreCalibration(prior_weight=float("inf")).rates()).all()  # what an infinite prior gave
    for bad in (float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(ValueError, match="calibration_prior must be a finite number > 0"):
            DCutConfig(calibration_prior=bad)
    assert DCutConfig(calibration_prior=1e6).calibration_prior == 1e6


def test_a_model_or_directory_of_the_wrong_kind_is_named(qwen3_model, tmp_path):
    """RolloutEngine(path) and from_pretrained(None) / draft_model=123 failed with AttributeError /
    pathlib TypeErrors from deep inside; they name the argument and what to pass."""
    from rollout_graft import DraftConfig

    with pytest.raises(TypeError, match=r"got str: for a model directory use RolloutEngine\.from_pretrained\("):
        RolloutEngine(str(tmp_path))
    with pytest.raises(TypeError, match="model must be a loaded causal LM.*got NoneType"):
        RolloutEngine(None)
    with pytest.raises(TypeError, match="the target model's directory must be a local path.*NoneType"):
        RolloutEngine.from_pretrained(None)
    with pytest.raises(TypeError, match="the draft model's directory must be a local path.*int 123"):
        RolloutEngine(qwen3_model, EngineConfig(method="graft", draft=DraftConfig()), draft_model=123)


@pytest.mark.parametrize("settings, match", [
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -1}, "top_k must be an int >= 0"),
    ({"min_p": 1.5}, r"min_p must be in \[0, 1\)"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0"),
    ({"max_completion_length": 0}, "max_completion_length=0: a completion needs at least one token"),
])
def test_grpo_sampling_settings_are_named_when_the_trainer_is_built(tmp_path, settings, match):
    """A bad GRPOConfig sampling setting failed only at the first rollout, after the model had loaded
    (max_completion_length=0 in transformers' GenerationConfig, as `max_new_tokens`)."""
    from trl import GRPOConfig

    from trainers import GraftGRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **settings)
    with pytest.raises(ValueError, match=match):
        GraftGRPOTrainer("unused-model-path", reward_funcs=[], args=args)


def test_vllm_num_speculative_tokens_takes_numpy_ints_and_names_other_types():
    """np.int64(8) was refused as "must be an int >= 1, got np.int64(8)"; a float or a string raised
    the same ValueError as 0. Now numpy ints pass as Python ints (the config is JSON for `vllm serve`)
    and other types raise a TypeError naming theirs."""
    import json

    import numpy as np

    from rollout_graft.vllm import speculative_config, vllm_speculative_config

    for build in (speculative_config, lambda k: vllm_speculative_config("ngram", k)):
        config = build(np.int64(8))
        assert type(config["num_speculative_tokens"]) is int and json.loads(json.dumps(config)) == config
        for bad in (8.0, "8", None, True):
            with pytest.raises(TypeError, match=f"num_speculative_tokens must be an int >= 1 .e.g. 8., got {type(bad).__name__}"):
                build(bad)
        assert build(1024)["num_speculative_tokens"] == 1024
        for bad in (0, 1025, 10**6):  # vLLM bounds none above: [rows, k] arrays would fail at allocation
            with pytest.raises(ValueError, match=rf"num_speculative_tokens must be an int in \[1, 1024\].*got {bad}"):
                build(bad)
