#!/usr/bin/env python
"""Micro-benchmark of `RLDraftProposer`'s own time per vLLM step (no vLLM engine, no model).

    python lab/profile_vllm_proposer.py --compare --cells 64:256 256:256 1024:256 256:1024 --repeats 5 --json out.json
    python lab/profile_vllm_proposer.py --batches 8 64 256 --json out.json [--cprofile 256]
    python lab/profile_vllm_proposer.py --prior-memory 400000   # bytes per context of the prior

`--compare` (what RESULTS shows): like for like, ours (fixed depth, its A/A twin, D-cut), vLLM's
`NgramProposer` and, where arctic-inference is installed, its `SuffixDecodingProposer` on the same
persistent batch (`window`: rows arriving with BATCH:CONTEXT tokens, then `--steps` timed calls as
they emit, leave and condense), interleaved repeat by repeat, timed by the wall clock (ours counts and
walks the prior in a helper thread beside the groups: its time is on the step's critical path, which
the calling thread's CPU time would leave out; medians resist the shared machine's stalls).
Without it, whole synthetic rollouts through ours alone:

Drives the real proposer with persistent-batch arrays shaped as vLLM's `custom_class` call passes
them (`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`: int32 `token_ids_cpu`
[max_num_reqs, max_model_len] written in place, `num_tokens_no_spec` [max_num_reqs], one list of
sampled tokens per row, `[]` for empty slots). Each batch is batch/8 GRPO groups of 8 samples
(prompts of 64 tokens), completions growing to 256 tokens. A synthetic "target" fixes every row's
completion in advance (siblings read their group's template of repeated phrases, each from a
shift of its own, with 10 % of tokens changed), so a draft is accepted up to its first token that
differs from that completion, plus the step's own token, as vLLM's rejection sampler does with a
greedy target. Finished rows leave and vLLM's condense moves the last rows into their slots. The
step time the budget policy sees comes from a fake clock (`--step-ms`: a + b·rows + c·draft
tokens, plus the proposer's own real time, which a vLLM step includes), so D-cut decides nearly
the same way every run; the proposer's own time is measured with the real clock.

Reports, per policy (`fixed`: every chain verified; `dcut`: the default; `plain`: never drafts) and batch size, the median
microseconds per `propose` call over the steps with a full batch, and microseconds per
request-step (all steps), split into tracker (`RequestTracker.rows`), learn (what the last drafts
and the shadows earned, policy calls excluded), drafting — count (`NgramStore.teach`: the new text
counted) and walk (`NgramStore.chain_arrays`: the chains) —, policy (`self.policy.*` calls) and the
rest of `propose`; and, part of the counting, the hash tables' rebuilds (a long run pays them as
tables grow, the prior's above all; `--compare`'s windows, each a fresh proposer, leave them out),
the prior's starts over past its bound (emptied in place) counted with them, and the tables' MB at
the end.
This measures the proposer's own time only, not end-to-end speed.

The persistent-batch replay itself is `rollout_graft_tools.chain_replay` (shared with `lab/replay.py vllm`
and tests/test_vllm_units.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import statistics
import time

import numpy as np

from rollout_graft.dcut.chains import FixedDepth
from rollout_graft_tools.benchmark import cpu_info
from rollout_graft_tools.chain_replay import PROMPT, VOCAB, fake_clock, replay, vllm_config


class Parts:
    """Real time spent in the proposer's parts (wrapping its bound methods on the instance)."""

    NAMES = ("tracker", "learn", "count", "walk", "policy")

    def __init__(self, proposer, clock=time.perf_counter):
        self.clock = clock
        self.t = dict.fromkeys(self.NAMES, 0.0)
        self.policy_in_learn = 0.0
        self._in_learn = False
        self.running = True  # False: calls are not timed (the counting a window settles after its timed calls)
        for name in ("rows", "defer"):  # the request tracking, quiet or not
            setattr(proposer.tracker, name, self._wrap(getattr(proposer.tracker, name), "tracker"))
        proposer.store.teach = self._wrap(proposer.store.teach, "count")  # counting the new text (drafting's first part)
        proposer.store.chain_arrays = self._wrap(proposer.store.chain_arrays, "walk")  # the chains' walks (its second)
        proposer._learn = self._wrap(proposer._learn, "learn", learn=True)  # what the drafts and shadows earned
        proposer._resolve_shadows = self._wrap(proposer._resolve_shadows, "learn", learn=True)
        for name in ("plan", "cut", "observe"):
            setattr(proposer.policy, name, self._wrap(getattr(proposer.policy, name), "policy"))

    def _wrap(self, fn, part, learn=False):
        def timed(*args, **kwargs):
            if learn:
                self._in_learn = True
            t = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = (self.clock() - t) if self.running else 0.0
                self.t[part] += dt
                if learn:
                    self._in_learn = False
                elif part == "policy" and self._in_learn:
                    self.policy_in_learn += dt
        return timed

    def reset(self) -> None:
        self.t = dict.fromkeys(self.NAMES, 0.0)
        self.policy_in_learn = 0.0

    def seconds(self) -> dict[str, float]:
        out = dict(self.t)
        out["learn"] -= self.policy_in_learn
        return out


class NeverDraft(FixedDepth):
    """`--policies plain`: every decision is K = 0 and no probe comes (the floor of the proposer's
    own work while D-cut decodes plainly: rows found, texts extended; counting waits for a draft)."""

    def plan(self, rows: int) -> int:
        return 0


def run(batch: int, policy: str, k: int, length: int, repeats: int, step_ms, profile: bool = False) -> dict:
    from rollout_graft.vllm import proposer as module
    from rollout_graft.vllm.config import ChainConfig

    cls = type("Bench", (module.RLDraftProposer,), {"config": ChainConfig(budget_policy="fixed" if policy == "plain" else policy)})
    prop = cls(vllm_config(k, PROMPT + length + 2 * k + 8))
    if policy == "plain":
        prop.policy = NeverDraft(k)
    rebuilds = [0.0]  # seconds in the hash tables' rebuilds and the prior's starts over (in the counting, either thread)

    def timed(method):
        def wrapped(*args, **kwargs):
            t = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                rebuilds[0] += time.perf_counter() - t
        return wrapped
    prop.store._reserve, prop.store._bound = timed(prop.store._reserve), timed(prop.store._bound)  # _bound: starts over
    with fake_clock() as clock:  # the step time the policy sees
        replay(prop, batch, length=length, seed=10_000 + batch, clock=clock, step_ms=step_ms, record=False)  # warm-up
        parts = Parts(prop)
        rebuilds[0] = 0.0
        full, rows_total, total = [], 0, 0.0

        def on_call(rows, s):
            nonlocal rows_total, total
            rows_total += rows
            total += s
            if rows == batch:
                full.append(s)

        stats0 = dict(vars(prop.stats))
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
        for rep in range(repeats):
            replay(prop, batch, length=length, seed=rep, clock=clock, step_ms=step_ms, on_call=on_call, record=False)
        if profile:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    sec = parts.seconds()
    per_req = {name: 1e6 * s / rows_total for name, s in sec.items()}
    per_req["other"] = 1e6 * total / rows_total - sum(per_req.values())
    st = vars(prop.stats)
    d = {key: st[key] - stats0[key] for key in ("rows", "draft_tokens", "accepted_tokens", "kept_tokens")}
    return {"batch": batch, "policy": policy, "k": k, "calls_full": len(full),
            "us_per_call_median": 1e6 * statistics.median(full) if full else float("nan"),
            "us_per_request_step": 1e6 * total / rows_total,
            "parts_us_per_request_step": per_req,
            # the tables' rebuilds and the prior's starts over (part of `count`): growing tables rehash
            # every live key; a long run pays them, the --compare windows (a fresh proposer each) do not
            "rebuild_us_per_request_step": 1e6 * rebuilds[0] / rows_total, "tables_mb": prop.store.nbytes() / 1e6,
            "prior_starts_over": prop.store.resets.get(prop.prior, 0),  # past its bound, warm-up included
            "drafted_per_row": d["draft_tokens"] / max(d["rows"], 1),
            "mat": 1 + d["accepted_tokens"] / max(d["rows"], 1)}


def prior_memory(tokens: int, seed: int = 0) -> dict:
    """Host bytes per context of a prior that counted `tokens` completion tokens (phrases of 3-10
    tokens from a bank of 2000, so contexts repeat): the store's two hash tables over the contexts
    held (`config.MAX_PRIOR_CONTEXTS`' bound)."""
    from rollout_graft.vllm.ngrams import NgramStore

    rng = np.random.default_rng(seed)
    bank = [rng.integers(1, VOCAB, int(rng.integers(3, 11))) for _ in range(2000)]
    text = np.concatenate([bank[i] for i in rng.integers(0, len(bank), tokens // 3)])[:tokens].tolist()
    store = NgramStore(4)
    prior = store.slot()
    for start in range(0, len(text), 1000):  # a step's worth of text at a time, as a proposer counts it
        store.teach([(prior, -1, text, start, min(start + 1000, len(text)))])
    contexts = int(store.sizes[prior])
    return {"tokens": len(text), "contexts": contexts, "bytes": int(store.nbytes()),
            "bytes_per_context": store.nbytes() / max(contexts, 1)}


# ---------------------------------------------------------------------- like for like: ours against vLLM's n-gram
class NgramArm:
    """vLLM's `NgramProposer` (prompt lookup, numba) behind our `propose` call's signature, built as
    `vllm_speculative_config("ngram")` builds it (contexts of 1…4 tokens); vLLM runs its numba loop
    on one thread (`num_numba_thread_available = min(1, cpus // 2)`)."""

    def __init__(self, k: int, max_len: int, max_rows: int):
        from types import SimpleNamespace

        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        from rollout_graft.vllm.methods import PROMPT_LOOKUP_MAX, PROMPT_LOOKUP_MIN

        spec = SimpleNamespace(prompt_lookup_min=PROMPT_LOOKUP_MIN, prompt_lookup_max=PROMPT_LOOKUP_MAX,
                               num_speculative_tokens=k)
        self.inner = NgramProposer(SimpleNamespace(
            speculative_config=spec, model_config=SimpleNamespace(max_model_len=max_len),
            scheduler_config=SimpleNamespace(max_num_seqs=max_rows), parallel_config=SimpleNamespace(tensor_parallel_size=1)))
        self.k, self.max_model_len = k, max_len

    def propose(self, sampled, num, token_ids, slot_mappings=None):
        return self.inner.propose(self.k, sampled, num, token_ids)


ARMS = ["fixed", "fixed-twin", "dcut", "dcut-roofline", "dcut-plain", "dcut-plain-roofline", "ngram"] + (
    ["suffix"] if importlib.util.find_spec("arctic_inference") is not None else [])
REMAINING = 512
"""`--compare`'s windows: each row's completion ends uniformly within this many tokens of its arrival,
so at MAT m about m / 512 of the batch leaves a call (0.6 % at MAT 3), as in a GRPO rollout whose
completions run that long and whose batch drains over the rollout. Rows ending within 32 tokens
(`--remaining 32`) left ten times as often: our proposer does per-request work when a row leaves (its
text handed to the tables' backlog, its shadow resolved from the texts kept), vLLM's n-gram
proposer none, and that work weighed on every figure of ours (at 256 rows a fixed depth's
tracker 3.2 against 1.0 µs a request-step, in one scratch run)."""
PLAIN_PAYS = (5.0, 0.01, 5.0)  # `dcut-plain`'s modelled step: a draft token costs 5 ms, so D-cut decides to decode plainly
FLAT = (5.0, 0.01, 0.0)  # `dcut-roofline`'s: flat in draft tokens, as its memory-bound roofline is, so it drafts


def make_arm(arm: str, k: int, max_len: int, max_rows: int):
    """A fresh proposer of `arm`: fixed / fixed-twin / fixed-1thread and fixed-2threads (not in
    `ARMS`: the prior counted and walked in the calling thread / in the helper thread at every size,
    the A/B that sets `ngrams.PARALLEL_ROWS`) / fixed-noprior (not in `ARMS`: no prior, the groups'
    part alone) / dcut-plain-twin and dcut-plain-every (not in `ARMS`: dcut-plain's A/A twin, and
    dcut-plain handing the text waiting to the helper thread at every call once `BESIDE_TOKENS` wait,
    not in batches of `beside_batch`: the A/B that sets `proposer.BESIDE_BATCH`) / dcut-plain-incall
    (not in `ARMS`: dcut-plain counting the text its plain spells
    defer by its next draft, not beside the forward) / dcut / dcut-roofline (D-cut started from a
    roofline, as the proposer starts on a GPU with a preset: its profile's evaluations and the
    drained-batch rate each step; the roofline's peak so high that every step is memory-bound, flat
    in draft tokens as `FLAT`, so it drafts at every batch size) / dcut-plain-roofline (D-cut
    started from the H20's roofline for Qwen3-8B, compute-bound at these batches: it decides not to
    draft from its profile, as on a GPU where drafting cannot pay, each quiet call reading the
    profile) / dcut-plain (ours), ngram or
    suffix (vLLM's; suffix decoding as `lab/replay.py vllm clocks` runs it: arctic-inference)."""
    if arm == "ngram":
        return NgramArm(k, max_len, max_rows)
    if arm == "suffix":
        from rollout_graft_tools.chain_replay import SuffixReplay

        return SuffixReplay(k, 0.1, max_len)
    from rollout_graft.vllm.config import ChainConfig
    from rollout_graft.vllm.proposer import BESIDE_TOKENS, RLDraftProposer

    policy = "dcut" if arm.startswith("dcut") else "fixed"
    attrs = {"config": ChainConfig(budget_policy=policy, use_prior=arm != "fixed-noprior"),
             "count_beside": arm != "dcut-plain-incall"}
    if arm == "dcut-plain-every":  # handing over at every call once BESIDE_TOKENS wait
        attrs["beside_batch"] = BESIDE_TOKENS
    prop = type("Bench", (RLDraftProposer,), attrs)(vllm_config(k, max_len))
    if arm in ("fixed-1thread", "fixed-2threads"):  # the prior's part in the calling thread / the helper at every size
        prop.store.parallel_rows = 1 << 62 if arm == "fixed-1thread" else 0  # (the product: `ngrams.PARALLEL_ROWS`)
    if arm == "dcut-roofline":  # as on a GPU with a preset: D-cut started from a roofline (`load_model`)
        from rollout_graft_tools.clocks import MODELS, Accelerator, Roofline

        prop.use_profile(Roofline(Accelerator("memory-bound", 1e6, 4.8), MODELS["Qwen3-8B"]))
    if arm == "dcut-plain-roofline":  # as on an H20 with Qwen3-8B: its roofline, compute-bound, prices drafting out
        from rollout_graft_tools.clocks import ACCELERATORS, MODELS, Roofline

        prop.use_profile(Roofline(ACCELERATORS["H20"], MODELS["Qwen3-8B"]))
    return prop


def window(prop, batch: int, context: int, steps: int, k: int, seed: int, step_ms, clock, ids, parts=None,
           gap_ms: float = 0.0, remaining: int = REMAINING) -> dict:
    """`steps` timed calls of one persistent batch: `batch` rows in GRPO groups of 8 (prompts of 64
    tokens, siblings reading their group's template: `chain_replay.completions`), each arriving with
    `context` tokens (prompt + completion so far; the arrival call is not timed) and emitting a
    completion of its own remaining length (uniform over steps…`remaining` tokens): rows leave as they
    finish (reported finished with the next call, as vLLM's scheduler does) and vLLM's condense moves
    the last rows into their slots (`REMAINING`: at what rate). A draft is accepted up to its first token
    that differs from the row's completion, plus the step's own token. `gap_ms`: real time between
    calls, spent waiting in a loop that releases the GIL, as a host thread waits for a GPU's forward
    (ours counts the text a spell of plain decisions defers in its helper thread then; a plain spin
    would hold the GIL for Python's switch interval, 5 ms)."""
    from rollout_graft_tools.chain_replay import SPARE_ROWS, _condense, completions

    rng = np.random.default_rng(seed)
    start = context - PROMPT
    if remaining <= steps:
        raise ValueError(f"remaining ({remaining}) must exceed steps ({steps}): rows end after the window's calls")
    prompts, outs = completions(rng, batch, 8, start + remaining)
    ends = start + rng.integers(steps, remaining, batch)
    token_ids = np.zeros((batch + SPARE_ROWS, prop.max_model_len), dtype=np.int32)
    num = np.zeros(batch + SPARE_ROWS, dtype=np.int32)
    for r in range(batch):
        token_ids[r, :PROMPT], token_ids[r, PROMPT:context] = prompts[r], outs[r][:start]
        num[r] = context
    slots, done = list(range(batch)), [start] * batch
    sampled = [[int(outs[r][start - 1])] for r in slots]
    rid = [f"{next(ids)}" for _ in range(batch)]
    calls, per_call, rows, emitted, drafted, finished, drafts = [], [], 0, 0, 0, [], {}
    for step in range(steps + 1):
        gone = [rid[slots[i]] for i in finished]  # vLLM reports them finished with the next step
        if finished:
            slots, sampled = _condense(slots, sampled, finished, token_ids, num)
        if not slots:
            break
        if clock is not None:
            clock.now += (step_ms[0] + step_ms[1] * len(slots) + step_ms[2] * sum(len(drafts.get(r, ())) for r in slots)) / 1000.0
        if hasattr(prop, "set_requests"):
            prop.set_requests([rid[r] for r in slots], [PROMPT] * len(slots), finished=gone)
        rows_in = sampled + [[] for _ in range(len(sampled), batch + SPARE_ROWS)]
        until = time.perf_counter() + gap_ms / 1000.0
        while time.perf_counter() < until:  # waiting without the GIL, as a host thread waits on a GPU
            time.sleep(0)
        t = time.perf_counter()  # the wall clock: our helper thread's time is on the critical path too
        got = clock.call(prop.propose, rows_in, num, token_ids) if clock is not None else prop.propose(rows_in, num, token_ids)
        dt = time.perf_counter() - t
        if step:  # the arrival call (every row new) is not timed
            calls.append(dt)
            rows += len(slots)
            per_call.append(len(slots))
        else:
            settle(prop)  # the arrival's texts counted now (a proposer that did not draft defers it), untimed
            if parts is not None:
                parts.reset()
        drafts = {r: list(got[i]) for i, r in enumerate(slots)}
        finished, sampled = [], []
        for i, r in enumerate(slots):
            pos, truth, d = done[r], outs[r], drafts[r]
            a = 0
            while a < len(d) and pos + a < ends[r] - 1 and d[a] == truth[pos + a]:
                a += 1
            new = [int(x) for x in truth[pos : pos + a + 1]]
            token_ids[i, num[i] : num[i] + len(new)] = new
            num[i] += len(new)
            done[r] += len(new)
            sampled.append(new)
            if step:
                emitted, drafted = emitted + len(new), drafted + len(d)
            if done[r] >= ends[r]:
                finished.append(i)
    if parts is not None:
        parts.running = False
    t = time.perf_counter()
    settle(prop)  # what the timed calls left to count (D-cut deciding not to draft defers it to its next draft)
    return {"calls": calls, "rows_per_call": per_call, "rows": rows, "emitted": emitted, "drafted": drafted,
            "settle": time.perf_counter() - t}


def settle(prop) -> None:
    """Count every text our proposer has not counted yet (nothing for vLLM's)."""
    if hasattr(prop, "tracker"):
        prop.tracker.count()


def compare(cells, arms, k: int, steps: int, repeats: int, step_ms, on_cell=None, gap_ms: float = 0.0,
            remaining: int = REMAINING) -> list[dict]:
    """Every arm on the same batches (the same seed per repeat), interleaved repeat by repeat; per
    arm the median over repeats of each window's median µs per call and per request-step (a call's
    time over its rows: the median resists the stalls of a shared machine), MAT over all, and our
    parts (mean µs per request-step: they sum to the mean)."""
    import gc

    from rollout_graft_tools.chain_replay import fake_clock

    ids, out = itertools.count(), []
    for batch, context in cells:
        max_len = context + remaining + 2 * k + 8
        got = {arm: [] for arm in arms}
        mb: dict[str, list[float]] = {}  # ours: MB of its hash tables after the window
        parts = {arm: None for arm in arms}
        for rep in range(repeats + 1):  # repeat 0 warms up (numba's caches, allocation)
            for arm in arms:
                prop = make_arm(arm, k, max_len, batch + 8)
                p = Parts(prop, time.perf_counter) if hasattr(prop, "tracker") else None  # ours: its parts
                with fake_clock() as clock:
                    plain = arm.startswith("dcut-plain")
                    clock_ms = PLAIN_PAYS if plain else FLAT if arm == "dcut-roofline" else step_ms
                    for learn in range(3 if plain else 0):  # it learns that drafting does not pay
                        window(prop, batch, context, steps, k, 1000 * rep + batch + 100 * learn + 1, clock_ms, clock, ids,
                               remaining=remaining)
                    w = window(prop, batch, context, steps, k, 1000 * rep + batch, clock_ms,
                               clock if arm.startswith("dcut") else None, ids, p, gap_ms, remaining)
                sec = p.seconds() if p is not None else None
                if p is not None and rep:
                    mb.setdefault(arm, []).append(prop.store.nbytes() / 1e6)
                del prop, p  # its tables (GBs at 1,024 long rows) go before the next arm builds its own
                gc.collect()
                if rep:
                    got[arm].append(w)
                    if sec is not None:
                        parts[arm] = {n: (parts[arm] or {}).get(n, 0.0) + 1e6 * s / w["rows"] / repeats for n, s in sec.items()}
        for arm in arms:
            ws = got[arm]
            per_req = [1e6 * statistics.median(c / n for c, n in zip(w["calls"], w["rows_per_call"])) for w in ws]
            r = {"batch": batch, "context": context, "arm": arm, "k": k, "steps": steps, "repeats": repeats, "gap_ms": gap_ms,
                 "remaining": remaining,
                 "us_per_call_median": statistics.median(1e6 * statistics.median(w["calls"]) for w in ws),
                 "us_per_request_step_median": statistics.median(per_req), "us_per_request_step": per_req,
                 "us_per_request_step_mean": 1e6 * sum(sum(w["calls"]) for w in ws) / sum(w["rows"] for w in ws),
                 # the mean with the counting the calls left undone (`settle`): what a D-cut that decodes plainly costs
                 "us_per_request_step_settled": 1e6 * sum(sum(w["calls"]) + w["settle"] for w in ws) / sum(w["rows"] for w in ws),
                 "rows_per_call": sum(w["rows"] for w in ws) / sum(len(w["calls"]) for w in ws),
                 "mat": sum(w["emitted"] for w in ws) / sum(w["rows"] for w in ws),
                 "drafted_per_row": sum(w["drafted"] for w in ws) / sum(w["rows"] for w in ws)}
            if arm in mb:
                r["tables_mb"] = statistics.median(mb[arm])
            if parts[arm] is not None:
                r["parts_us_per_request_step"] = {**parts[arm], "other": r["us_per_request_step_mean"] - sum(parts[arm].values())}
            out.append(r)
            if on_cell is not None:
                on_cell(out)
            print(f"{arm:>10} {batch:>5} {context:>5} {r['us_per_call_median']:>9.0f} {r['us_per_request_step_median']:>7.2f}"
                  f" {r['mat']:>5.2f} {r['drafted_per_row']:>5.2f} "
                  + " ".join(f"{n}={v:.2f}" for n, v in r.get("parts_us_per_request_step", {}).items()), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", action="store_true",
                    help="like for like: ours (fixed, its A/A twin, dcut) and vLLM's NgramProposer on one persistent batch")
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024], help="--compare: tokens per row on arrival")
    ap.add_argument("--cells", nargs="+", metavar="BATCH:CONTEXT", help="--compare: these pairs (else --batches × --contexts)")
    ap.add_argument("--steps", type=int, default=8, help="--compare: timed calls per window")
    ap.add_argument("--remaining", type=int, default=REMAINING, help="--compare: a row's completion beyond its "
                    f"arrival is uniform over steps…this many tokens, so rows leave at a GRPO rollout's rate (default {REMAINING})")
    ap.add_argument("--gap-ms", type=float, default=0.0, help="--compare: real time between calls, waited in a loop "
                    "as a host thread waits for a GPU's forward (0: calls back to back)")
    ap.add_argument("--arms", nargs="+", default=ARMS, help="dcut-plain: D-cut where a draft token costs 5 ms, so it "
                    "decides to decode plainly (after three untimed windows to learn that): what its plain decisions "
                    "cost; dcut-plain-roofline: the same started from a GPU's roofline (the H20's for Qwen3-8B), as "
                    "on a GPU where drafting cannot pay; suffix: vLLM's suffix decoding (the default where "
                    "arctic-inference is installed); not by default: "
                    "fixed-1thread / fixed-2threads (the prior's part in the calling thread / the helper thread at every "
                    "size: the A/B that sets ngrams.PARALLEL_ROWS), "
                    "fixed-noprior (no prior: the groups' part alone), dcut-plain-incall (dcut-plain counting what it defers "
                    "by its next draft, not beside the forward), dcut-plain-twin / dcut-plain-every (its A/A twin / "
                    "handing what waits to the helper thread at every call: the A/B that sets proposer.BESIDE_BATCH)")
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--policies", nargs="+", default=["fixed", "dcut"], choices=["fixed", "dcut", "plain"])
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--length", type=int, default=256, help="completion tokens per request")
    ap.add_argument("--repeats", type=int, default=2, help="measured rollouts (--compare: windows) per setting (after one warm-up)")
    ap.add_argument("--step-ms", type=float, nargs=3, default=[5.0, 0.01, 0.02],
                    help="fake vLLM step time: a + b·rows + c·draft tokens (ms)")
    ap.add_argument("--cprofile", type=int, nargs="*", default=[], help="batch sizes to print a cProfile of")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--prior-memory", type=int, metavar="TOKENS",
                    help="instead: host bytes per context of a prior that counted this many tokens")
    args = ap.parse_args()
    if args.prior_memory:
        print(json.dumps(prior_memory(args.prior_memory)))
        return
    import torch

    torch.set_num_threads(1)
    if args.compare:
        cells = [tuple(map(int, c.split(":"))) for c in args.cells] if args.cells else list(
            itertools.product(args.batches, args.contexts))
        import sys

        def write(results):  # after every cell: a long run interrupted keeps what it measured
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"command": "python " + " ".join(sys.argv), "args": vars(args), "cpu": cpu_info(),
                               "results": results}, f, indent=1)

        compare(cells, args.arms, args.k, args.steps, args.repeats, tuple(args.step_ms), write, args.gap_ms, args.remaining)
        return
    results = []
    print(f"{'policy':>6} {'batch':>5} {'us/call':>9} {'us/req':>7} | "
          + " ".join(f"{n:>7}" for n in (*Parts.NAMES, "other")) + " | rebuild tables_MB | drafted/row   MAT")
    for policy in args.policies:
        for batch in args.batches:
            r = run(batch, policy, args.k, args.length, args.repeats, tuple(args.step_ms), batch in args.cprofile)
            results.append(r)
            p = r["parts_us_per_request_step"]
            print(f"{policy:>6} {batch:>5} {r['us_per_call_median']:>9.0f} {r['us_per_request_step']:>7.1f} | "
                  + " ".join(f"{p[n]:>7.1f}" for n in (*Parts.NAMES, "other"))
                  + f" | {r['rebuild_us_per_request_step']:>7.1f} {r['tables_mb']:>9.0f}"
                  + f" | {r['drafted_per_row']:>11.2f} {r['mat']:>5.2f}", flush=True)
    if args.json:
        import os
        import sys

        with open(args.json, "w") as f:
            json.dump({"command": "python " + " ".join(sys.argv), "args": vars(args), "cpu": cpu_info(),
                       "numpy_madvise_hugepage": os.environ.get("NUMPY_MADVISE_HUGEPAGE", "numpy's default (on)"),
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
