"""Requests and GRPO groups found from vLLM's persistent batch alone (no request ids).

vLLM's `custom_class` proposer sees, each step, one row per request of the persistent batch:
`token_ids_cpu[i, :num_tokens_no_spec[i]]` (prompt + committed completion) and the tokens the
step just sampled for it. It gets no request ids and no prompt lengths, and rows move: finished
requests leave, vLLM condenses and reorders the batch, preempted requests come back recomputed.
So requests are recognised by their text:

- a row whose slot holds a request with the same length and the same last `tail` tokens
  (`ChainConfig.identity_tokens`, 32) before this step's tokens is that request (the fast path: one compiled pass over the whole batch
  against the lengths and tails kept per slot);
- otherwise the request is looked up by (length, last `tail` tokens) among all known requests —
  those that left the batch earlier first, then the last step's slots in row order — as one
  pass over the rows in order would (a moved or preempted-and-resumed row);
- otherwise it is new: its prompt is everything before the tokens it sampled in its first step
  (a request appears in `propose` first right after its prefill), and its group is the set of
  requests with the same prompt (length and hash of the prompt's tokens) — the G samples of one
  GRPO prompt, whatever other requests share the batch.

Per step, the Python work per row is the fast path's bookkeeping and appending to the request's
text (`TextIndex.extend`; counting waits for the next draft); only moved, resumed and new rows
are looked up one by one.

Two siblings whose last `tail` tokens and lengths are equal at the same step may swap identities;
their recent texts are then identical, so what either drafts from is unchanged in practice.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from .ngrams import NgramCounts, NgramStore
from .text_index import TextIndex

@dataclass(eq=False)
class Group:
    """The requests of one prompt (a GRPO group) and the text they share."""

    key: tuple[int, int]  # (prompt length, hash of the prompt's tokens)
    prompt: list[int]
    index: TextIndex
    recalled: list[int] = field(default_factory=list)  # text ids of completions from earlier rollouts
    members: list[int] = field(default_factory=list)  # text ids of this rollout's requests
    last_seen: int = 0  # step a member was last seen

    def completions(self) -> list[list[int]]:
        """Completions known for this prompt, oldest first (recalled ones, then this rollout's)."""
        return [self.index.texts[t][len(self.prompt) :] for t in self.recalled + self.members]


@dataclass(eq=False)
class Request:
    group: Group
    text_id: int  # its text in group.index
    length: int  # tokens committed (prompt + completion)
    draft: list[int] = field(default_factory=list)  # the chain proposed at its last step
    draft_scores: np.ndarray | None = None  # raw confidence of each draft token (prefix products)
    shadow: list[int] = field(default_factory=list)  # a chain computed and not sent, matched against what it emits next
    shadow_scores: np.ndarray | None = None
    shadow_at: int = 0  # its text's length when the shadow was drafted
    seen: int = 0  # step it was last seen
    created: int = 0  # step it was first seen (its prefill ran in that step)

    @property
    def text(self) -> list[int]:
        return self.group.index.texts[self.text_id]


def _tail_key(length: int, text: list[int], tail: int) -> tuple[int, tuple[int, ...]]:
    """A request's identity between steps: its length and its last `tail` tokens (`text` holds at
    least those; only they are read)."""
    return length, tuple(text[-tail:])


class RequestTracker:
    """Maps the rows of each `propose` call to `Request`s and their `Group`s.

    A request of a prompt none of whose requests ran at the previous step starts a new rollout
    of that prompt (a later GRPO epoch): its group is rebuilt with the last `recall` completions
    of the previous rollout as read-only texts.

    The per-step work is one pass over the batch: the fast path (same slot, same length, same
    last `tail` tokens) is one compiled loop (`_kernels._same_requests`, numba) comparing every
    row's tail with the tails kept per slot
    (`slot_len`, `slot_tail`); only rows that fail it (moved, resumed, new) and each request's
    text extension run in Python. Requests that leave the batch are keyed in `away` by
    (length, last `tail` tokens); requests of the last step's slots are compared in numpy.

    After `rows`, the step's arrays are kept for the proposer: `active` (rows that sampled),
    `num` (committed tokens per active row), `lens` (tokens sampled per active row), `flat`
    (those tokens, concatenated) and `created` (a request appeared for the first time).

    Args:
        min_match, max_match: context lengths counted by the groups' `TextIndex`.
        recall: completions of a prompt's previous rollout kept for its next one (0: none).
        prior: the global table every group's completions teach (None: none).
        shared: the requests of one prompt share one index (else each request has its own,
            with its prompt; nothing is recalled).
        tail: trailing tokens that identify a request between steps.
        max_groups: prompts remembered at most, least recently used dropped first.
        forget_after: steps after which a request not seen is dropped from the row maps (its
            text stays in its group).
    """

    def __init__(self, min_match: int = 1, max_match: int = 4, recall: int = 0, max_groups: int = 4096,
                 forget_after: int = 4096, tail: int = 32, prior: NgramCounts | None = None, shared: bool = True):
        self.min_match, self.max_match, self.recall = min_match, max_match, recall
        self.tail, self.prior, self.shared = tail, prior, shared
        self.store = prior.store if prior is not None else NgramStore(max_match, min_match)  # every group's table
        self.kernels = self.store.kern  # the fast path's compiled loops, compiled now (vLLM's token ids are int32)
        ids, none = np.zeros((1, 1), dtype=np.int32), np.zeros(0, dtype=np.int64)
        self.kernels._same_requests(ids, none, none, none, np.zeros((0, tail), dtype=np.int64))
        self.kernels._slot_tails(ids, none, none, none, none, 0, tail)
        self.pending: dict[int, TextIndex] = {}  # indexes with text not counted yet (`text_index.catch_up`)
        self.max_groups = max_groups
        self.forget_after = forget_after
        self.groups: OrderedDict[tuple[int, int], Group] = OrderedDict()
        self.slots: list[Request | None] = []  # row → request at the last step
        self.slot_len = np.zeros(0, dtype=np.int64)  # row → its request's length after the last step (-1: none)
        self.slot_tail = np.zeros((0, tail), dtype=np.int64)  # row → its last `tail` tokens, right-aligned, -1 before the text
        self.away: dict[tuple[int, tuple[int, ...]], list[Request]] = {}  # requests that left the slots, by (length, tail)
        self.step = 0
        self.active = np.zeros(0, dtype=np.int64)
        self.num = self.lens = self.flat = np.zeros(0, dtype=np.int64)
        self.created = False

    def rows(self, sampled: list[list[int]], num_tokens: np.ndarray, token_ids: np.ndarray) -> list[Request | None]:
        """The request of each row (None: nothing sampled this step — a prefill chunk or an empty
        slot), with this step's tokens appended to its text."""
        self.step += 1
        n = len(sampled)
        lens = np.fromiter(map(len, sampled), dtype=np.int64, count=n)
        active = np.flatnonzero(lens)
        num = np.asarray(num_tokens[:n], dtype=np.int64)
        before = num - lens
        out: list[Request | None] = [None] * n
        # the fast path for every row at once: same slot, same length, same last `tail` tokens
        fast = self.kernels._same_requests(token_ids, before, lens, self.slot_len, self.slot_tail)
        for i in np.flatnonzero(fast).tolist():
            out[i] = self.slots[i]
        slow = np.flatnonzero(lens.astype(bool) & ~fast).tolist()
        self.created = False
        if slow:
            self._find_slow(slow, fast, out, token_ids, before)
        # leavers: last step's requests no row claimed, keyed in `away` (in row order, as one pass keys them)
        if len(self.slots):
            claimed = {id(out[i]) for i in slow}
            for j in np.flatnonzero(~fast[: len(self.slots)]).tolist() + list(range(n, len(self.slots))):
                req = self.slots[j]
                if req is not None and id(req) not in claimed:
                    self.away.setdefault(_tail_key(req.length, req.text, self.tail), []).append(req)
        act = active.tolist()
        new_lens = lens[active]
        step = self.step
        for i, length in zip(act, num[active].tolist()):
            req = out[i]
            req.group.index.extend(req.text_id, sampled[i])
            req.length, req.seen = length, step
            req.group.last_seen = step
        self.slots = out
        self.active, self.num, self.lens = active, num[active], new_lens
        self.flat = np.fromiter(chain.from_iterable(sampled[i] for i in act), dtype=np.int64,
                                count=int(new_lens.sum()))
        self.slot_len = np.full(n, -1, dtype=np.int64)
        self.slot_len[active] = self.num
        self.slot_tail = self.kernels._slot_tails(token_ids, active, self.num, new_lens, self.flat, n, self.tail)
        if self.step % 256 == 0:
            self._forget()
        return out

    def _tails(self, token_ids: np.ndarray, rows: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """token_ids[row, end - tail : end] per row, right-aligned, -1 before position 0: [rows, tail]."""
        idx = ends.reshape(-1, 1) + np.arange(-self.tail, 0)
        got = token_ids[rows.reshape(-1, 1), np.maximum(idx, 0)].astype(np.int64)
        return np.where(idx >= 0, got, -1)

    def _find_slow(self, slow: list[int], fast: np.ndarray, out: list[Request | None], token_ids: np.ndarray,
                   before: np.ndarray) -> None:
        """Rows the fast path did not place, in row order, as one pass over all rows would: a row
        takes the first request keyed (length, tail) — those that left the slots earlier first, then
        the last step's slots in row order — that no earlier row took; a later row whose slot
        request it takes falls back here too. Otherwise its request is new."""
        taken: set[int] = set()  # requests slow rows took (fast rows hold their slot's request)
        todo = list(slow)
        heapq.heapify(todo)
        while todo:
            i = heapq.heappop(todo)
            b = int(before[i])
            key = (b, tuple(token_ids[i, max(b - self.tail, 0) : b].tolist()))
            req = None
            same = self.away.get(key)
            if same:
                req = next((r for r in same if id(r) not in taken), None)
                if req is not None:
                    same.remove(req)
                    if not same:
                        del self.away[key]
            if req is None and len(self.slots):
                tail = self._tails(token_ids, np.array([i]), np.array([b]))
                for j in np.flatnonzero((self.slot_len == b) & (self.slot_tail == tail).all(1)).tolist():
                    if j < len(fast) and fast[j]:
                        if j < i:
                            continue  # row j comes first and keeps its own request
                        fast[j], out[j] = False, None  # this row comes first: row j looks again after it
                        heapq.heappush(todo, j)
                    elif id(self.slots[j]) in taken:
                        continue
                    req = self.slots[j]
                    break
            if req is None:
                req = self._new_request(token_ids[i, :b].tolist())
                self.created = True
            out[i] = req
            taken.add(id(req))

    def _new_request(self, prompt: list[int]) -> Request:
        key = (len(prompt), hash(tuple(prompt)))
        if not self.shared:  # a group of its own, not remembered
            group = self._new_group(key, prompt, [])
            tid = group.index.add(prompt, counted_from=len(prompt), emitted=True)
            group.members.append(tid)
            return Request(group, tid, len(prompt), seen=self.step, created=self.step)
        group = self.groups.get(key)
        if group is None or group.prompt != prompt or group.last_seen < self.step - 1:
            recalled = group.completions()[-self.recall :] if group is not None and self.recall else []
            group = self.groups[key] = self._new_group(key, prompt, recalled)
            while len(self.groups) > self.max_groups:
                self.groups.popitem(last=False)
        self.groups.move_to_end(key)
        tid = group.index.add(prompt, counted_from=len(prompt), emitted=True)  # the prompt is counted once
        group.members.append(tid)
        group.last_seen = self.step
        return Request(group, tid, len(prompt), seen=self.step, created=self.step)

    def _new_group(self, key: tuple[int, int], prompt: list[int], recalled: list[list[int]]) -> Group:
        index = TextIndex(self.min_match, self.max_match, shared=self.prior, store=self.store, pending=self.pending)
        index.add(prompt)
        ids = [index.add(prompt + completion, counted_from=len(prompt)) for completion in recalled]
        return Group(key, prompt, index, recalled=ids)

    def restore(self, saved: list[tuple[list[int], list[list[int]]]]) -> None:
        """Prompts and their completions (`Group.completions`) saved with a checkpoint: a request
        of one of these prompts starts a rollout that recalls them."""
        for prompt, completions in saved:
            key = (len(prompt), hash(tuple(prompt)))
            self.groups[key] = self._new_group(key, list(prompt), [list(c) for c in completions][-self.recall :] if self.recall else [])
        while len(self.groups) > self.max_groups:
            self.groups.popitem(last=False)

    def _forget(self) -> None:
        for key in list(self.away):
            kept = [r for r in self.away[key] if self.step - r.seen <= self.forget_after]
            if kept:
                self.away[key] = kept
            else:
                del self.away[key]
