#!/usr/bin/env python
"""The engine's verify forward with grouped-query attention folded (`rollout_graft.attention`:
no KV head copy under the engine's masks), against transformers' SDPA path. This study times
`ModelRunner.verify` both ways in one process, alternating, with an A/A twin of the unfolded path,
and the largest logit difference between the two (float rounding only). `--device cuda`: the same
on a GPU, each forward synchronised.

    python lab/gqa_fold.py --json docs/bench/engine_gqa_fold_cpu.json
    python lab/gqa_fold.py --models DIR --cells 64:300:1 --repeats 5       # any local model, cells ROWS:CONTEXT:TOKENS
    python lab/gqa_fold.py --device cuda --dtype bfloat16 --json $OUT/gqa_fold_gpu.json   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from rollout_graft.assets import TINY_TARGET  # noqa: E402
from rollout_graft.attention import FOLDED  # noqa: E402
from rollout_graft.runner import ModelRunner  # noqa: E402
from rollout_graft_tools.benchmark import environment  # noqa: E402
from rollout_graft_tools.verify_timing import cache_with_holes, time_verify  # noqa: E402

CELLS = ("8:150:1", "64:150:1", "64:150:4", "64:300:1", "64:300:8", "32:1024:1")


def timed(model, runner: ModelRunner, attention: str, rows: int, context: int, tokens: int, repeats: int):
    """(best ms of `repeats` verify forwards of `tokens` causal tokens per row, the last logits) with
    `attention`, over a cache with a fifth of its slots masked."""
    model.set_attn_implementation(attention)
    cache_with_holes(runner, rows, context, 0.2)
    t = time_verify(runner, rows, tokens, context, repeats)
    return t.ms, t.logits


def measure(path: str, cells: list[str], rounds: int, repeats: int, device: str = "cpu",
            dtype: torch.dtype = torch.float32) -> dict:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    cfg = model.config
    runner, out = ModelRunner(model), []
    for cell in cells:
        rows, context, tokens = map(int, cell.split(":"))
        arms: dict[str, list[float]] = {"sdpa": [], "folded": [], "sdpa-twin": []}
        for _ in range(rounds):  # alternating, so the machine's load falls on every arm alike
            for arm in arms:
                ms, logits = timed(model, runner, FOLDED if arm == "folded" else "sdpa", rows, context, tokens, repeats)
                arms[arm].append(ms)
                if arm == "sdpa":
                    reference = logits
                elif arm == "folded":
                    diff = float((logits - reference).abs().max())
        med = {a: statistics.median(v) for a, v in arms.items()}
        out.append({"rows": rows, "context": context, "tokens": tokens, "ms": arms, "median_ms": med,
                    "speedup": med["sdpa"] / med["folded"], "twin": med["sdpa"] / med["sdpa-twin"],
                    "max_logit_diff": diff})
        print(f"{Path(path).name} rows {rows} context {context} tokens {tokens}: sdpa {med['sdpa']:.1f} ms, folded "
              f"{med['folded']:.1f} ({out[-1]['speedup']:.2f}×, twin {out[-1]['twin']:.2f}), max |Δlogit| {diff:.1e}",
              flush=True)
    model.set_attn_implementation("sdpa")
    return {"model": str(path), "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "layers": cfg.num_hidden_layers, "cells": out}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=[str(TINY_TARGET)], help="local model folders (default: the tiny target)")
    ap.add_argument("--cells", nargs="+", default=list(CELLS), metavar="ROWS:CONTEXT:TOKENS")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the three arms")
    ap.add_argument("--repeats", type=int, default=3, help="forwards per arm and round (the best counts)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", help="e.g. bfloat16 on a GPU")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {**environment(args.device, args.dtype),
               "models": [measure(m, args.cells, args.rounds, args.repeats, args.device, getattr(torch, args.dtype))
                          for m in args.models]}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
