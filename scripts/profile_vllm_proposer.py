#!/usr/bin/env python
"""Micro-benchmark of `RLDraftProposer`'s own CPU time per vLLM step (no vLLM engine, no model).

    python scripts/profile_vllm_proposer.py --batches 8 64 256 --json out.json [--cprofile 256]
    python scripts/profile_vllm_proposer.py --prior-memory 400000   # bytes per context of the prior

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
request-step (all steps), split into tracker (`RequestTracker.rows`), learn (acceptance counters,
policy calls excluded), drafting (`_draft`: counting the new text, then the chains), policy (`self.policy.*` calls) and
the rest of `propose`. This measures the proposer's CPU time only, not end-to-end speed.

`replay(...)` is reused by tests/test_vllm_units.py to check that drafts stay the same tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import numpy as np

from rollout_graft.budget import FixedBudget

PROMPT = 64
VOCAB = 32000
SPARE_ROWS = 8  # vLLM's max_num_reqs exceeds the running batch


def vllm_config(k: int, max_model_len: int, vocab: int = VOCAB):
    """The two parts of vLLM's config the proposer reads."""
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: vocab))


class FakeClock:
    """`time` stand-in for the proposer module: vLLM's modelled step time, advanced by the driver,
    plus the real time spent inside `propose` (`call`). The proposer's own time is part of a vLLM
    step, and its drafting time prices D-cut's probes: a clock that stood still inside `propose`
    made probes free, so D-cut probed every step here while it decoded plainly."""

    def __init__(self):
        self.now = 0.0
        self._start: float | None = None  # real time at the start of the running call

    def perf_counter(self) -> float:
        return self.now + (time.perf_counter() - self._start if self._start is not None else 0.0)

    def call(self, fn, *args):
        """fn(*args) with this clock running in real time."""
        self._start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.now += time.perf_counter() - self._start
            self._start = None


def completions(rng: np.random.Generator, batch: int, group: int, length: int, noise: float = 0.1,
                phrases: int = 24) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Prompts and the completion each row will emit. A group's template strings together phrases
    (3-10 tokens) of a bank of its own, so n-grams repeat; each sibling reads the template from a
    shift of its own (siblings are at different places of it) with `noise` of its tokens changed."""
    prompts, outs = [], []
    for g in range(batch // group):
        bank = [rng.integers(1, VOCAB, int(rng.integers(3, 11))) for _ in range(phrases)]
        template = np.concatenate([bank[i] for i in rng.integers(0, phrases, length)])[:length]
        prompt = np.concatenate([rng.integers(1, VOCAB, PROMPT // 2)] + bank)[:PROMPT]
        for _ in range(group):
            out = np.roll(template, -int(rng.integers(0, length)))
            change = rng.random(length) < noise
            out[change] = rng.integers(1, VOCAB, int(change.sum()))
            prompts.append(prompt)
            outs.append(out)
    return prompts, outs


def replay(proposer, batch: int, group: int = 8, length: int = 256, seed: int = 0, clock: FakeClock | None = None,
           step_ms=(5.0, 0.01, 0.02), preempt_every: int = 0, on_call=None, record: bool = True) -> list[list[list[int]]]:
    """One rollout of `batch` synthetic rows (`completions`) through `proposer.propose`: `replay_rows`."""
    prompts, outs = completions(np.random.default_rng(seed), batch, group, length)
    return replay_rows(proposer, prompts, outs, clock=clock, step_ms=step_ms, preempt_every=preempt_every,
                       on_call=on_call, record=record)


def replay_rows(proposer, prompts: list, outs: list, clock: FakeClock | None = None, step_ms=(5.0, 0.01, 0.02),
                preempt_every: int = 0, on_call=None, record: bool = True, counts: dict | None = None) -> list[list[list[int]]]:
    """One rollout through `proposer.propose`, as vLLM's persistent batch calls it: request r has
    prompt `prompts[r]` and emits `outs[r]` (then finishes). Returns the drafts of every call
    (record=False: none kept; keeping them makes the garbage collector's full passes, which then
    land in the timed calls, grow with the run). A draft is accepted up to its first token that
    differs from the request's completion, plus one token: with drafts that carry no probabilities
    this is exactly what vLLM's rejection sampler accepts on the run that emitted those tokens, so
    replaying recorded plain samples gives acceptance distributed as in vLLM (`replay_vllm.py`).
    on_call(rows, seconds) is told each call's active rows and real time. preempt_every: every
    n-th step, the request in the first row is preempted (leaves) and comes back one step later in
    the last row, recomputed. counts (optional dict): request-steps, emitted, drafted and accepted
    tokens are added to it (the prefill step counts: MAT = emitted / (emitted − accepted), as
    `bench_vllm.py` counts). A proposer with `set_requests(ids, prompt_lengths)` is told each call's
    request per row (vLLM's own proposers read them from its input batch; ours finds them itself)."""
    batch = len(prompts)
    plen = [len(p) for p in prompts]
    max_len = proposer.max_model_len
    token_ids = np.zeros((batch + SPARE_ROWS, max_len), dtype=np.int32)
    num = np.zeros(batch + SPARE_ROWS, dtype=np.int32)
    slots: list[int] = list(range(batch))  # slot → request index (the running batch, condensed)
    done = [0] * batch  # completion tokens emitted per request
    drafts: dict[int, list[int]] = {}
    tally = {"steps": 0, "emitted": 0, "drafted": 0, "accepted": 0} if counts is None else counts
    for r, p in enumerate(prompts):
        token_ids[r, : plen[r]] = p
        num[r] = plen[r]
    sampled: list[list[int]] = []
    for i, r in enumerate(slots):  # the prefill step samples one token per row
        sampled.append([int(outs[r][0])])
        token_ids[i, plen[r]] = outs[r][0]
        num[i] += 1
        done[r] = 1
    tally["steps"] += len(slots)
    tally["emitted"] += len(slots)
    history, parked, step = [], None, 0
    finished = [i for i, r in enumerate(slots) if done[r] >= len(outs[r])]
    while True:
        if finished:
            slots, sampled = _condense(slots, sampled, finished, token_ids, num)
        if not slots:
            break
        if clock is not None:
            rows, drafted = len(slots), sum(len(drafts.get(r, ())) for r in slots)
            clock.now += (step_ms[0] + step_ms[1] * rows + step_ms[2] * drafted) / 1000.0
        if hasattr(proposer, "set_requests"):
            proposer.set_requests(list(slots), [plen[r] for r in slots])
        t = time.perf_counter()
        rows_in = sampled + [[] for _ in range(len(sampled), batch + SPARE_ROWS)]
        got = (clock.call(proposer.propose, rows_in, num, token_ids) if clock is not None
               else proposer.propose(rows_in, num, token_ids))
        if on_call is not None:
            on_call(len(slots), time.perf_counter() - t)
        if record:
            history.append([list(d) for d in got[: len(slots)]])
        drafts = {r: list(got[i]) for i, r in enumerate(slots)}
        step += 1
        # the target verifies: a draft is accepted up to its first wrong token, plus one token
        finished = []
        sampled = []
        for i, r in enumerate(slots):
            pos, truth, d = done[r], outs[r], drafts[r]
            a = 0
            while a < len(d) and pos + a < len(truth) - 1 and d[a] == truth[pos + a]:
                a += 1
            new = [int(x) for x in truth[pos : pos + a + 1]]
            n0 = int(num[i])
            token_ids[i, n0 : n0 + len(new)] = new
            num[i] = n0 + len(new)
            done[r] += len(new)
            sampled.append(new)
            tally["steps"] += 1
            tally["emitted"] += len(new)
            tally["drafted"] += len(d)
            tally["accepted"] += len(new) - 1
            if done[r] >= len(truth):
                finished.append(i)
        if parked is not None:  # the preempted request comes back, recomputed, at the end
            r, row = parked
            slots.append(r)
            n = plen[r] + done[r]
            token_ids[len(slots) - 1, :n] = row[:n]
            token_ids[len(slots) - 1, n] = outs[r][done[r]]
            num[len(slots) - 1] = n + 1
            done[r] += 1
            sampled.append([int(outs[r][done[r] - 1])])
            if done[r] >= len(outs[r]):
                finished.append(len(slots) - 1)
            parked = None
        if preempt_every and step % preempt_every == 0 and len(slots) > 1 and 0 not in finished:
            parked = (slots[0], token_ids[0].copy())
            done[slots[0]] -= len(sampled[0])  # its last step's tokens are recomputed on return
            finished.append(0)
    return history


def _condense(slots: list[int], sampled: list[list[int]], finished: list[int], token_ids: np.ndarray,
              num: np.ndarray) -> tuple[list[int], list[list[int]]]:
    """Finished rows leave; the last rows move into the emptied slots, lowest first (vLLM's
    InputBatch.condense). token_ids and num are rewritten in place."""
    keep = [i for i in range(len(slots)) if i not in set(finished)]
    holes = sorted(set(range(len(keep))) - set(keep))
    movers = [i for i in keep if i >= len(keep)]
    dest = {i: i for i in keep if i < len(keep)}
    dest.update(zip(reversed(movers), holes))
    new_slots, new_sampled = [0] * len(keep), [[] for _ in keep]
    new_ids, new_num = token_ids.copy(), np.zeros_like(num)
    for src, dst in dest.items():
        new_slots[dst], new_sampled[dst] = slots[src], sampled[src]
        new_ids[dst], new_num[dst] = token_ids[src], num[src]
    token_ids[:] = new_ids
    num[:] = new_num
    return new_slots, new_sampled


class Parts:
    """Real time spent in the proposer's parts (wrapping its bound methods on the instance)."""

    NAMES = ("tracker", "learn", "draft", "policy")

    def __init__(self, proposer):
        self.t = dict.fromkeys(self.NAMES, 0.0)
        self.policy_in_learn = 0.0
        self._in_learn = False
        proposer.tracker.rows = self._wrap(proposer.tracker.rows, "tracker")
        proposer._draft = self._wrap(proposer._draft, "draft")
        proposer._learn = self._wrap(proposer._learn, "learn", learn=True)
        for name in ("plan", "cut", "observe"):
            setattr(proposer.policy, name, self._wrap(getattr(proposer.policy, name), "policy"))

    def _wrap(self, fn, part, learn=False):
        def timed(*args, **kwargs):
            if learn:
                self._in_learn = True
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t
                self.t[part] += dt
                if learn:
                    self._in_learn = False
                elif part == "policy" and self._in_learn:
                    self.policy_in_learn += dt
        return timed

    def seconds(self) -> dict[str, float]:
        out = dict(self.t)
        out["learn"] -= self.policy_in_learn
        return out


class NeverDraft(FixedBudget):
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
    clock = FakeClock()
    module.time = clock  # the step time the policy sees: the fake clock (restored below)
    try:
        replay(prop, batch, length=length, seed=10_000 + batch, clock=clock, step_ms=step_ms, record=False)  # warm-up
        parts = Parts(prop)
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
    finally:
        module.time = time
    sec = parts.seconds()
    per_req = {name: 1e6 * s / rows_total for name, s in sec.items()}
    per_req["other"] = 1e6 * total / rows_total - sum(per_req.values())
    st = vars(prop.stats)
    d = {key: st[key] - stats0[key] for key in ("rows", "draft_tokens", "accepted_tokens", "kept_tokens")}
    return {"batch": batch, "policy": policy, "k": k, "calls_full": len(full),
            "us_per_call_median": 1e6 * statistics.median(full) if full else float("nan"),
            "us_per_request_step": 1e6 * total / rows_total,
            "parts_us_per_request_step": per_req,
            "drafted_per_row": d["draft_tokens"] / max(d["rows"], 1),
            "mat": 1 + d["accepted_tokens"] / max(d["rows"], 1)}


def prior_memory(tokens: int, seed: int = 0) -> dict:
    """Host bytes per context of a prior that counted `tokens` completion tokens (phrases of 3-10
    tokens from a bank of 2000, so contexts repeat): the store's two hash tables over the contexts
    held (`ChainConfig.max_prior_contexts`' bound)."""
    from rollout_graft.vllm.ngrams import NgramCounts

    rng = np.random.default_rng(seed)
    bank = [rng.integers(1, VOCAB, int(rng.integers(3, 11))) for _ in range(2000)]
    text = np.concatenate([bank[i] for i in rng.integers(0, len(bank), tokens // 3)])[:tokens].tolist()
    prior = NgramCounts(4)
    for start in range(0, len(text), 1000):  # a step's worth of text at a time, as a proposer counts it
        prior.teach(text, start, start + 1000)
    store = prior.store
    return {"tokens": len(text), "contexts": len(prior), "bytes": int(store.ctx.nbytes + store.pairs.nbytes),
            "bytes_per_context": (store.ctx.nbytes + store.pairs.nbytes) / max(len(prior), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--policies", nargs="+", default=["fixed", "dcut"], choices=["fixed", "dcut", "plain"])
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--length", type=int, default=256, help="completion tokens per request")
    ap.add_argument("--repeats", type=int, default=2, help="measured rollouts per setting (after one warm-up)")
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
    results = []
    print(f"{'policy':>6} {'batch':>5} {'us/call':>9} {'us/req':>7} | "
          + " ".join(f"{n:>7}" for n in (*Parts.NAMES, "other")) + " | drafted/row   MAT")
    for policy in args.policies:
        for batch in args.batches:
            r = run(batch, policy, args.k, args.length, args.repeats, tuple(args.step_ms), batch in args.cprofile)
            results.append(r)
            p = r["parts_us_per_request_step"]
            print(f"{policy:>6} {batch:>5} {r['us_per_call_median']:>9.0f} {r['us_per_request_step']:>7.1f} | "
                  + " ".join(f"{p[n]:>7.1f}" for n in (*Parts.NAMES, "other"))
                  + f" | {r['drafted_per_row']:>11.2f} {r['mat']:>5.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
