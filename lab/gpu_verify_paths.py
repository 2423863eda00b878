#!/usr/bin/env python
"""Why a rollout's tree verify forward can cost more on a GPU than the profile's (`cost.time_forward`):
the engine's verify forward (`ModelRunner.verify`) under the profile's mask (every cached slot valid,
a causal block) and under a rollout's (some slots of rejected nodes masked, a context of any length),
each timed whole (synchronised) and host-side alone (until `verify` returns), with the profiler's
top operators for a few of them. A random-weight target of SmolLM2-135M's shape (Llama, 30 layers).

    python lab/gpu_verify_paths.py --out $OUT        # on the GPU machine: gpu_verify_paths.json + .txt
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from rollout_graft.runner import ModelRunner
from rollout_graft_tools.verify_timing import cache_with_holes, time_verify

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
               max_position_embeddings=8192, rope_theta=1e5, rms_norm_eps=1e-5)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--layers", type=int, default=SMOLLM2["num_hidden_layers"], help="fewer: a quicker smoke run")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 16, 61], help="tree tokens per row")
    ap.add_argument("--profile", nargs="*", default=["8:128:0:1", "8:128:0:16", "8:131:0.3:16", "64:517:0.3:16"],
                    metavar="ROWS:CONTEXT:HOLES:TOKENS", help="cells whose operators the profiler lists")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with torch.device(args.device):
        config = LlamaConfig(**{**SMOLLM2, "num_hidden_layers": args.layers})
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    runner = ModelRunner(model)
    results, report = [], []
    for rows in args.rows:
        for context, holes in ((128, 0.0), (131, 0.0), (131, 0.3), (517, 0.3)):
            for q in args.tokens:
                cache_with_holes(runner, rows, context, holes)
                t = time_verify(runner, rows, q, context, args.repeats)
                results.append({"rows": rows, "context": context, "holes": holes, "q": q, "ms": t.ms, "host_ms": t.host_ms})
                print(f"rows {rows:3d} ctx {context} holes {holes} q {q:2d}: {t.ms:6.2f} ms (host {t.host_ms:6.2f})",
                      flush=True)
    for spec in args.profile:
        rows, context, holes, q = (t(x) for t, x in zip((int, int, float, int), spec.split(":")))
        cache_with_holes(runner, rows, context, holes)
        time_verify(runner, rows, q, context, 2)
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if args.device == "cuda" else [])
        cache_with_holes(runner, rows, context, holes)
        with torch.profiler.profile(activities=activities) as prof:
            time_verify(runner, rows, q, context, 2)
        for key in ("self_cuda_time_total", "self_cpu_time_total")[args.device != "cuda":]:
            report.append(f"### rows {rows} ctx {context} holes {holes} q {q}, by {key}\n"
                          + prof.key_averages().table(sort_by=key, row_limit=14))
    meta = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "torch": torch.__version__,
            "attention": model.config._attn_implementation}
    (args.out / "gpu_verify_paths.json").write_text(json.dumps({**meta, "results": results}, indent=1))
    (args.out / "gpu_verify_paths.txt").write_text("\n\n".join(report))
    print("\n\n".join(report)[-6000:])


if __name__ == "__main__":
    main()
