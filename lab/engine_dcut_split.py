#!/usr/bin/env python
"""Where the engine's D-cut spends time beside `ar`, and how right its predictions were.

    ROLLOUT_GRAFT_CACHE=DIR python lab/engine_dcut_split.py --repeats 6 --json split.json
    python lab/engine_dcut_split.py --batch 32 --dcut retrieval+recall+dcut --revisit

The embedded tiny target, 64 rows (8 prompts × 8; `--batch`), T = 1, at most 192 new tokens, one
thread: `ar`, its A/A twin, a D-cut method (`--dcut`, `retrieval+dcut` by default) and the same
method's proposer under a budget of 0 (`-plain`: its bookkeeping without a draft) run in a
shuffled order per repeat on fresh prompts (the benchmark's
engines: `rollout_graft_tools.bench_engine`; `--revisit`: each repeat's prompts first once, untimed,
as a later GRPO epoch). Per method: the paired ratio to `ar` (median, range)
and each phase's ms per rollout; for D-cut, the µs its `plan`, `cut` and `observe` take per step
and, on the steps it drafted, its prediction against what the step did: expected / emitted tokens,
predicted / measured step ms and forward ms. D-cut reads its cost table from `ROLLOUT_GRAFT_CACHE`
(point it at one profiled under load to see that case).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from rollout_graft import RolloutEngine  # noqa: E402
from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET  # noqa: E402
from rollout_graft.dcut.trees import FixedBudget  # noqa: E402
from rollout_graft_tools.bench_engine import EngineBackend, _rows  # noqa: E402
from rollout_graft_tools.benchmark import Cell, environment  # noqa: E402


class Recorder:
    """Wraps a D-cut's plan / cut / observe: their time, and each drafting step's prediction and outcome."""

    def __init__(self, policy):
        self.policy, self.enabled = policy, True
        self.reset()
        for name in self.us:
            setattr(policy, name, self._timed(name, getattr(policy, name)))

    def reset(self) -> None:
        """Forget what was recorded (a warm-up's steps)."""
        self.us, self.steps, self.records = dict.fromkeys(("plan", "cut", "observe"), 0.0), 0, []

    def _timed(self, name, call):
        def wrapper(*args):
            start = time.perf_counter()
            out = call(*args)
            if not self.enabled:
                return out
            self.us[name] += (time.perf_counter() - start) * 1e6
            if name == "plan":
                self.steps += 1
            elif name == "cut":
                self._predicted(*out)
            else:
                self._measured(args[0])
            return out
        return wrapper

    def _predicted(self, draft, decision) -> None:
        p, rows = self.policy, draft.tokens.shape[0]
        width = round(decision.ratio * p.budget)
        if width and not decision.probe:
            verified = min(width, p.widest)
            self.records.append({"expected": decision.expected_emitted, "ms": p.cost.step_ms(rows, verified, width),
                                 "forward_ms": p.cost.forward_ms(rows, 1 + verified)})
        elif draft.tokens.shape[1] == 0:  # a plain step: what D-cut weighs every draft against
            self.records.append({"plain": True, "expected": float(rows), "ms": p.cost.step_ms(rows, 0, 0),
                                 "forward_ms": p.cost.forward_ms(rows, 1)})
        else:
            self.records.append(None)

    def _measured(self, step) -> None:
        last = self.records[-1] if self.records else None
        if last is not None and "emitted" not in last:
            last.update(emitted=step.emitted, measured_ms=step.timing.total_ms, measured_forward_ms=step.timing.forward_ms)

    def summary(self) -> dict:
        out = {"us_per_step": {k: v / max(self.steps, 1) for k, v in self.us.items()}, "steps": self.steps}
        for kind, plain in (("drafting", False), ("plain", True)):
            done = [d for d in self.records if d and "emitted" in d and d.get("plain", False) == plain]
            total = lambda key: sum(d[key] for d in done)  # noqa: E731
            out[kind] = {"steps": len(done)} | ({
                "expected_over_emitted": total("expected") / total("emitted"),
                "predicted_over_measured_ms": total("ms") / total("measured_ms"),
                "predicted_over_measured_forward": total("forward_ms") / total("measured_forward_ms")} if done else {})
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--json", default=None)
    ap.add_argument("--batch", type=int, default=64, help="rows: prompts × 8")
    ap.add_argument("--dcut", default="retrieval+dcut", help="the D-cut method (a bench_engine name)")
    ap.add_argument("--revisit", action="store_true", help="each repeat's prompts run once, untimed, first")
    args = ap.parse_args()
    torch.set_num_threads(1)
    methods = ["ar", "ar-twin", args.dcut]
    backend = EngineBackend(str(TINY_TARGET), str(TINY_PROMPTS), methods)
    cell, prompts_per = Cell(1.0, args.batch, 8, 192), args.batch // 8
    engines = {m: backend._engine(m, cell) for m in methods}
    engines["ar-twin"] = RolloutEngine(backend.model, engines["ar"].config)
    engines[f"{args.dcut}-plain"] = RolloutEngine(backend.model, engines[args.dcut].config)
    engines[f"{args.dcut}-plain"].policy = FixedBudget(0)  # the proposer's bookkeeping, never a draft
    for engine in engines.values():
        engine.budget_policy()
    recorder = Recorder(engines[args.dcut].policy)
    warm = backend.prompts(cell, prompts_per)
    for engine in engines.values():
        engine.generate(_rows(warm, 8), backend._params(cell, 1))
    recorder.reset()  # the timed repeats only
    runs: dict[str, list] = {m: [] for m in engines}
    order, rng = list(engines), random.Random(0)
    for rep in range(args.repeats):
        prompts = backend.prompts(cell, prompts_per)
        rng.shuffle(order)
        if args.revisit:  # the prompts' previous epoch, untimed (recall keeps its completions)
            recorder.enabled = False
            for m in order:
                engines[m].generate(_rows(prompts, 8), backend._params(cell, 1000 + rep))
            recorder.enabled = True
        for m in order:
            start = time.perf_counter()
            out = engines[m].generate(_rows(prompts, 8), backend._params(cell, 100 + rep))
            runs[m].append({"s": time.perf_counter() - start, "steps": out.stats.target_forwards,
                            "phase_ms": {**{k: v * 1000 for k, v in out.stats.seconds.items()},
                                         "outside phases": (time.perf_counter() - start - sum(out.stats.seconds.values())) * 1000}})
    result = {"environment": environment("cpu", "float32"), "repeats": args.repeats, "batch": args.batch,
              "revisit": args.revisit, "methods": {}, "dcut": recorder.summary()}
    for m, rs in runs.items():
        ratios = [a["s"] / r["s"] for a, r in zip(runs["ar"], rs)]
        result["methods"][m] = {"vs_ar": statistics.median(ratios), "vs_ar_range": [min(ratios), max(ratios)],
                                "steps": statistics.median(r["steps"] for r in rs),
                                "phase_ms": {k: statistics.median(r["phase_ms"][k] for r in rs) for k in rs[0]["phase_ms"]}}
        print(f"{m:16s} × ar {result['methods'][m]['vs_ar']:.3f} [{min(ratios):.3f}–{max(ratios):.3f}]  per rollout ms",
              {k: round(v, 1) for k, v in result["methods"][m]["phase_ms"].items()})
    print("D-cut", json.dumps(result["dcut"], indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
