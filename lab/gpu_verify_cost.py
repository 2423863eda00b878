#!/usr/bin/env python
"""The engine's verify forward on a GPU, measured: rows × tokens per row × context, on a target of a
published shape with random weights (a forward's time does not depend on the weights' values, and
no weights can travel to the GPU machine), beside the roofline of the same step (`dcut.roofline`).

    python lab/gpu_verify_cost.py --models Qwen3-8B Qwen3-32B --json $OUT/gpu_verify_cost.json   # on the GPU
    python lab/gpu_verify_cost.py --models tiny --device cpu --time-budget 30 --json /tmp/g.json   # a smoke run
    python lab/gpu_verify_cost.py --attention sdpa folded --json $OUT/g.json     # both attentions, cell by cell

Each cell is `cost.time_forward` (what `CostModel.profile` times): one prompt of `context` tokens
prefilled and given to every row, then the best of `--repeats` verify forwards of `tokens` tree
tokens per row (a causal block), after one untimed forward. A cell whose KV cache and logits would
not fit the GPU's free memory is skipped and says so; the JSON is rewritten after every row of
cells, so a run stopped at its time budget keeps what it measured. `engine_clocks.measured_table_clock`
reads it as a clock: the engine's forward-cost table on that GPU.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen3Config  # noqa: E402

from rollout_graft.attention import FOLDED  # noqa: E402
from rollout_graft.cost import time_forward  # noqa: E402
from rollout_graft.files import atomic_write_json  # noqa: E402
from rollout_graft.runner import ModelRunner  # noqa: E402
from rollout_graft_tools.benchmark import environment  # noqa: E402

SHAPES = {  # the published config.json of Qwen/Qwen3-8B and Qwen/Qwen3-32B (the fields a forward's cost depends on)
    "Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "Qwen3-32B": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=False),  # smoke runs
}
ROWS = (1, 4, 16, 64, 128, 256)
TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 32)
CONTEXTS = (512, 128, 2048)  # the order they run in: the contexts a GRPO rollout spends most steps at first


def build(name: str, device: str, dtype: torch.dtype):
    """A random-weight causal LM of the preset's shape, made on `device` (no host copy)."""
    config = Qwen3Config(**SHAPES[name], max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def shape_of(name: str, model) -> dict:
    """What the roofline reads of the model (`roofline.ModelShape`'s fields), as built."""
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    return {"name": name, "params": params, "embedding_params": model.get_input_embeddings().weight.numel(),
            "layers": cfg.num_hidden_layers, "q_heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "bytes_per_value": next(model.parameters()).element_size(),
            "attention": getattr(cfg, "_attn_implementation", None)}


def fits(shape: dict, rows: int, tokens: int, context: int, free_bytes: float) -> bool:
    """Whether a cell's transient memory fits: the rows' KV twice and a half (the prefill's copy
    for every row, then `SlotLayer._reserve`'s room with spare) and fp32 logits twice over."""
    kv = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * shape["bytes_per_value"]
    need = 2.5 * kv * rows * (context + tokens + 64) + 2 * 4 * rows * tokens * SHAPES[shape["name"]]["vocab_size"]
    return need < 0.85 * free_bytes


def measure(name: str, args, results: dict, out: Path, deadline: float) -> None:
    dtype = getattr(torch, args.dtype)
    model = build(name, args.device, dtype)
    runner = ModelRunner(model)
    entry = {"model": shape_of(name, model), "cells": [], "skipped": []}
    results["models"].append(entry)
    cuda = args.device.startswith("cuda")
    free = torch.cuda.mem_get_info()[0] if cuda else float("inf")
    entry["free_gib_after_load"] = free / 2**30 if cuda else None
    for attention in args.attention:  # first-call allocations, kernel choice: each attention's
        model.set_attn_implementation(FOLDED if attention == "folded" else attention)
        time_forward(runner, 1, 1, 128, runner.vocab_size, 1)
    for context in args.contexts:
        for rows in args.rows:
            for tokens in args.tokens:
                cell = {"rows": rows, "tokens": tokens, "context": context}
                if time.perf_counter() > deadline:
                    entry["skipped"].append({**cell, "why": "time budget"})
                    continue
                if rows * tokens > args.max_tokens or not fits(entry["model"], rows, tokens, context, free):
                    entry["skipped"].append({**cell, "why": "memory" if rows * tokens <= args.max_tokens
                                             else f"over {args.max_tokens} tokens"})
                    continue
                try:
                    ms = {}
                    for attention in args.attention:  # each arm on the same cell, one after the other
                        model.set_attn_implementation(FOLDED if attention == "folded" else attention)
                        ms[attention] = time_forward(runner, rows, tokens, context, runner.vocab_size, args.repeats)
                except torch.OutOfMemoryError:
                    runner.release()
                    torch.cuda.empty_cache()
                    entry["skipped"].append({**cell, "why": "out of memory"})
                    continue
                entry["cells"].append({**cell, "ms": ms[args.attention[0]],
                                       **({"ms_by_attention": ms} if len(ms) > 1 else {})})
            if cuda:
                torch.cuda.empty_cache()
            results["elapsed_s"] = time.perf_counter() - results["_start"]
            atomic_write_json(out, {k: v for k, v in results.items() if not k.startswith("_")}, indent=1)
            last = [c for c in entry["cells"] if c["rows"] == rows and c["context"] == context]
            print(f"{name} context {context} rows {rows}: " + " ".join(f"{c['tokens']}:{c['ms']:.2f}" for c in last),
                  flush=True)
    del runner, model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["Qwen3-8B"], choices=list(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="tree tokens per row (1: plain)")
    ap.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8192, help="the most tokens one forward computes")
    ap.add_argument("--attention", nargs="+", default=["sdpa"], choices=["sdpa", "folded"],
                    help="the forward's attention: transformers' SDPA path (its `ms`) and/or grouped-query attention "
                         "folded (rollout_graft.attention); the first is the cell's `ms`, all in `ms_by_attention`")
    ap.add_argument("--time-budget", type=float, nargs="+", default=[240.0],
                    help="seconds per model (one figure for all, or one per model)")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this machine has no CUDA device (use --device cpu for a smoke run)")
    budgets = args.time_budget * len(args.models) if len(args.time_budget) == 1 else args.time_budget
    if len(budgets) != len(args.models):
        raise SystemExit(f"--time-budget: one figure, or one per model ({len(args.models)}), got {len(budgets)}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {**environment(args.device, args.dtype), "models": [], "_start": time.perf_counter()}
    if args.device.startswith("cuda"):
        from rollout_graft.vllm.profile import measure_peaks

        results["measured_peaks"] = dict(zip(("tflops", "tbps"), measure_peaks(args.device, getattr(torch, args.dtype))))
        print(f"{results['gpu']}: {results['measured_peaks']}", flush=True)
    for name, budget in zip(args.models, budgets):
        measure(name, args, results, out, time.perf_counter() + budget)
    results["elapsed_s"] = time.perf_counter() - results.pop("_start")
    atomic_write_json(out, results, indent=1)
    print(f"wrote {out}", flush=True)
    return results


if __name__ == "__main__":
    main()
