"""TextIndex: the texts of one GRPO group and their n-gram counts, for draft chains inside vLLM.

vLLM verifies one chain per request, so a group's text is read as chains: a request's draft
continues its text with the most frequent successors of its last tokens over the group's texts
(the prompt, every sibling's completion so far — finished ones included — and, when the prompt
comes back in a later epoch, the completions it got then): `NgramCounts.chain`. The texts are
plain Python lists, extended by the tokens each step emits; counting a token costs
`max_match − min_match + 1` updates of compiled dicts, and a chain token as many reads — never a
pass over a row's whole history. The completions (not prompts, not recalled texts: those were
counted when they were emitted) also teach the proposer's global table, the prior (`shared`).
Every table of a proposer lives in one `NgramStore`, so one compiled call counts a step's new
tokens of every group.

Counting is lazy: `extend` appends to the text and marks the index stale (in `pending`, shared
by all groups); `catch_up` counts every pending index's new positions (the proposer calls it
before drafting, so the prior also learns from groups that never draft). A group that decodes plainly (the budget policy drafts nothing) then costs a list
append per request-step instead of its counting. Counts do not depend on when they are made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ngrams import NgramCounts, NgramStore


@dataclass(eq=False)
class TextIndex:
    """A group's texts and their n-gram counts (contexts of `min_match`…`max_match` tokens)."""

    min_match: int = 1
    max_match: int = 4
    shared: NgramCounts | None = None  # the global table (the prior) the group's completions also teach
    store: NgramStore | None = None  # where the index's table lives (default: the prior's store, else its own)
    pending: dict[int, "TextIndex"] | None = None  # stale indexes of every group (`catch_up`)
    texts: list[list[int]] = field(default_factory=list)  # every text of the group
    counted: list[int] = field(default_factory=list)  # per text: positions counted
    teaches_shared: list[bool] = field(default_factory=list)  # per text: its new positions teach `shared`
    stale: dict[int, None] = field(default_factory=dict)  # texts with positions not counted yet, in order
    counts: NgramCounts = field(init=False)

    def __post_init__(self) -> None:
        if self.shared is not None and (self.shared.order, self.shared.min_order) != (self.max_match, self.min_match):
            raise ValueError("the shared table must count the index's context lengths "
                             f"({self.min_match}…{self.max_match}), not {self.shared.min_order}…{self.shared.order}")
        if self.store is None:
            self.store = self.shared.store if self.shared is not None else NgramStore(self.max_match, self.min_match)
        elif self.shared is not None and self.shared.store is not self.store:
            raise ValueError("the shared table must live in the index's NgramStore")
        self.counts = NgramCounts(self.max_match, self.min_match, store=self.store)

    def add(self, tokens: list[int], counted_from: int = 0, emitted: bool = False) -> int:
        """A new text: a prompt, a request (prompt + completion so far: `emitted`, its completion
        teaches the prior too) or a recalled completion (prompt + completion); positions before
        `counted_from` are not counted (a sibling's prompt is the first text's). Returns its id."""
        self.texts.append(list(tokens[:counted_from]))
        self.counted.append(len(self.texts[-1]))
        self.teaches_shared.append(emitted)
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
            work.append((self.counts, self.shared if self.teaches_shared[tid] else None, text, self.counted[tid], len(text)))
            self.counted[tid] = len(text)
        self.stale.clear()
        if self.pending is not None:
            self.pending.pop(id(self), None)
        return work


def catch_up(pending: dict[int, TextIndex]) -> None:
    """Count every stale index's new positions: one compiled call per store."""
    work: dict[int, tuple[NgramStore, list]] = {}
    for index in list(pending.values()):
        work.setdefault(id(index.store), (index.store, []))[1].extend(index.take())
    for store, items in work.values():
        store.teach(items)
