"""vLLM's persistent batch, replayed without vLLM: drive a chain proposer's `propose` as vLLM's
`custom_class` hook calls it, on rows whose completions are fixed in advance.

Used by the lab's proposer profiler (`lab/profile_vllm_proposer.py`), the chain replay study
(`lab/replay.py vllm`) and the vLLM unit tests. A draft is accepted up to its first token that
differs from the row's completion, plus one token: with drafts that carry no probabilities this is
exactly what vLLM's rejection sampler accepts on the run that emitted those tokens.
"""

from __future__ import annotations

import itertools
import time
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace

import numpy as np

from rollout_graft.dcut.chains import ChainPolicy
from rollout_graft.dcut.core import BudgetDecision

PROMPT = 64
VOCAB = 32000
SPARE_ROWS = 8  # vLLM's max_num_reqs exceeds the running batch
_RUNS = itertools.count()


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


def request_id(run: int, row: int) -> str:
    """The vLLM request id `replay_rows` gives request `row` of its `run`-th replay (unique across replays)."""
    return f"{run}-{row}"


def row_of(request: str) -> int:
    """The request index (`row`) of a `request_id`."""
    return int(request.rsplit("-", 1)[1])


class ModelledClock(FakeClock):
    """A clock that only the model moves: it stands still inside `propose` (so the replay is
    deterministic: no real time leaks in) and advances by the modelled steps. The proposer then
    measures its drafting as free, so probes are free: right on a clock where the proposer costs
    nothing; `clock_replay` models its own time where wanted (`clocks.ProposerCost`)."""

    def perf_counter(self) -> float:
        return self.now

    def call(self, fn, *args):
        return fn(*args)


@contextmanager
def fake_clock(modelled: bool = False):
    """A `FakeClock` (modelled: a `ModelledClock`) that our proposer's module reads as its `time`
    inside the block (restored after)."""
    from rollout_graft.vllm import proposer as module

    clock, saved = (ModelledClock() if modelled else FakeClock()), module.time
    module.time = clock
    try:
        yield clock
    finally:
        module.time = saved


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
    replaying recorded plain samples gives acceptance distributed as in vLLM (`lab/replay.py vllm`).
    on_call(rows, seconds) is told each call's active rows and real time. preempt_every: every
    n-th step, the request in the first row is preempted (leaves) and comes back one step later in
    the last row, recomputed. counts (optional dict): request-steps, emitted, drafted and accepted
    tokens are added to it (the prefill step counts: MAT = emitted / (emitted − accepted), as
    `scripts/bench.py --backend vllm` counts). step_ms: (a, b_rows, b_draft) ms, or a `StepClock`
    (`rollout_graft_tools.clocks`), told each step's drafts and contexts per row; each call's drafts
    are costed in the step before the next call (the first step, drafting nothing, stands for the
    prefill's; the last step's drafts are not costed). A proposer with `set_requests(ids, prompt_lengths, finished)` is told each call's
    request id and prompt length per row, as vLLM's input batch holds them, and the requests that finished since its
    last call, as vLLM's scheduler reports them (our plugin hands them to ours); the last ones by a call with no
    rows after the rollout, which the proposer's next call takes, as vLLM reports them with its next step."""
    batch = len(prompts)
    run = next(_RUNS)  # request ids are unique across replays, as vLLM's
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
    told = hasattr(proposer, "set_requests")
    ended: list[str] = []  # requests that finished since the last call, told with the next
    finished = [i for i, r in enumerate(slots) if done[r] >= len(outs[r])]
    while True:
        if finished:
            slots, sampled = _condense(slots, sampled, finished, token_ids, num)
        if not slots:
            break
        if clock is not None:  # the step that verifies the last call's drafts
            step_drafts = np.array([len(drafts.get(r, ())) for r in slots])
            if hasattr(step_ms, "step_ms"):  # a StepClock (rollout_graft_tools.clocks)
                clock.now += step_ms.step_ms(step_drafts, num[: len(slots)].copy()) / 1000.0
            else:
                clock.now += (step_ms[0] + step_ms[1] * len(slots) + step_ms[2] * int(step_drafts.sum())) / 1000.0
        if told:
            proposer.set_requests([request_id(run, r) for r in slots], [plen[r] for r in slots], finished=ended)
            ended = []
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
                ended.append(request_id(run, r))
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
                ended.append(request_id(run, r))
            parked = None
        if preempt_every and step % preempt_every == 0 and len(slots) > 1 and 0 not in finished:
            parked = (slots[0], token_ids[0].copy())
            done[slots[0]] -= len(sampled[0])  # its last step's tokens are recomputed on return
            finished.append(0)
    if told and ended:  # the last ones: vLLM reports them with its next step (the next rollout's first)
        proposer.set_requests([], [], finished=ended)
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


# ---------------------------------------------------------------------- chain proposers replayed
class ScoreThreshold(ChainPolicy):
    """Chains cut where their raw score falls below `tau` (no cost model: replay has no clock)."""

    def __init__(self, depth: int, tau: float):
        self.depth, self.tau = depth, tau

    def plan(self, rows: int) -> int:
        return self.depth

    def cut(self, tokens, scores):
        return (scores >= self.tau).sum(1), BudgetDecision(1.0)

    def observe(self, step) -> None:
        pass


def ours_proposer(k: int, tau: float | None, vocab: int, max_len: int, options: dict | None = None,
                  count_after_walk: bool = False):
    """Our proposer with chains cut at raw score `tau` (None: the product's D-cut); `count_after_walk`:
    the study `count_after_walk_class` gives."""
    from rollout_graft.vllm.config import ChainConfig
    from rollout_graft.vllm.proposer import RLDraftProposer

    policy = "dcut" if tau is None else "fixed"
    base = count_after_walk_class() if count_after_walk else RLDraftProposer
    cls = type("Replayed", (base,), {"config": ChainConfig(budget_policy=policy, **(options or {}))})
    prop = cls(vllm_config(k, max_len, vocab))
    if tau is not None:
        prop.policy = ScoreThreshold(k, tau)
    return prop


def count_after_walk_class():
    """A study of taking the counting off `propose`'s critical path: the proposer where a step that
    follows a drafting step walks its chains before it counts the text the step emitted (the
    tables then hold the text up to the last step), as a thread counting beside a GPU's next
    forward would leave them; after a step that did not draft, the waiting text is counted first,
    as in the product. Only the drafts can change (`lab/replay.py vllm run --count-after-walk`)."""
    from rollout_graft.vllm.proposer import RLDraftProposer

    class CountAfterWalk(RLDraftProposer):
        def _draft(self, token_ids):
            last = self._pending  # the last call's step (`propose` replaces it after drafting)
            if last is None or not last.planned:
                return super()._draft(token_ids)
            chains = self._walk(token_ids)
            self.tracker.count()  # this step's text: what the thread would count during the next forward
            return chains

    return CountAfterWalk


class SuffixReplay:
    """vLLM's `SuffixDecodingProposer` behind the `custom_class` call: told each row's request by
    the replay (`set_requests`), as vLLM's input batch tells it."""

    def __init__(self, k: int, min_token_prob: float, max_len: int, max_spec_factor: float = 1.0):
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        spec = SimpleNamespace(num_speculative_tokens=k, suffix_decoding_max_tree_depth=24,
                               suffix_decoding_max_cached_requests=10000,
                               suffix_decoding_max_spec_factor=max_spec_factor,
                               suffix_decoding_min_token_prob=min_token_prob)
        self.inner = SuffixDecodingProposer(SimpleNamespace(speculative_config=spec,
                                                            model_config=SimpleNamespace(max_model_len=max_len)))
        self.k, self.max_model_len = k, max_len
        self.ids: list[str] = []
        self.prompt_lens: list[int] = []

    def set_requests(self, requests: list[str], prompt_lengths: list[int], finished=()) -> None:
        self.ids, self.prompt_lens = list(requests), list(prompt_lengths)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        rows = len(self.ids)
        batch = SimpleNamespace(req_ids=self.ids, req_id_to_index={r: i for i, r in enumerate(self.ids)},
                                num_tokens_no_spec=num_tokens_no_spec, token_ids_cpu=token_ids_cpu,
                                num_prompt_tokens=np.array(self.prompt_lens + [0] * (len(num_tokens_no_spec) - rows)))
        out = self.inner.propose(self.k, batch, sampled_token_ids[:rows])
        return [list(d) for d in out] + [[] for _ in range(len(sampled_token_ids) - rows)]


def replay_rollouts(prop, rollouts: list[dict], step_ms=None, timed=None) -> dict:
    """Recorded rollouts (`{"prompts", "completions"}` each), in order, through one proposer: MAT and
    drafted / accepted tokens per request-step. step_ms = (a, b_rows, b_draft): the proposer's
    module reads a `FakeClock` advanced by that modelled vLLM step (a budget policy that times
    steps, D-cut, decides on it), and `modelled_speedup` is plain steps' modelled time over this
    run's for the same tokens. timed (optional [bool] per rollout): only those rollouts count (the
    others are replayed to teach, untimed: a revisit's first visit)."""
    counts = {"steps": 0, "emitted": 0, "drafted": 0, "accepted": 0, "ms": 0.0, "plain_ms": 0.0}
    with fake_clock() if step_ms is not None else nullcontext() as clock:
        for n, r in enumerate(rollouts):
            prop.rollout = n
            scratch = {"steps": 0, "emitted": 0, "drafted": 0, "accepted": 0}
            start = clock.now if clock is not None else 0.0
            replay_rows(prop, r["prompts"], r["completions"], clock=clock, step_ms=step_ms, record=False, counts=scratch)
            if timed is not None and not timed[n]:
                continue
            for key in scratch:
                counts[key] += scratch[key]
            if clock is not None:  # plain decoding emits one token per row a step: sum its modelled steps
                counts["ms"] += 1000.0 * (clock.now - start)
                counts["plain_ms"] += _plain_ms(r["completions"], step_ms)
    steps = max(counts["steps"], 1)
    out = {**counts, "mat": counts["emitted"] / steps, "drafted_per_step": counts["drafted"] / steps,
           "accepted_per_step": counts["accepted"] / steps}
    if clock is not None:
        out["modelled_speedup"] = counts["plain_ms"] / max(counts["ms"], 1e-9)
    return out


def _plain_ms(outs: list, step_ms) -> float:
    """Modelled time of plain decoding of these completions (one token per row a step; the prefill
    step not counted, as `replay_rows` does not time it)."""
    lens = [len(o) for o in outs]
    total = 0.0
    for step in range(1, max(lens)):
        rows = sum(1 for n in lens if n > step)
        total += step_ms[0] + step_ms[1] * rows
    return total


def at_drafted(curve: list[dict], drafted: float) -> float | None:
    """MAT on a curve of (drafted_per_step, mat) points, linearly interpolated at `drafted`."""
    pts = sorted((c["drafted_per_step"], c["mat"]) for c in curve)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    if not xs or drafted < xs[0] or drafted > xs[-1]:
        return None
    return float(np.interp(drafted, xs, ys))
