"""Requests and GRPO groups of vLLM's persistent batch, by request id (docs/DESIGN.md, "The vLLM
backend", step 1).

Before each `propose` our plugin hands the proposer every row's request id and prompt length.
A new id starts a request, whose group is every request with the same prompt; a known id
extends its text with the tokens it sampled (counted lazily, at the next draft, where vLLM's
token array holds them: `RequestTracker.count`); an id missing from a step (finished or
preempted) is kept aside `forget_after` steps at most and taken back when it returns with the
length it left with.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from .ngrams import NgramStore, TextRows


@dataclass(eq=False)
class Group:
    """The requests of one prompt (a GRPO group): their texts and the table (a slot of `store`)
    counting their n-grams, released when the group is collected. Counting is lazy: `extend`
    appends and marks the text stale (the group joins `pending`, shared by every group of a
    tracker); `catch_up` counts every pending group's new positions — the completions' also in the
    `prior` slot (-1: none). A `RequestTracker` counts its requests' texts itself (by request
    slot, from vLLM's token array: `RequestTracker.count`); its groups count their prompt and
    recalled completions so."""

    prompt: list[int]
    store: NgramStore
    prior: int = -1
    pending: dict[int, "Group"] | None = None  # stale groups of every group (`catch_up`)
    texts: list[list[int]] = field(default_factory=list)  # every text of the group
    counted: list[int] = field(default_factory=list)  # per text: positions counted
    teaches_prior: list[bool] = field(default_factory=list)  # per text: its new positions teach `prior`
    stale: dict[int, None] = field(default_factory=dict)  # texts with positions not counted yet, in order
    recalled: list[int] = field(default_factory=list)  # text ids of completions from earlier rollouts
    members: list[int] = field(default_factory=list)  # text ids of this rollout's requests
    last_seen: int = 0  # step a member was last seen
    slot: int = field(init=False)  # the group's table in `store`

    def __post_init__(self) -> None:
        self.slot = self.store.slot()
        weakref.finalize(self, self.store.release, self.slot).atexit = False

    def add(self, tokens: list[int], counted_from: int = 0, emitted: bool = False) -> int:
        """A new text: a prompt, a request (prompt + completion so far: `emitted`, its completion
        teaches the prior too) or a recalled completion (prompt + completion); positions before
        `counted_from` are not counted (a sibling's prompt is the first text's). Returns its id."""
        self.texts.append(list(tokens[:counted_from]))
        self.counted.append(len(self.texts[-1]))
        self.teaches_prior.append(emitted)
        tid = len(self.texts) - 1
        self.extend(tid, tokens[counted_from:])
        return tid

    def extend(self, tid: int, tokens: list[int]) -> None:
        """Append `tokens` to text `tid`; they are counted by the next `catch_up`."""
        if tokens:
            self.texts[tid].extend(tokens)
            if not self.stale and self.pending is not None:
                self.pending[id(self)] = self
            self.stale[tid] = None

    def take(self) -> list[tuple]:
        """The stale texts' new positions, as `NgramStore.teach` work; they count as counted."""
        work = []
        for tid in self.stale:
            text = self.texts[tid]
            work.append((self.slot, self.prior if self.teaches_prior[tid] else -1, text, self.counted[tid], len(text)))
            self.counted[tid] = len(text)
        self.stale.clear()
        if self.pending is not None:
            self.pending.pop(id(self), None)
        return work

    def completions(self) -> list[list[int]]:
        """Completions known for this prompt, oldest first (recalled ones, then this rollout's)."""
        return [self.texts[t][len(self.prompt) :] for t in self.recalled + self.members]


def catch_up(pending: dict[int, Group]) -> None:
    """Count every stale group's new positions: one compiled call (the groups share one store)."""
    groups = list(pending.values())
    if groups:
        groups[0].store.teach([w for g in groups for w in g.take()])


@dataclass(eq=False)
class Request:
    group: Group
    text_id: int  # its text in group.texts
    length: int  # tokens committed (prompt + completion)
    seen: int = 0  # step it was last seen
    slot: int = -1  # its row in the arrays of per-request state (`RequestTracker.slots`; the proposer's `InFlight`)

    @property
    def text(self) -> list[int]:
        return self.group.texts[self.text_id]


def _key(prompt) -> tuple[int, int]:
    """A group's key in `RequestTracker.groups` (its prompt compared in full on a hit)."""
    return len(prompt), hash(tuple(prompt))


class RequestTracker:
    """Maps the rows of each `propose` call to `Request`s (by request id) and their `Group`s.

    A request of a prompt none of whose requests ran at the previous step starts a new rollout
    of that prompt (a later GRPO epoch): its group is rebuilt with the last `recall` completions
    of the previous rollout as read-only texts.

    After `rows`, the step's arrays are kept for the proposer: `active` (rows that sampled),
    `num` (committed tokens per active row), `lens` (tokens sampled per active row), `slots` (each
    active row's request slot: the proposer's per-request state is arrays by slot; a request keeps
    its slot while the tracker holds it, `started` lists the slots new this step, reused ones
    included, and `by_slot` finds a request), `tables` (its group's table) and `created` (a
    request started this step: its prefill ran).

    Args:
        store: where the groups' tables live (default: `NgramStore()`).
        prior: the slot of `store` every group's completions also teach (-1: none).
        recall: completions of a prompt's previous rollout kept for its next one (0: none).
        max_groups: prompts remembered at most, least recently used dropped first.
        forget_after: steps a request that left the batch is kept for its return (a preempted one).
        shared: the requests of one prompt share one group (else each request has its own,
            with its prompt; nothing is recalled).
    """

    def __init__(self, store: NgramStore | None = None, prior: int = -1, recall: int = 0, max_groups: int = 4096,
                 forget_after: int = 4096, shared: bool = True):
        self.store = NgramStore() if store is None else store  # every group's table
        self.prior, self.recall, self.shared = prior, recall, shared
        self.pending: dict[int, Group] = {}  # groups with text not counted yet: prompts, recalled completions
        self.counted = np.zeros(0, dtype=np.int64)  # slot → positions of its request's text counted (`count`)
        self._left: list[tuple[Group, int, int, int]] = []  # texts of requests that left, to count: (group, text, from, to)
        self.max_groups, self.forget_after = max_groups, forget_after
        self.groups: OrderedDict[tuple[int, int], Group] = OrderedDict()
        self.live: dict[str, Request] = {}  # the last step's requests, by id
        self.away: dict[str, Request] = {}  # requests that left the batch (finished or preempted), by id
        self.step = 0
        self.active = np.zeros(0, dtype=np.int64)
        self.num = self.lens = np.zeros(0, dtype=np.int64)
        self.created = False
        self._ids: list | None = None  # the last step's ids, where every row sampled (`defer`)
        self._reqs: list[Request] | None = None  # and its request per row
        self._log: list[tuple[int, np.ndarray, np.ndarray]] = []  # deferred steps: (step, tokens per row, the tokens)
        self.slots = np.zeros(0, dtype=np.int64)  # the slot of each active row's request (`rows`)
        self.tables = np.zeros(0, dtype=np.int64)  # and its group's table (a slot of `store`)
        self.by_slot: dict[int, Request] = {}  # every request the tracker holds, by slot
        self.slot_capacity = 0  # slots handed out so far
        self._free_slots: list[int] = []  # slots of requests dropped before the last `rows` call: reused
        self._dropped: list[int] = []  # slots of requests dropped since (their state is read this step still)
        self.token_ids: np.ndarray | None = None  # the last `rows` call's token ids (vLLM's token_ids_cpu)
        self.started: list[int] = []  # slots of the requests the last `rows` call started (their state starts empty)

    def rows(self, ids: list, prompt_lens, sampled: list[list[int]], num_tokens: np.ndarray,
             token_ids: np.ndarray) -> list[Request | None]:
        """The request of each row (None: nothing sampled this step — a prefill chunk or an empty
        slot), with this step's tokens appended to its text. ids / prompt_lens: the request id and
        prompt length of rows 0…len(ids)-1 (vLLM's input batch); rows past them are empty."""
        self._apply_log()
        self.step += 1
        for slot in self._dropped:
            del self.by_slot[slot]
        self._free_slots += self._dropped
        self._dropped = []
        n = min(len(sampled), len(ids))
        lens = np.fromiter((len(sampled[i]) for i in range(n)), dtype=np.int64, count=n)
        active = np.flatnonzero(lens)
        num = np.asarray(num_tokens[:n], dtype=np.int64)
        out: list[Request | None] = [None] * len(sampled)
        live: dict[str, Request] = {}
        self.created = False
        self.started = []
        for i, length in zip(active.tolist(), num[active].tolist()):
            rid, new = ids[i], sampled[i]
            req = self._take(rid, length - len(new))
            if req is None:
                req = self._start(token_ids[i, : int(prompt_lens[i])].tolist(),
                                  token_ids[i, int(prompt_lens[i]) : length - len(new)].tolist())
                self.created = True
            req.text.extend(new)
            req.length, req.seen = length, self.step
            req.group.last_seen = self.step
            live[rid] = out[i] = req
        for req in self.live.values():  # requests that did not sample this step: finished, preempted or prefilling
            self._settle(req)
        self.away.update(self.live)
        self.live = live
        self.active, self.num, self.lens = active, num[active], lens[active]
        reqs = [out[i] for i in active.tolist()]
        self.slots = np.fromiter((r.slot for r in reqs), dtype=np.int64, count=len(reqs))
        self.tables = np.fromiter((r.group.slot for r in reqs), dtype=np.int64, count=len(reqs))
        self.token_ids = token_ids
        self._prune()
        full = len(active) == n
        self._ids, self._reqs = (list(ids[:n]), out[:n]) if full else (None, None)
        return out

    def defer(self, ids: list, sampled: list[list[int]], num_tokens: np.ndarray) -> bool:
        """A step whose rows are the last step's requests in the same rows, each having sampled what
        takes it to its row's length (none arrived, left, moved, was preempted or is prefilling):
        logged instead of applied — no Python per row — until `flush` (the next `rows`, or a caller
        that reads the texts). Returns False, logging nothing, for any other step (`rows` then)."""
        reqs = self._reqs
        n = min(len(sampled), len(ids))
        if reqs is None or n != len(reqs) or list(ids[:n]) != self._ids:
            return False
        lens = np.fromiter(map(len, sampled[:n]), dtype=np.int64, count=n)
        num = np.array(num_tokens[:n], dtype=np.int64)
        if not lens.all() or not np.array_equal(num, self.num + lens):
            return False
        self.step += 1
        tokens = np.fromiter(chain.from_iterable(sampled[:n]), dtype=np.int64, count=int(lens.sum()))  # a copy: vLLM owns the lists
        self._log.append((self.step, lens, tokens))
        self.num, self.lens, self.created = num, lens, False
        self._prune()
        return True

    def flush(self) -> list[Request | None]:
        """Apply the deferred steps (`defer`): each row's tokens appended to its request's text, as
        `rows` would have. Returns the request of each row of the last step."""
        self._apply_log()
        return self._reqs

    def _apply_log(self) -> None:
        for step, lens, tokens in self._log:
            flat, at = tokens.tolist(), 0
            for req, n in zip(self._reqs, lens.tolist()):
                req.text.extend(flat[at : at + n])
                req.length += n
                req.seen = req.group.last_seen = step
                at += n
        self._log.clear()

    def _prune(self) -> None:
        if self.step % 256 == 0:
            self._dropped += [r.slot for r in self.away.values() if self.step - r.seen > self.forget_after]
            self.away = {rid: r for rid, r in self.away.items() if self.step - r.seen <= self.forget_after}

    def _take(self, rid, before: int) -> Request | None:
        """The known request `rid` — of the last step, or returning to the batch (preempted,
        recomputed) — if its text is the row's as it stood before this step's tokens; else None."""
        req = self.live.pop(rid, None) or self.away.pop(rid, None)
        if req is not None and req.length != before:  # not the row's text: dropped, the row starts a new request
            self._settle(req)
            self._dropped.append(req.slot)
            return None
        return req

    def _start(self, prompt: list[int], completion: list[int]) -> Request:
        """A new request: its group (this rollout's of its prompt) and its text, prompt + the
        completion it already has (one the tracker has not seen: forgotten while away)."""
        if not self.shared:  # a group of its own, not remembered
            group = self._new_group(prompt, [])
        else:
            key = _key(prompt)
            group = self.groups.get(key)
            if group is None or group.prompt != prompt or group.last_seen < self.step - 1:
                recalled = group.completions()[-self.recall :] if group is not None and self.recall else []
                group = self.groups[key] = self._new_group(prompt, recalled)
                while len(self.groups) > self.max_groups:
                    self.groups.popitem(last=False)
            self.groups.move_to_end(key)
        tid = group.add(prompt + completion, counted_from=len(prompt) + len(completion))  # counted by `count`
        group.members.append(tid)
        group.last_seen = self.step
        req = Request(group, tid, len(prompt) + len(completion), seen=self.step, slot=self._slot())
        self.counted[req.slot] = len(prompt)  # the prompt is counted once, as its group's first text
        self.by_slot[req.slot] = req
        self.started.append(req.slot)
        return req

    def _slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        self.slot_capacity += 1
        if self.slot_capacity > len(self.counted):
            self.counted = np.concatenate([self.counted, np.zeros(max(self.slot_capacity, len(self.counted)), np.int64)])
        return self.slot_capacity - 1

    # ------------------------------------------------------------------ counting
    def count(self, token_ids: np.ndarray) -> None:
        """Count every text not counted yet, in one `NgramStore.teach`: the step's rows where vLLM
        holds them (`token_ids`, as the last `rows` or `defer` left them: each row's request's
        positions from where its counting stopped to its length, no Python per row), the texts of
        requests that left since (`_settle`) and the groups' new texts (prompts, recalled
        completions). A request's completion teaches its group's table and the prior."""
        rows = TextRows(token_ids, self.active, self.tables, self.counted[self.slots], self.num, self.prior)
        self.store.teach(self._take_work(), rows)
        self.counted[self.slots] = self.num

    def settle(self) -> None:
        """`count` from the texts the tracker holds (any time, not only in a step: vLLM's rows may
        have changed since)."""
        self._apply_log()
        for req in self.live.values():
            self._settle(req)
        self.store.teach(self._take_work())

    def _settle(self, req: Request) -> None:
        """The request's text not counted yet is counted by the next `count` from its text (it
        leaves the batch, or a caller reads the tables outside a step)."""
        start = int(self.counted[req.slot])
        if start < req.length:
            self._left.append((req.group, req.text_id, start, req.length))
            self.counted[req.slot] = req.length

    def _take_work(self) -> list[tuple]:
        work = [(g.slot, self.prior, g.texts[tid], start, end) for g, tid, start, end in self._left]
        self._left = []
        return work + [w for g in list(self.pending.values()) for w in g.take()]

    def _new_group(self, prompt: list[int], recalled: list[list[int]]) -> Group:
        group = Group(prompt, self.store, self.prior, self.pending)
        group.add(prompt)
        group.recalled = [group.add(prompt + completion, counted_from=len(prompt)) for completion in recalled]
        return group

    def restore(self, saved: list[tuple[list[int], list[list[int]]]]) -> None:
        """Prompts and their completions (`Group.completions`) saved with a checkpoint: a request
        of one of these prompts starts a rollout that recalls them."""
        for prompt, completions in saved:
            recalled = [list(c) for c in completions][-self.recall :] if self.recall else []
            self.groups[_key(prompt)] = self._new_group(list(prompt), recalled)
        while len(self.groups) > self.max_groups:
            self.groups.popitem(last=False)
