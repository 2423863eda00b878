"""The vLLM proposer's drafts and D-cut's decisions on two kept recordings, replayed on a clock that
ignores real time (so every run decides exactly alike): the golden record
`tests/data/vllm_golden.json` that `test_vllm_units.py::test_proposer_reproduces_its_golden_drafts`
compares with. Regenerate it (after a deliberate change of the drafts or of D-cut's decisions) with

    PYTHONPATH=. python tests/vllm_golden.py --write

Each variant replays its recording's rollouts in order through one proposer (groups, recall and
the prior at work; one variant preempts a request every 7 steps, one starts D-cut from a
roofline) and keeps, per step, a digest of
every row's draft, and per D-cut decision (k, proposed, probe) and the plan's depth.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).with_name("data") / "vllm_golden.json"
STEP_MS = (5.0, 0.05, 0.02)  # the modelled vLLM step D-cut times (a + b·rows + c·draft tokens, ms)
VARIANTS = {  # name: (recording, policy, revisit: each rollout twice in a row, preempt_every)
    "tiny_t1/fixed": ("rec_tiny_t1.json", "fixed", False, 0),
    "tiny_t1/dcut": ("rec_tiny_t1.json", "dcut", False, 7),
    "smollm2_t0_b8/fixed": ("rec_smollm2_t0_b8.json", "fixed", True, 7),
    "smollm2_t0_b8/dcut": ("rec_smollm2_t0_b8.json", "dcut", True, 0),
    # D-cut started from a roofline, as on a GPU with a preset (`load_model`): the profile read every step
    "tiny_t1/dcut-roofline": ("rec_tiny_t1.json", "dcut-roofline", False, 0),
}


class StillClock:
    """`time` for the proposer module: only the modelled vLLM steps advance it (the proposer's own
    real time is not added: `chain_replay.FakeClock` adds it), so D-cut decides the same every run."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def call(self, fn, *args):
        return fn(*args)


def run_variant(name: str) -> dict:
    from rollout_graft.vllm import proposer as module
    from rollout_graft_tools.chain_replay import ours_proposer, replay_rows

    recording, policy, revisit, preempt = VARIANTS[name]
    rec = json.loads((ROOT / "docs/bench/replay" / recording).read_text())
    rollouts = [r for r in rec["rollouts"] for _ in range(2 if revisit else 1)]
    k = 8
    max_len = max(len(p) + len(c) for r in rollouts for p, c in zip(r["prompts"], r["completions"])) + 2 * k + 2
    prop = ours_proposer(k, 0.0 if policy == "fixed" else None, rec["vocab"], max_len)
    if policy == "fixed":  # the product's fixed depth (ours_proposer cuts at a raw score)
        from rollout_graft.dcut.chains import FixedDepth

        prop.policy = FixedDepth(k)
    if policy == "dcut-roofline":  # the H200's for Qwen3-8B: memory-bound here, so it drafts
        from rollout_graft_tools.clocks import ACCELERATORS, MODELS, Roofline

        prop.use_profile(Roofline(ACCELERATORS["H200"], MODELS["Qwen3-8B"]))
    decisions: list = []
    plan, cut = prop.policy.plan, prop.policy.cut

    def planned(rows):
        depth = plan(rows)
        decisions.append(["plan", rows, depth])
        return depth

    def decided(tokens, scores):
        depths, d = cut(tokens, scores)
        decisions.append(["cut", d.kept, d.candidates, bool(d.probe), None if d.expected_emitted is None else round(d.expected_emitted, 9)])
        return depths, d

    prop.policy.plan, prop.policy.cut = planned, decided
    clock, saved = StillClock(), module.time
    module.time = clock
    steps, counts = [], {"steps": 0, "emitted": 0, "drafted": 0, "accepted": 0}
    try:
        for r in rollouts:
            history = replay_rows(prop, r["prompts"], r["completions"], clock=clock, step_ms=STEP_MS,
                                  preempt_every=preempt, counts=counts)
            steps += [hashlib.sha256(json.dumps(h).encode()).hexdigest()[:16] for h in history]
    finally:
        module.time = saved
    stats = {key: v for key, v in vars(prop.stats).items() if not key.endswith("_s")}
    return {"steps": steps, "decisions": hashlib.sha256(json.dumps(decisions).encode()).hexdigest()[:16],
            "plain_decisions": sum(1 for d in decisions if d[0] == "cut" and d[1] == 0),
            "counts": counts, "stats": stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"write {GOLDEN.relative_to(ROOT)} (else compare with it)")
    args = ap.parse_args()
    out = {name: run_variant(name) for name in VARIANTS}
    for name, v in out.items():
        print(name, json.dumps(v["counts"]), "plain decisions:", v["plain_decisions"])
    if args.write:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({"command": "PYTHONPATH=. python tests/vllm_golden.py --write",
                                      "step_ms": STEP_MS, "variants": out}, indent=0))
    else:
        golden = json.loads(GOLDEN.read_text())["variants"]
        print("equal" if golden == json.loads(json.dumps(out)) else "DIFFERENT")


if __name__ == "__main__":
    main()
