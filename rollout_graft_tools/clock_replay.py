"""Budget policies replayed on modelled clocks (`lab/replay.py vllm clocks`): each arm — plain,
fixed depths, fixed score thresholds, our D-cut, vLLM's suffix decoding where arctic-inference is
installed — drives a real proposer through recorded rollouts (`chain_replay.replay_rows`:
acceptance as vLLM's rejection sampler gives it for drafts without probabilities) with a
`clocks.StepClock` as its only time source (`ModelledClock`: deterministic). On a clock that
prices the forward alone (the rooflines) every arm running our proposer also pays its own time
per step (`clocks.ProposerCost`, modelled from the micro-benchmark), and so does suffix decoding
(its own time in the same micro-benchmark, one figure for every depth; priced at 0, in its favour,
where the benchmark did not run it); plain vLLM runs no proposer. Modelled throughput =
tokens emitted / Σ modelled step ms.

A fixed arm's drafts do not depend on time, so one replay prices it on every clock at once
(`TotalClock`); D-cut decides on the clock, so it is replayed once per clock.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

import numpy as np

from rollout_graft.dcut.chains import ChainDCut, FixedDepth

from .chain_replay import ScoreThreshold, SuffixReplay, fake_clock, ours_proposer, replay_rows
from .clocks import ProposerCost

DEPTHS = (1, 2, 3, 4, 6, 8)  # the fixed-depth arms
TAUS = (0.1, 0.3, 0.5)  # the fixed score-threshold arms (chains of at most DCUT_DEPTH tokens)
DCUT_DEPTH = 8


class TotalClock:
    """A StepClock that prices each step on several clocks: returns the first's ms, sums each's (`ms`)."""

    name = "total"

    def __init__(self, clocks: Sequence, proposer_ms: Callable[[int], float] | None = None):
        self.clocks = list(clocks)
        # rows → the proposer's own ms and its helper thread's beside the forward, on clocks without them (None: no proposer)
        self.proposer_ms = proposer_ms
        self.ms = {c.name: 0.0 for c in self.clocks}

    def step_ms(self, drafts, contexts) -> float:
        own, beside = (0.0, 0.0) if self.proposer_ms is None else self.proposer_ms(len(drafts))
        times = []
        for c in self.clocks:
            ms = c.step_ms(drafts, contexts)
            if not getattr(c, "includes_proposer", False):  # a roofline: the proposer's own time, and what its
                ms += own + max(beside - ms, 0.0)  # helper thread counts beside the forward where it outlasts it
            times.append(ms)
        for c, t in zip(self.clocks, times):
            self.ms[c.name] += t
        return times[0]


def batches(rollouts: list[dict], batch: int) -> list[dict]:
    """The recorded rollouts as rollouts of `batch` rows: each split into consecutive chunks (a
    recording's rows are grouped by prompt) or consecutive ones fused (fewer rows where the
    recording has too few)."""
    rows = len(rollouts[0]["prompts"])
    if batch <= rows:
        return [{k: r[k][i : i + batch] for k in ("prompts", "completions")}
                for r in rollouts for i in range(0, len(r["prompts"]), batch)]
    per = batch // rows
    return [{k: [x for r in rollouts[i : i + per] for x in r[k]] for k in ("prompts", "completions")}
            for i in range(0, len(rollouts), per)]


def run_arm(prop, rollouts: list[dict], timed: Sequence[bool], clocks: Sequence,
            cost: tuple[ProposerCost, str] | None = None) -> dict:
    """One proposer through the rollouts in order on the clocks' modelled time (the first clock
    is the one the proposer reads; `cost`: our proposer's own time and its policy kind, added on
    clocks without it: `TotalClock`): {"ms": {clock: Σ ms of the timed rollouts}, "emitted",
    "drafted", "steps", "accepted", and over the timed steps that drafted, the tokens beyond one a
    row the policy predicted ("predicted_gain": D-cut's calibrated acceptance; 0 for a policy that
    predicts none) and those the steps emitted ("gain")}."""
    counted = [0, 0]  # tokens our tables counted since the last call was priced: in the call, beside the forward
    store = getattr(prop, "store", None)
    if cost is not None and store is not None:
        teach = store.teach

        def counting(work, rows=None, beside=False):
            n = sum(max(w[4] - w[3], 0) for w in work)
            if rows is not None:
                n += int(np.maximum(rows.ends - rows.starts, 0).sum())
            counted[int(beside)] += n
            return teach(work, rows, beside)
        store.teach = counting

    def own_ms(rows: int) -> tuple[float, float]:
        """The last call's own time: it drafted, or D-cut decided not to, and counted what it counted;
        and the counting it left to its helper thread, beside the forward (`teach(beside=True)`).
        Its drafting part, its counting excluded, is what the policy measured as drafting
        (`ChainStep.draft_ms`, what a probe costs), read before the next call's `observe`: a clock
        standing still inside `propose` would make probes free."""
        step = getattr(prop, "_pending", None)
        drafted = step is None or step.planned > 0
        ms = cost[0].ms(cost[1], rows, drafted, counted[0])
        beside = cost[0].count_ms(rows, counted[1])
        counted[0] = counted[1] = 0
        if step is not None:
            step.draft_ms = cost[0].ms(cost[1], rows) - cost[0].ms(cost[1], rows, False) if drafted else 0.0
        return ms, beside

    total = TotalClock(clocks, None if cost is None else own_ms)
    out = {"ms": {c.name: 0.0 for c in clocks}, "steps": 0, "emitted": 0, "drafted": 0, "accepted": 0,
           "predicted_gain": 0.0, "gain": 0}
    timing = [False]
    policy = getattr(prop, "policy", None)
    if policy is not None:  # a policy that predicts what its drafting steps emit: the prediction against the outcome
        observe = policy.observe

        def observed(step):
            d = step.decision
            if timing[0] and d is not None and d.kept and d.expected_emitted is not None:
                out["predicted_gain"] += d.expected_emitted - step.rows
                out["gain"] += step.emitted - step.rows
            return observe(step)
        policy.observe = observed
    with fake_clock(modelled=True) as clock:
        for n, r in enumerate(rollouts):
            prop.rollout = n
            timing[0] = timed[n]
            before, counts = dict(total.ms), {"steps": 0, "emitted": 0, "drafted": 0, "accepted": 0}
            replay_rows(prop, r["prompts"], r["completions"], clock=clock, step_ms=total, record=False, counts=counts)
            if timed[n]:
                for key in counts:
                    out[key] += counts[key]
                for name in out["ms"]:
                    out["ms"][name] += total.ms[name] - before[name]
    return out


def fixed_arms(vocab: int, max_len: int) -> dict[str, Callable]:
    """name → a fresh proposer, for every arm whose drafts do not depend on time: plain, ours at
    fixed budgets, and vLLM's suffix decoding at each depth of `DEPTHS` where arctic-inference is
    installed (min_token_prob 0.1, vLLM's default)."""
    def with_policy(k, policy):
        def make():
            prop = ours_proposer(k, None, vocab, max_len)
            prop.policy = policy()
            return prop
        return make
    arms = {"plain": with_policy(1, lambda: FixedDepth(0))}
    arms.update({f"fixed-d{d}": with_policy(d, lambda d=d: FixedDepth(d)) for d in DEPTHS})
    arms.update({f"fixed-tau{t:g}": with_policy(DCUT_DEPTH, lambda t=t: ScoreThreshold(DCUT_DEPTH, t)) for t in TAUS})
    if importlib.util.find_spec("arctic_inference") is not None:
        arms.update({f"suffix-d{d}": (lambda d=d: SuffixReplay(d, 0.1, max_len)) for d in DEPTHS})
    return arms


def own_cost(arm: str, cost: ProposerCost | None) -> tuple[ProposerCost, str] | None:
    """The proposer's own time in `arm` and its kind (None: it runs none — plain vLLM —, suffix
    decoding where `cost` did not measure it, or `cost` is None); `ours-dcut`, started from a
    profile, pays the `dcut-roofline` arm's time where `cost` has it."""
    if cost is None or arm == "plain" or (arm.startswith("suffix") and "suffix" not in cost.drafting):
        return None
    if arm == "ours-dcut":  # started from the clock's profile: what that costs a step where measured
        return cost, "dcut-roofline" if "dcut-roofline" in cost.drafting else "dcut"
    return cost, "dcut" if arm.startswith("ours-dcut") else "suffix" if arm.startswith("suffix") else "fixed"


def dcut_proposer(vocab: int, max_len: int, clock=None, count_beside: bool = True, **dcut_options):
    """A fresh proposer with our D-cut: the product's, and — given `clock` — started from that
    clock's profile as the product starts from a roofline on a GPU it knows (`use_profile`: at the
    running rows' mean context), with `dcut_options` (`ChainDCut` settings); `count_beside`: its own."""
    prop = ours_proposer(DCUT_DEPTH, None, vocab, max_len)
    prop.count_beside = count_beside
    if clock is not None:
        prop.use_profile(clock)
    if dcut_options:
        prop.policy = ChainDCut(DCUT_DEPTH, profile=prop.policy.profile, **dcut_options)
    return prop


def schedule(rec: dict, regime: str, batch: int) -> tuple[list[dict], list[bool]]:
    """The rollouts of `batch` rows a regime replays, in order, and which of them are timed (`cells`)."""
    rollouts = batches(rec["rollouts"], batch)
    if regime == "grpo":  # one recorded rollout an epoch: the first epoch's chunks untimed
        per = max(len(rollouts) // len(rec["rollouts"]), 1)
        return rollouts, [i >= per for i in range(len(rollouts))]
    if regime == "revisit":
        return [r for r in rollouts for _ in range(2)], [False, True] * len(rollouts)
    return rollouts, [True] * len(rollouts)


def cells(rec: dict, regime: str, batch: int, clocks: Sequence, dcut_options: dict | None = None,
          cost: ProposerCost | None = None, profile_of: Callable | None = None, count_beside: bool = True) -> list[dict]:
    """One cell per clock: every arm's modelled tokens/s, MAT, mean verified depth (draft tokens
    per request-step) and — for D-cut — the tokens its drafting steps earned beyond one a row over
    those it predicted (`run_arm`) on the recording `rec` at `batch` rows, regime "first" (each rollout once),
    "revisit" (each twice in a row, timed the second time: greedy recordings) or "grpo" (a
    recording of GRPO epochs, `lab/record_grpo.py`: every rollout once, in order, the revisits —
    epochs after the first — timed). D-cut twice, each from a fresh
    proposer: `ours-dcut` starting from the clock's profile (`dcut_proposer`), `ours-dcut-online`
    without one (the step time fitted online alone); `dcut_options`: `ChainDCut` settings of the
    profiled one (e.g. {"spread": 0.0}, what DESIGN's "Modelled clocks" compares); `cost`: our
    proposer's own time on clocks that price the forward alone (None: free); `profile_of`: the clock
    whose profile the profiled D-cut starts from, given the cell's (None: the cell's own; a wrong
    one asks how wrong a start profile may be); `count_beside`: our D-cut arms' (`RLDraftProposer`'s,
    the A/B of counting a plain spell's text beside the forward). `suffix-sched`: the
    best `suffix-d*` arm of the cell, the depth a user would pick for this batch size in hindsight
    (vLLM's `num_speculative_tokens_per_batch_size`; one depth for the cell, while a schedule could
    change it as the batch drains)."""
    rollouts, timed = schedule(rec, regime, batch)
    max_len = max(len(p) + len(c) for r in rollouts for p, c in zip(r["prompts"], r["completions"])) + 2 * DCUT_DEPTH + 2
    vocab = rec["vocab"]
    fixed = {name: run_arm(make(), rollouts, timed, clocks, own_cost(name, cost))
             for name, make in fixed_arms(vocab, max_len).items()}
    out = []
    for clock in clocks:
        runs = {**fixed,
                "ours-dcut": run_arm(dcut_proposer(vocab, max_len, profile_of(clock) if profile_of else clock,
                                                   count_beside, **(dcut_options or {})), rollouts, timed, [clock],
                                     own_cost("ours-dcut", cost)),
                "ours-dcut-online": run_arm(dcut_proposer(vocab, max_len, count_beside=count_beside), rollouts,
                                            timed, [clock], own_cost("ours-dcut-online", cost))}
        arms = {n: 1000.0 * r["emitted"] / r["ms"][clock.name] for n, r in runs.items()}
        suffix = [n for n in arms if n.startswith("suffix-d")]
        if suffix:
            arms["suffix-sched"] = max(arms[n] for n in suffix)
        out.append({"clock": clock.name, "regime": regime, "batch": len(rollouts[0]["prompts"]), "arms": arms,
                    "mean_verified_depth": {n: r["drafted"] / max(r["steps"], 1) for n, r in runs.items()},
                    "mat": {n: r["emitted"] / max(r["steps"], 1) for n, r in runs.items()},
                    # D-cut's drafting steps: the accepted tokens they earned over those its calibration predicted
                    "earned_over_predicted": {n: r["gain"] / r["predicted_gain"] for n, r in runs.items()
                                              if r["predicted_gain"] > 0}})
    return out


def meets(arms: dict, arm: str) -> bool:
    """The issue's bar for `arm` in a cell's arms: ≥ 0.95× the best fixed arm and ≥ 0.99× plain, or
    ≥ 0.99× plain alone where no fixed arm beats plain."""
    best = max(v for n, v in arms.items() if n.startswith("fixed-"))
    bar = max(0.95 * best, 0.99 * arms["plain"]) if best > arms["plain"] else 0.99 * arms["plain"]
    return bool(arms[arm] >= bar - 1e-9)


def verdict(cell: dict) -> dict:
    """ours-dcut against the best fixed arm and plain in one cell (`meets`) and against the best
    suffix arm where there are any (`vs_suffix`: ≥ 1 beats every one)."""
    arms = cell["arms"]
    fixed = {n: v for n, v in arms.items() if n.startswith("fixed-")}
    best = max(fixed, key=fixed.get)
    ours, plain = arms["ours-dcut"], arms["plain"]
    out = {"best_fixed": best, "vs_best": ours / fixed[best], "vs_plain": ours / plain, "meets": meets(arms, "ours-dcut")}
    if "suffix-sched" in arms:
        out["vs_suffix"] = ours / arms["suffix-sched"]
    return out
