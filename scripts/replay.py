#!/usr/bin/env python
"""Acceptance studies without the target: record a plain rollout once, replay retrieval variants on it.

    python scripts/replay.py record --num-prompts 8 --group-size 8 --temperature 1.0 \\
        --max-new-tokens 256 --out rec.safetensors
    python scripts/replay.py run rec.safetensors --variants retrieval retrieval-noshare \\
        retrieval-noprior breadth-first --json replay.json
    python scripts/replay.py bound rec.safetensors    # what copying from siblings' text could give

`run` needs no model: trees come from the real RetrievalProposer, acceptance from the recorded
tokens, index updates from the recorded distributions of on-path positions only (the engine also
learns from rejected nodes, so replay's MAT is lower than an engine run's: compare variants with
each other). Exactness: see rollout_graft_tools/replay.py. The JSON follows bench_rollout's layout
(`configs[*].methods[variant]`), so `scripts/report.py` renders it (MAT, acceptance histograms).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from bench_rollout import load_prompts  # scripts/ is on sys.path when this runs as a script

from rollout_graft import EngineConfig, RetrievalConfig, SamplingParams
from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET
from rollout_graft.proposers import RetrievalProposer
from rollout_graft.templates import TemplateConfig
from rollout_graft_tools.bounds import suffix_chain_bound
from rollout_graft_tools.replay import Recording, record, replay


def variants(base: RetrievalConfig) -> dict[str, RetrievalConfig]:
    """Named retrieval variants (the bench's names where they exist)."""
    return {
        "retrieval": base,
        "retrieval-noshare": replace(base, share_in_group=False),
        "retrieval-noprior": replace(base, use_prior=False),
        "retrieval-bare": replace(base, share_in_group=False, use_prior=False),
        "retrieval-order2": replace(base, context_order=2),
        "retrieval+suffix": replace(base, suffix_depth=8),
        "retrieval+suffix-noshare": replace(base, suffix_depth=8, share_in_group=False),
        "retrieval-overwrite": replace(base, merge_decay=0.0),
        "breadth-first": replace(base, template=replace(base.template, kind="breadth_first")),
        "best-first-d4": replace(base, template=TemplateConfig(depth=4, width=base.template.width)),
    }


def cmd_record(args) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    prompts = load_prompts(Path(args.prompts), tokenizer, args.split, args.num_prompts, args.offset)
    params = SamplingParams(temperature=args.temperature, top_k=args.sampling_top_k, top_p=args.top_p,
                            min_p=args.min_p, max_new_tokens=args.max_new_tokens, seed=args.seed)
    rec = record(model, tokenizer, prompts, args.group_size, params, args.out, top_k=args.top_k)
    lens = [len(c) for c in rec.completions]
    print(f"recorded {rec.rows} rows ({len(prompts)} prompts × {args.group_size}), {sum(lens)} completion tokens "
          f"(mean {sum(lens) / len(lens):.0f}), top-{args.top_k} per position → {args.out} "
          f"({Path(args.out).stat().st_size / 1e6:.2f} MB)")


def hist_cell(hist: list[int], at_least: int) -> str:
    rows = sum(hist)
    return f"{100 * sum(hist[at_least:]) / max(rows, 1):.0f}"


def table(results: dict) -> str:
    lines = ["| variant | MAT | steps | row-steps | verified tok/step | accepted ≥1 % | ≥2 % | ≥4 % | accepted-length histogram |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, m in results["configs"][0]["methods"].items():
        h = m["accept_hist"]
        lines.append(f"| {name} | {m['mat']:.3f} | {m['target_forwards']} | {m['row_steps']} | "
                     f"{m['verify_tokens_per_step']:.0f} | {hist_cell(h, 1)} | {hist_cell(h, 2)} | {hist_cell(h, 4)} | "
                     f"{' '.join(map(str, h))} |")
    return "\n".join(lines)


def cmd_run(args) -> dict:
    rec = Recording.load(args.recording)
    warm = [Recording.load(p) for p in args.warm]
    table_of = variants(RetrievalConfig(prior_path=args.prior, update_prior=bool(warm)))
    unknown = [v for v in args.variants if v not in table_of]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(table_of)}")
    groups = int(rec.row_group.max()) + 1
    entry = {"temperature": rec.params.temperature, "prompts": groups, "group": rec.rows // groups, "batch": rec.rows,
             "methods": {}}
    for name in args.variants:
        cfg = EngineConfig(method="retrieval", budget=args.budget, max_depth=args.max_depth, retrieval=table_of[name])
        proposer = RetrievalProposer(cfg.retrieval, rec.vocab, args.device)
        for w in warm:  # the prior learns from other recordings first (as over earlier GRPO steps)
            replay(w, cfg, proposer=proposer, device=args.device)
        entry["methods"][name] = {**replay(rec, cfg, proposer=proposer, device=args.device).as_dict(),
                                  "retrieval": asdict(cfg.retrieval)}
    results = {"command": "python " + " ".join(sys.argv), "replay": True, "recording": args.recording,
               "model": rec.model, "params": asdict(rec.params), "budget": args.budget, "max_depth": args.max_depth,
               "prior": args.prior, "warm": args.warm, "configs": [entry]}
    print(table(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run the plain path once and record completions + target top-k")
    r.add_argument("--model", default=str(TINY_TARGET))
    r.add_argument("--prompts", default=str(TINY_PROMPTS), help="JSON lines with a 'prompt' (text or chat messages)")
    r.add_argument("--split", default="test")
    r.add_argument("--offset", type=int, default=0)
    r.add_argument("--num-prompts", type=int, default=8)
    r.add_argument("--group-size", type=int, default=8)
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--sampling-top-k", type=int, default=0, help="SamplingParams.top_k (0: off)")
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--min-p", type=float, default=0.0)
    r.add_argument("--max-new-tokens", type=int, default=256)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--top-k", type=int, default=8, help="successors recorded per position (>= the index's top_k)")
    r.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    r.add_argument("--device", default="cpu")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", required=True)
    p = sub.add_parser("run", help="replay retrieval variants on a recording (no model)")
    p.add_argument("recording")
    p.add_argument("--variants", nargs="+", default=["retrieval", "retrieval-noshare", "retrieval-noprior", "breadth-first"],
                   help=f"any of {list(variants(RetrievalConfig()))}")
    p.add_argument("--budget", type=int, default=EngineConfig().budget, help="candidate nodes per sequence and step")
    p.add_argument("--max-depth", type=int, default=EngineConfig().max_depth)
    p.add_argument("--prior", default=None, help="a saved adjacency prior (scripts/warm_prior.py) to start from")
    p.add_argument("--warm", nargs="*", default=[], help="recordings replayed first to warm the prior (on-path rule)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, help="write the results here (bench_rollout layout)")
    b = sub.add_parser("bound", help="tokens/step of a lone suffix-chain drafter copying from own / sibling text")
    b.add_argument("recording")
    b.add_argument("--depth", type=int, default=8)
    args = ap.parse_args(argv)
    if args.cmd == "bound":
        return cmd_bound(args)
    return cmd_record(args) if args.cmd == "record" else cmd_run(args)


def cmd_bound(args) -> dict:
    res = {src: suffix_chain_bound(args.recording, src, depth=args.depth) for src in ("own", "siblings", "whole")}
    print(f"suffix chain (depth {args.depth}), tokens per step: own text {res['own']:.2f}, + siblings up to the same "
          f"position {res['siblings']:.2f}, + siblings' whole completions {res['whole']:.2f}")
    return res


if __name__ == "__main__":
    main()
