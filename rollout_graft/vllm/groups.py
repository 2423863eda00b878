"""Requests and GRPO groups found from vLLM's persistent batch alone (no request ids).

vLLM's `custom_class` proposer sees, each step, one row per request of the persistent batch:
`token_ids_cpu[i, :num_tokens_no_spec[i]]` (prompt + committed completion) and the tokens the
step just sampled for it. It gets no request ids and no prompt lengths, and rows move: finished
requests leave, vLLM condenses and reorders the batch, preempted requests come back recomputed.
So requests are recognised by their text:

- a row whose slot holds a request with the same length and the same last `TAIL` tokens before
  this step's tokens is that request (the fast path, O(TAIL) per row);
- otherwise the request is looked up by (length, hash of its last `TAIL` tokens) among all known
  requests (a moved or preempted-and-resumed row);
- otherwise it is new: its prompt is everything before the tokens it sampled in its first step
  (a request appears in `propose` first right after its prefill), and its group is the set of
  requests with the same prompt (length and hash of the prompt's tokens) — the G samples of one
  GRPO prompt, whatever other requests share the batch.

Two siblings whose last TAIL tokens and lengths are equal at the same step may swap identities;
their recent texts are then identical, so what either drafts from is unchanged in practice.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .text_index import TextIndex

TAIL = 32
"""Trailing tokens that identify a request between steps."""


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
    draft_scores: list[float] = field(default_factory=list)  # raw confidence of each draft token (prefix products)
    seen: int = 0  # step it was last seen
    created: int = 0  # step it was first seen (its prefill ran in that step)
    key: tuple[int, int] | None = None  # (length, hash of the last TAIL tokens), as `RequestTracker.by_key` holds it

    @property
    def text(self) -> list[int]:
        return self.group.index.texts[self.text_id]


def _key(length: int, text: list[int]) -> tuple[int, int]:
    """A request's identity between steps: its length and a hash of its last TAIL tokens (`text`
    holds at least those; only they are read)."""
    return length, hash(tuple(text[-TAIL:]))


class RequestTracker:
    """Maps the rows of each `propose` call to `Request`s and their `Group`s.

    A request of a prompt none of whose requests ran at the previous step starts a new rollout
    of that prompt (a later GRPO epoch): its group is rebuilt with the last `recall` completions
    of the previous rollout as read-only texts.

    Args:
        min_match, max_match: n-gram lengths of the groups' `TextIndex`.
        recall: completions of a prompt's previous rollout kept for its next one (0: none).
        max_groups: prompts remembered at most, least recently used dropped first.
        forget_after: steps after which a request not seen is dropped from the row maps (its
            text stays in its group).
    """

    def __init__(self, min_match: int = 1, max_match: int = 4, recall: int = 0, max_groups: int = 4096,
                 forget_after: int = 4096):
        self.min_match, self.max_match, self.recall = min_match, max_match, recall
        self.max_groups = max_groups
        self.forget_after = forget_after
        self.groups: OrderedDict[tuple[int, int], Group] = OrderedDict()
        self.slots: dict[int, Request] = {}  # row → request at the last step
        self.by_key: dict[tuple[int, int], list[Request]] = {}  # (length, tail hash) → requests (identical siblings share a key)
        self.step = 0

    def rows(self, sampled: list[list[int]], num_tokens: np.ndarray, token_ids: np.ndarray) -> list[Request | None]:
        """The request of each row (None: nothing sampled this step — a prefill chunk or an empty
        slot), with this step's tokens appended to its text."""
        self.step += 1
        out: list[Request | None] = []
        slots: dict[int, Request] = {}
        taken: set[int] = set()  # ids of the requests rows claimed this step
        for i, new in enumerate(sampled):  # find every row's request before any text changes
            req = self._find(i, token_ids[i], int(num_tokens[i]) - len(new), taken) if new else None
            out.append(req)
            if req is not None:
                slots[i] = req
                taken.add(id(req))
        for i, req in slots.items():
            self._unkey(req)
            req.group.index.extend(req.text_id, list(sampled[i]))
            req.length, req.seen = int(num_tokens[i]), self.step
            req.group.last_seen = self.step
            req.key = _key(req.length, req.text)
            self.by_key.setdefault(req.key, []).append(req)
        self.slots = slots
        if self.step % 256 == 0:
            self._forget()
        return out

    def _find(self, row: int, tokens: np.ndarray, before: int, taken: set[int]) -> Request:
        """The request in `row` (none another row already took this step: `taken` holds their ids)."""
        tail = tokens[max(before - TAIL, 0) : before].tolist()
        req = self.slots.get(row)
        if req is not None and id(req) not in taken and req.length == before and req.text[-TAIL:] == tail:
            return req
        for req in self.by_key.get(_key(before, tail), ()):
            if id(req) not in taken:
                return req
        return self._new_request(tokens[:before].tolist())

    def _unkey(self, req: Request) -> None:
        same = self.by_key.get(req.key)
        if same is not None:
            same[:] = [r for r in same if r is not req]
            if not same:
                del self.by_key[req.key]

    def _new_request(self, prompt: list[int]) -> Request:
        key = (len(prompt), hash(tuple(prompt)))
        group = self.groups.get(key)
        if group is None or group.prompt != prompt or group.last_seen < self.step - 1:
            recalled = group.completions()[-self.recall :] if group is not None and self.recall else []
            group = self.groups[key] = self._new_group(key, prompt, recalled)
            while len(self.groups) > self.max_groups:
                self.groups.popitem(last=False)
        self.groups.move_to_end(key)
        tid = group.index.add(prompt, indexed_from=len(prompt))  # the prompt's n-grams are indexed once
        group.members.append(tid)
        group.last_seen = self.step
        return Request(group, tid, len(prompt), seen=self.step, created=self.step)

    def _new_group(self, key: tuple[int, int], prompt: list[int], recalled: list[list[int]]) -> Group:
        index = TextIndex(self.min_match, self.max_match)
        index.add(prompt)
        ids = [index.add(prompt + completion, indexed_from=len(prompt)) for completion in recalled]
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
        for key in list(self.by_key):
            kept = [r for r in self.by_key[key] if self.step - r.seen <= self.forget_after]
            if kept:
                self.by_key[key] = kept
            else:
                del self.by_key[key]
