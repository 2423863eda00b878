#!/usr/bin/env python
"""The vLLM proposer's counting kernel (`_kernels._teach`) at each prefetch distance, on the same tables.

    python lab/count_prefetch.py --json docs/bench/vllm_count_prefetch.json

Builds one proposer's tables (`NgramStore`: GRPO groups of 8 and the prior, each row's 64-token
prompt and 256-token completion counted; siblings read their group's template of repeated phrases,
`chain_replay.completions`, as the micro-benchmark's rows do), then times counting one step's new
text — 3 tokens a row, the micro-benchmark's MAT — into a fresh copy of the group and prior hash
tables, at each `--ahead` (positions whose rows `_teach` asks for ahead of time: 0 turns the prefetch
off; `0-twin` is the A/A twin of 0), the arms interleaved in a new order each repeat, every step a
new slice of text. Reports ns per context-length update (an "add"): the median over repeats, and each
arm's per-repeat ratio to 0's. The copies start cold, as the tables of a step whose rows the last step
did not touch; the tables after every arm are checked equal (the prefetch only asks for rows early).
Two arms count elsewhere, at the product's distance: `4-own` into the store's own tables (after the
copies, each repeat: the proposer's tables, not a fresh copy of them) and `4-fresh` into empty tables
sized for the step alone (zeroed first: what a small per-step table beside the big one would cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from rollout_graft.vllm.config import MAX_MATCH as ORDER  # the proposer's contexts: 1…8 tokens
from rollout_graft.vllm.ngrams import SPARE, NgramStore, _capacity, _rows
from rollout_graft_tools.benchmark import cpu_info
from rollout_graft_tools.chain_replay import PROMPT, completions


def build(rows: int, length: int, per: int, steps: int, seed: int):
    """The store with every row's prompt and first `length` completion tokens counted, its slots, and the
    texts (which go `per` tokens further for each of `steps` steps)."""
    rng = np.random.default_rng(seed)
    prompts, outs = completions(rng, rows, 8, length + per * steps)
    texts = [np.concatenate([p, o]) for p, o in zip(prompts, outs)]
    store = NgramStore(ORDER, 1)
    groups = [store.slot() for _ in range(rows // 8)]
    prior = store.slot(apart=True)
    store.teach([(groups[r // 8], prior, texts[r].tolist(), 0, PROMPT + length) for r in range(rows)])
    for shard in (0, 1):
        store.reserve(rows * per * ORDER * (steps + 1), 2 * rows * per * ORDER * (steps + 1), shard)
    return store, groups, prior, texts


def step(texts, slots, end: int, per: int):
    """`_teach`'s segments for positions [end - per, end) of every text (`slots[r]`: its table)."""
    meta = np.array([(slots[r], -1, end - per, end) for r in range(len(texts))], np.int64)
    tokens = np.concatenate([t[end - per - ORDER : end] for t in texts]).astype(np.int64)
    return meta, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--length", type=int, default=256, help="completion tokens counted before the timed steps")
    ap.add_argument("--per", type=int, default=3, help="new tokens a row each step")
    ap.add_argument("--ahead", nargs="+", default=["0", "0-twin", "1", "2", "4", "8", "4-own", "4-fresh"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    store, groups, prior, texts = build(args.rows, args.length, args.per, args.repeats + 1, 0)
    kern = store.kern
    out = {"command": "python lab/count_prefetch.py" + (f" --json {args.json}" if args.json else ""), "args": vars(args),
           "cpu": cpu_info(), "tables_mb": store.nbytes() / 1e6, "results": []}
    rng = np.random.default_rng(1)
    for shard, slots in ((0, [groups[r // 8] for r in range(args.rows)]), (1, [prior] * args.rows)):
        sh = store.shards[shard]
        ns: dict[str, list[float]] = {a: [] for a in args.ahead}
        for rep in range(args.repeats + 1):  # repeat 0 compiles and warms
            meta, tokens = step(texts, slots, PROMPT + args.length + args.per * (rep + 1), args.per)
            adds = len(meta) * args.per * ORDER
            tables = None
            copies = [a for a in args.ahead if a != "4-own"]
            for arm in [*rng.permutation(copies), *(["4-own"] if "4-own" in args.ahead else [])]:
                if arm == "4-own":  # last: it changes the store's tables
                    ctx, pairs, used, sizes = sh.ctx, sh.pairs, sh.used, store.sizes
                elif arm == "4-fresh":
                    ctx, pairs = _rows(_capacity(adds)), _rows(_capacity(2 * adds))
                    ctx[:], pairs[:] = 0, 0
                    used, sizes = np.zeros(2, np.int64), np.zeros_like(store.sizes)
                else:
                    ctx, pairs, used, sizes = sh.ctx.copy(), sh.pairs.copy(), sh.used.copy(), store.sizes.copy()
                at = np.zeros(3, np.int64)
                t = time.perf_counter()
                kern._teach(ctx, pairs, used, sizes, store.gens, meta, tokens, 1, ORDER, at, SPARE, int(arm.split("-")[0]))
                dt = time.perf_counter() - t
                if at[0] != len(meta):
                    raise SystemExit("a table filled up: reserve more rows")
                if arm not in ("4-own", "4-fresh"):  # the copies' tables: every distance counts them alike
                    if tables is None:
                        tables = (ctx, pairs)
                    elif not (np.array_equal(tables[0], ctx) and np.array_equal(tables[1], pairs)):
                        raise SystemExit(f"ahead={arm}: the tables differ")
                if rep:
                    ns[arm].append(1e9 * dt / adds)
        base = ns[args.ahead[0]]
        for arm in args.ahead:
            ratios = [a / b for a, b in zip(ns[arm], base)]
            r = {"table": ("groups", "prior")[shard], "ahead": arm, "ns_per_add_median": statistics.median(ns[arm]),
                 "ns_per_add": ns[arm], "ratio_to_0_median": statistics.median(ratios),
                 "ratio_to_0_range": [min(ratios), max(ratios)]}
            out["results"].append(r)
            print(f"{r['table']:>6} ahead {arm:>6}: {r['ns_per_add_median']:6.1f} ns/add, ×0 {r['ratio_to_0_median']:.3f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f})", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
