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
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from rollout_graft.runner import ModelRunner

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
               max_position_embeddings=8192, rope_theta=1e5, rms_norm_eps=1e-5)


def setup(runner: ModelRunner, rows: int, context: int, holes: float, gen: torch.Generator) -> None:
    """Every row's cache: one prompt of `context` tokens, a share `holes` of its slots masked (rejected nodes)."""
    prompt = torch.randint(0, runner.vocab_size, (context,), generator=gen).tolist()
    runner.prefill([prompt], torch.zeros(rows, dtype=torch.long))
    if holes:
        invalid = torch.rand(rows, context, generator=gen) < holes
        invalid[:, 0] = False
        runner.slot_valid = runner.slot_valid & ~invalid.to(runner.device)


def time_verify(runner: ModelRunner, rows: int, q: int, context: int, repeats: int) -> tuple[float, float]:
    """(best synchronised ms, best host-side ms) of a verify forward of `q` causal tokens per row."""
    dev = runner.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda d: None)
    tokens = torch.randint(0, runner.vocab_size, (rows, q), device=dev)
    positions = (context + torch.arange(q, device=dev)).expand(rows, q)
    mask = torch.ones(q, q, dtype=torch.bool, device=dev).tril().expand(rows, q, q)
    whole, host = [], []
    for i in range(repeats + 1):
        sync(dev)
        start = time.perf_counter()
        runner.verify(tokens, positions, mask)
        returned = time.perf_counter()
        sync(dev)
        end = time.perf_counter()
        runner.truncate(context)
        if i:
            whole.append(1000 * (end - start))
            host.append(1000 * (returned - start))
    return min(whole), min(host)


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
    runner, gen = ModelRunner(model), torch.Generator().manual_seed(0)
    results, report = [], []
    for rows in args.rows:
        for context, holes in ((128, 0.0), (131, 0.0), (131, 0.3), (517, 0.3)):
            for q in args.tokens:
                setup(runner, rows, context, holes, gen)
                whole, host = time_verify(runner, rows, q, context, args.repeats)
                runner.release()
                results.append({"rows": rows, "context": context, "holes": holes, "q": q, "ms": whole, "host_ms": host})
                print(f"rows {rows:3d} ctx {context} holes {holes} q {q:2d}: {whole:6.2f} ms (host {host:6.2f})", flush=True)
    for spec in args.profile:
        rows, context, holes, q = (t(x) for t, x in zip((int, int, float, int), spec.split(":")))
        setup(runner, rows, context, holes, gen)
        time_verify(runner, rows, q, context, 2)
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with torch.profiler.profile(activities=activities) as prof:
            time_verify(runner, rows, q, context, 2)
        runner.release()
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
