"""A real two-process GRPO run (torchrun, CPU, gloo) where a prompt group is split across ranks.

`accelerate launch --cpu --num_processes 2` silently runs one process on CPU, hence torchrun.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "trl_multiprocess_run.py"


def torchrun(script: Path, *args: str) -> None:
    """`script` in two torchrun ranks on this CPU (gloo)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("mp")
    torchrun(SCRIPT, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_two_gloo_ranks_ran(ranks):
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 and r["backend"] == "gloo" for r in ranks)


def test_a_group_was_split_across_ranks(ranks):
    """3 groups x num_generations=2 over 2 ranks x 3 rows: rank 0 = [a, a, b], rank 1 = [b, c, c]."""
    for step, (p0, p1) in enumerate(zip(ranks[0]["prompts"], ranks[1]["prompts"])):
        assert p0[0] == p0[1] != p0[2] == p1[0] != p1[1] == p1[2], (step, p0, p1)


def test_each_rank_generates_its_rows(ranks):
    for r in ranks:
        assert all(len(lengths) == 3 and min(lengths) >= 1 for lengths in r["completion_lengths"])


def test_split_group_greedy_equals_plain_greedy(ranks):
    assert all(r["greedy_matches"] for r in ranks)


def test_metrics_are_reduced_over_ranks(ranks):
    steps = [h for h in ranks[0]["log_history"] if "loss" in h]
    assert len(steps) == 2
    for h in steps:
        assert h["rollout/tokens_per_s"] > 0 and h["rollout/mean_accepted_tokens"] >= 1.0
        assert h["sampling/sampling_logp_difference/max"] < 1e-4


def test_two_ranks_resumed_inside_a_generation_batch_repeat_the_uninterrupted_run(tmp_path):
    """Each rank keeps its own slices of the generation batch in the checkpoint and trains on them
    after the resume: step 4 (the batch's second slice) as in the uninterrupted run, on both ranks."""
    script = Path(__file__).parent / "trl_multiprocess_resume_run.py"
    torchrun(script, str(tmp_path / "full"))
    checkpoint = tmp_path / "full" / "checkpoint-3"
    assert {p.name for p in checkpoint.glob("graft_generation_batch_*.pt")} == {
        "graft_generation_batch_0.pt", "graft_generation_batch_1.pt"}
    torchrun(script, str(tmp_path / "resumed"), str(checkpoint))
    for rank in (0, 1):
        full, resumed = (json.loads((tmp_path / run / f"rank{rank}.json").read_text()) for run in ("full", "resumed"))
        assert resumed["rollouts"] == full["rollouts"] == 2  # the batch was not sampled again
        assert resumed["log"] == full["log"] and [h["step"] for h in full["log"]] == [1, 2, 3, 4]
