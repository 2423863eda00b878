"""Runs repeat: the same seed gives the same training logs (D-cut on), and a run resumed from a
checkpoint gives the uninterrupted run's logs from there on (rollout counter and prior restored)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest
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
    trainer = GraftGRPOTrainer(tiny_policy(len(tok)), length_reward, args=grpo_args(out, max_steps=3, **args),
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


def test_two_runs_with_one_seed_log_the_same_with_dcut(tmp_path):
    graft = GraftConfig(method="retrieval", budget=8, budget_policy="dcut")
    a, b = run(tmp_path / "a", graft), run(tmp_path / "b", graft)
    assert steps(a, TIMING + SPEED) == steps(b, TIMING + SPEED) and len(steps(a)) == 3
