"""rollout_graft_tools.attention (lab/gqa_fold.py's study): grouped-query attention folded into the query axis computes the attention
transformers' SDPA path computes, under the engine's masks (ragged slots, a tree block)."""

import torch
from conftest import load_script
from transformers import AutoModelForCausalLM

from rollout_graft.assets import TINY_TARGET
from rollout_graft.runner import ModelRunner
from rollout_graft_tools.attention import FOLDED


def test_folded_attention_gives_the_sdpa_paths_logits():
    fold = load_script("lab/gqa_fold.py")
    model = AutoModelForCausalLM.from_pretrained(TINY_TARGET, dtype=torch.float32).eval()
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # the tiny target groups its heads
    runner = ModelRunner(model)
    logits = {}
    for attention in ("sdpa", FOLDED):
        logits[attention] = [fold.timed(model, runner, attention, rows, 40, tokens, repeats=1)[1]
                             for rows, tokens in ((3, 1), (3, 5))]
    for a, b in zip(logits["sdpa"], logits[FOLDED]):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4)


def test_the_gpu_probe_script_runs(tmp_path):
    """lab/gpu_verify_paths.py, prepared for a GPU session, smoke-run on this CPU: every cell timed
    (whole and host-side), the profiler's tables written."""
    import json

    load_script("lab/gpu_verify_paths.py").main(["--out", str(tmp_path), "--device", "cpu", "--repeats", "1",
                                                "--rows", "2", "--tokens", "1", "3", "--profile", "2:131:0.3:3",
                                                "--layers", "2"])
    results = json.loads((tmp_path / "gpu_verify_paths.json").read_text())["results"]
    assert len(results) == 8 and all(r["ms"] >= r["host_ms"] > 0 for r in results)
    assert "self_cpu_time_total" in (tmp_path / "gpu_verify_paths.txt").read_text()
