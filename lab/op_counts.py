#!/usr/bin/env python
"""Torch operators per decode step: the engine's rollouts against HF `generate` (deterministic, no timing).

    python lab/op_counts.py --json docs/bench/engine_op_counts.json

Where a GPU step is host-bound (the engine's forwards up to about a thousand tokens on an H100:
RESULTS, "Engine on a GPU: the verify forward"), its time is the host's: Python and one dispatch
and kernel launch per operator. This counts the ATen operators each decode step issues
(`TorchDispatchMode`), inside the target's forward and outside it (the engine's step: drafting,
masks, acceptance, sampling, bookkeeping; HF's: its logits processors, sampling and stopping), for
our methods and for HF `generate` sampling the same prompts (equal lengths, no padding) for the
same number of tokens. Counts depend on the code, the model's architecture and the batch shape,
not on the machine's load: one run decides. The in-model count is per forward of the target (the
engine prefills the prompt apart, HF's prefill samples the first token), the rest per step;
per-layer figures divide the in-model count by the model's layers.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_graft import EngineConfig, RolloutEngine, SamplingParams
from rollout_graft.assets import TINY_TARGET, load_tiny_prompts
from rollout_graft_tools.benchmark import cpu_info

SMOLLM2 = Path.home() / ".cache" / "rollout_graft" / "models" / "smollm2-135m-instruct"
METHODS = {"ar": {}, "ar-fold": {"fold_gqa": True}, "retrieval": {"method": "retrieval"},
           "retrieval+dcut": {"method": "retrieval", "budget_policy": "dcut"}}


class Counter(TorchDispatchMode):
    """ATen operators seen, split by whether the target's forward is running (`inside`)."""

    def __init__(self):
        super().__init__()
        self.inside = 0
        self.forwards = 0  # the target's forwards (the prefill's included)
        self.ops = {"model": collections.Counter(), "outside": collections.Counter()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops["model" if self.inside else "outside"][str(func).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def counting(model):
    """`model` with its forward marked for `Counter` (the counter is set on the returned function)."""
    forward = model.forward

    def marked(*args, **kwargs):
        marked.counter.forwards += marked.counter.inside == 0
        marked.counter.inside += 1
        try:
            return forward(*args, **kwargs)
        finally:
            marked.counter.inside -= 1

    marked.counter = Counter()
    model.forward = marked
    return marked


def cell(model, marked, prompts, method: str, tokens: int) -> dict:
    """One method's counts per decode step over a rollout of `tokens` new tokens (after a warm-up call)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=tokens, ignore_eos=True, seed=1)
    if method == "hf":
        ids = torch.tensor(prompts)
        kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0, max_new_tokens=tokens,
                      min_new_tokens=tokens, pad_token_id=0)
        with torch.inference_mode():
            model.generate(ids, **kwargs)
            marked.counter = counter = Counter()
            with counter:
                model.generate(ids, **kwargs)
        steps = tokens  # one step per token
    else:
        engine = RolloutEngine(model, EngineConfig(**METHODS[method]))
        engine.generate(prompts, params)
        marked.counter = counter = Counter()
        with counter:
            out = engine.generate(prompts, params)
        steps = out.stats.target_forwards
    # the model's part per forward (the engine prefills apart and then takes a forward per token; HF's
    # prefill samples the first token), the rest per step
    inside = sum(counter.ops["model"].values()) / counter.forwards
    outside = sum(counter.ops["outside"].values()) / steps
    layers = model.config.get_text_config().num_hidden_layers
    return {"method": method, "steps": steps, "ops_per_step": inside + outside, "in_model": inside,
            "in_model_per_layer": inside / layers, "outside": outside,
            "top_outside": {op: n / steps for op, n in counter.ops["outside"].most_common(8)},
            "top_in_model": {op: n / steps for op, n in counter.ops["model"].most_common(8)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=[str(TINY_TARGET), str(SMOLLM2)])
    ap.add_argument("--rows", type=int, nargs="+", default=[8])
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per row")
    ap.add_argument("--methods", nargs="+", default=["hf", *METHODS], choices=["hf", *METHODS])
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    out = {"command": "python lab/op_counts.py" + (f" --json {args.json}" if args.json else ""), "args": vars(args),
           "cpu": cpu_info(), "torch": torch.__version__, "cells": []}
    for path in args.models:
        if not Path(path).exists():
            print(f"skipped {path}: not prepared (scripts/prepare_models.py)")
            continue
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        marked = counting(model)
        prompt = tok(load_tiny_prompts("test")[0]["prompt"])["input_ids"]
        for rows in args.rows:
            for method in args.methods:
                c = {"model": Path(path).name, "layers": model.config.get_text_config().num_hidden_layers, "rows": rows,
                     **cell(model, marked, [prompt] * rows, method, args.tokens)}
                out["cells"].append(c)
                print(f"{c['model']:>24} {rows:>4} {method:>15} {c['ops_per_step']:8.1f} {c['in_model']:8.1f} "
                      f"{c['outside']:7.1f}", flush=True)
                if args.json:  # after every cell: an interrupted run keeps what it counted
                    Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
