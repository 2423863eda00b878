"""Real two-rank DeepSpeed ZeRO-2 and ZeRO-3 GRPO runs of the recipe on the CPU (gloo).

One `accelerate launch` per stage (the two run at once), with the shipped
`recipes/accelerate/deepspeed_zero{2,3}_cpu.yaml` as they are, runs tests/deepspeed_run.py: the
recipe's own `main` for 2 steps on the embedded tiny model, then the checks on every rank (each
writes what it saw; the tests read it).
"""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_extra  # noqa: E402

require_extra("deepspeed", "deepspeed")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "deepspeed_run.py"
STEPS = 2
RECIPE_ARGS = [  # 2 ranks x 4 rows = 2 prompts x 4 generations per step; a checkpoint at the last step
    "--max_steps", str(STEPS), "--per_device_train_batch_size", "4", "--num_generations", "4",
    "--max_completion_length", "64",  # the tiny model's answers end within ~50 tokens: rewards differ
    "--budget_policy", "fixed",  # D-cut would first profile the machine (~8 s)
    "--num_eval_prompts", "0", "--save_strategy", "steps", "--save_steps", str(STEPS), "--disable_tqdm", "true",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(stage: int, out: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch",
           "--config_file", str(ROOT / "recipes" / "accelerate" / f"deepspeed_zero{stage}_cpu.yaml"),
           "--main_process_port", str(free_port()),
           str(SCRIPT), str(out), "--output_dir", str(out / "run"), *RECIPE_ARGS]
    with open(out / "launch.log", "w") as log:  # a file, not a pipe: a full pipe would stall the launch
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Both stages' launches, started together so that their imports and waits overlap."""
    outs = {stage: tmp_path_factory.mktemp(f"zero{stage}") for stage in (2, 3)}
    procs = {stage: launch(stage, out) for stage, out in outs.items()}
    yield {stage: (procs[stage], outs[stage]) for stage in procs}
    for proc in procs.values():
        if proc.poll() is None:  # e.g. the other stage failed first: end this launch and its ranks
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def run(request, launches):
    """(ZeRO stage, [rank 0's record, rank 1's record]) of that stage's launch."""
    proc, out = launches[request.param]
    proc.wait(timeout=300)
    assert proc.returncode == 0, (out / "launch.log").read_text()[-8000:]
    return request.param, [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_two_gloo_ranks_train_a_deepspeed_engine_at_the_stage(run):
    stage, ranks = run
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 and r["backend"] == "gloo" for r in ranks)
    assert all(r["engine"] == "DeepSpeedEngine" and r["zero_stage"] == stage for r in ranks)
    steps = [[h for h in r["log_history"] if "loss" in h] for r in ranks]
    assert [len(s) for s in steps] == [STEPS, STEPS]
    assert any(h["grad_norm"] > 0 for h in steps[0])  # the policy did move: the later checks see trained weights


def test_weights_are_whole_for_every_rollout_and_sharded_outside_under_zero3(run):
    stage, ranks = run
    for r in ranks:
        assert len(r["whole_at_rollouts"]) >= STEPS and all(r["whole_at_rollouts"])
        assert r["sharded_outside"] == r["partitioned"]  # between rollouts, every partitioned weight is an empty shard
        if stage == 3:  # parameters under stage3_param_persistence_threshold (1e5 elements) stay whole: the
            # tiny model's embedding (749 x 192) is partitioned, its smaller matrices are not
            assert "model.embed_tokens.weight" in r["partitioned"]
        else:
            assert r["partitioned"] == []


def test_engine_greedy_equals_plain_greedy_on_the_same_weights(run):
    _, ranks = run
    assert all(r["greedy_matches"] == [True, True] for r in ranks)


def test_importance_sampling_ratio_is_one(run):
    """TRL's ρ_t = exp(log π_train − log π_sample): the engine samples from the trained weights exactly."""
    _, ranks = run
    steps = [h for h in ranks[0]["log_history"] if "loss" in h]
    for h in steps:
        assert 0.999 < h["sampling/importance_sampling_ratio/min"] <= h["sampling/importance_sampling_ratio/max"] < 1.001
        assert h["sampling/sampling_logp_difference/max"] < 1e-3


def test_checkpoint_reloads_over_spoiled_weights(run):
    _, ranks = run
    assert all(r["reload"] for r in ranks)


def test_the_checkpoint_is_marked_complete_after_every_ranks_files(run, launches):
    from trainers.resume import MANIFEST_FILE, checkpoint_problem

    stage, _ = run
    checkpoint = launches[stage][1] / "run" / f"checkpoint-{STEPS}"
    files = json.loads((checkpoint / MANIFEST_FILE).read_text())["files"]
    assert checkpoint_problem(checkpoint) is None
    assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json", "graft_rollout_state.json"} <= files.keys()
    assert any(name.startswith("global_step") for name in files)  # DeepSpeed's shards, every rank's
