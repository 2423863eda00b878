#!/usr/bin/env python
"""Seed-exactness at scale: rows of every method that differ from plain "ar" sampling with one seed.

    python lab/seed_exact.py --prompts 64 --group 8 --max-new-tokens 64 --json seed_exact.json

Every method (retrieval, +suffix, +recall, group_lead, graft; fixed and D-cut budgets) runs on the
embedded tiny target (fp32 on `--device`, T=1 with top-k/top-p/min-p) on a fresh engine (seed A) and again warm
(seed B, after the seed-A rollout taught its indices, recall memory and D-cut); each row is compared
with "ar"'s row for the same seed. A differing row is explained at its first differing position:
the uniform u there and the distance of u·total from the nearest CDF boundary of ar's distribution
(float rounding between a tree forward and a one-token forward can move a boundary across u when
they are within ~1e-6 of each other); anything else would be a bug.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_graft import DraftConfig, EngineConfig, RetrievalConfig, RolloutEngine, SamplingParams
from rollout_graft.assets import TINY_DRAFT, TINY_TARGET, load_tiny_prompts
from rollout_graft.sampling import row_keys, uniforms, warp_logits

SUFFIX = RetrievalConfig(suffix_depth=6)
METHODS = {
    "retrieval": dict(method="retrieval"),
    "retrieval+suffix": dict(method="retrieval", retrieval=SUFFIX),
    "retrieval+recall": dict(method="retrieval", retrieval=RetrievalConfig(suffix_depth=6, recall=8)),
    "group_lead": dict(method="retrieval", group_lead=2, retrieval=SUFFIX),
    "graft": dict(method="graft", draft=DraftConfig()),
}


def boundary_gap(model, prompt: list[int], completion: list[int], pos: int, params: SamplingParams, seed: int,
                 row: int) -> dict:
    """u at `pos` of `row` and how far u·total lies from the nearest CDF boundary of ar's distribution."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion[:pos]], device=model.device)).logits[0, -1].float().cpu()
    cdf = warp_logits(logits, params).softmax(-1).cumsum(-1)
    u = uniforms(row_keys(seed, row + 1)[row], torch.tensor(pos)).item()
    target = u * cdf[-1].item()
    return {"u": u, "gap": float((cdf - target).abs().min())}


def compare(model, rows, ar, out, params, seed) -> list[dict]:
    diffs = []
    for r, (a, b) in enumerate(zip(ar.completion_ids, out.completion_ids)):
        if a != b:
            pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diffs.append({"row": r, "position": pos, "ar": a[pos:pos + 1], "method": b[pos:pos + 1],
                          **boundary_gap(model, rows[r], a, pos, params, seed, r)})
    return diffs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--budget", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--policies", nargs="+", default=["fixed", "dcut"], choices=["fixed", "dcut"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="where the engines run (cuda: seed-exact on a GPU's kernels)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(TINY_TARGET)
    target = AutoModelForCausalLM.from_pretrained(TINY_TARGET, dtype=torch.float32).to(args.device).eval()
    draft = AutoModelForCausalLM.from_pretrained(TINY_DRAFT, dtype=torch.float32).to(args.device).eval()
    prompts = [tok(r["prompt"])["input_ids"] for r in load_tiny_prompts()[: args.prompts]]
    rows = [p for p in prompts for _ in range(args.group)]
    params = {s: SamplingParams(temperature=1.0, top_k=50, top_p=0.95, min_p=0.01, max_new_tokens=args.max_new_tokens,
                                seed=s) for s in (args.seed, args.seed + 1)}
    ar = {s: RolloutEngine(target, tokenizer=tok).generate(rows, p) for s, p in params.items()}
    results = []
    for policy in args.policies:
        for name in args.methods:
            engine = RolloutEngine(target, EngineConfig(budget=args.budget, budget_policy=policy, **METHODS[name]),
                                   tokenizer=tok, draft_model=draft if name == "graft" else None)
            for warmth, (seed, p) in zip(("fresh", "warm"), params.items()):
                start = time.perf_counter()
                out = engine.generate(rows, p)
                diffs = compare(target, rows, ar[seed], out, p, seed)
                results.append({"method": name, "policy": policy, "engine": warmth, "rows": len(rows),
                                "tokens": out.stats.emitted_tokens, "mat": round(out.stats.mean_accepted_tokens, 3),
                                "differing_rows": len(diffs), "diffs": diffs,
                                "seconds": round(time.perf_counter() - start, 1)})
                r = results[-1]
                print(f"{name:18s} {policy:5s} {warmth:5s} rows {r['rows']} tokens {r['tokens']} MAT {r['mat']:.2f} "
                      f"differing rows {r['differing_rows']}", flush=True)
                for d in diffs:
                    print(f"    row {d['row']} pos {d['position']}: ar {d['ar']} vs {d['method']}, u={d['u']:.7f}, "
                          f"|u·total - nearest CDF boundary| = {d['gap']:.2e}", flush=True)
    total = sum(r["differing_rows"] for r in results)
    print(f"total: {total} differing rows of {sum(r['rows'] for r in results)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
