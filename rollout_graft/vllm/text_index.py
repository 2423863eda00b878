"""TextIndex: suffix matching over the texts of one GRPO group, for draft chains inside vLLM.

vLLM verifies one chain per request, so the group's text is read as chains: a request's draft is
what followed the longest match of its last tokens in the group's texts (the prompt, every
sibling's completion so far — finished ones included — and, when the prompt comes back in a
later epoch, the completions it got then). The texts are plain Python lists, extended by the
tokens each step emits; an n-gram table maps every n-gram (n = min_match … max_match) to its
latest occurrences, so one step costs O(new tokens × n) dict writes and O(n) reads per request —
never a pass over a row's whole history. The table holds tuples only: Python's garbage
collector stops tracking tuples of ints, while a table of lists made its collections ~18 % of
`propose`'s time at batch 256 (a cProfile of `scripts/profile_vllm_proposer.py`).

The table is brought up to date lazily: `extend` appends to the text and marks it; the first
`match` after that indexes the marked texts' new positions, text by text in the order they were
first marked. A group none of whose requests drafts (the budget policy decodes plainly) then costs
a list append per request-step instead of its n-gram writes. Where a group drafts every step the
table is the one indexing each token on arrival builds (texts are marked in row order); across
steps without a match, a text's newer positions are indexed together, so among occurrences
written in those steps the "newest" is the last text's rather than the last step's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass(slots=True)
class Match:
    chain: list[int]  # the continuation (at most `depth` tokens), [] when nothing matched
    length: int  # tokens of the match (0: none)


@dataclass
class TextIndex:
    """n-gram → its newest `keep` occurrences over a group's texts (`ChainConfig.occurrences`)."""

    min_match: int = 1
    max_match: int = 4
    keep: int = 4
    texts: list[list[int]] = field(default_factory=list)  # every text of the group
    table: dict[tuple[int, ...], tuple[tuple[int, int], ...]] = field(default_factory=dict)  # n-gram → ((text, end), …)
    indexed: list[int] = field(default_factory=list)  # per text: positions whose n-grams are in the table
    stale: dict[int, None] = field(default_factory=dict)  # texts with positions not indexed yet, in order

    def add(self, tokens: list[int], indexed_from: int = 0) -> int:
        """A new text (a sibling's prompt + completion so far, or a recalled completion); n-grams
        ending before `indexed_from` are not indexed (a sibling's prompt is the first member's).
        Returns its id."""
        self.texts.append(list(tokens[:indexed_from]))
        self.indexed.append(len(self.texts[-1]))
        tid = len(self.texts) - 1
        self.extend(tid, tokens[indexed_from:])
        return tid

    def extend(self, tid: int, tokens: list[int]) -> None:
        """Append `tokens` to text `tid`; the n-grams that end in them are indexed by the next `match`."""
        if tokens:
            self.texts[tid].extend(tokens)
            self.stale[tid] = None

    def _index(self) -> None:
        """Index the stale texts' new positions (texts in the order they became stale)."""
        texts, table, lo, hi, keep = self.texts, self.table, self.min_match, self.max_match, self.keep - 1
        for tid in self.stale:
            text = texts[tid]
            start, self.indexed[tid] = self.indexed[tid], len(text)
            for end in range(start, len(text)):
                last = tuple(text[max(end + 1 - hi, 0) : end + 1])  # the longest n-gram ending here
                size = len(last)
                occ = ((tid, end),)
                for n in range(lo, size + 1):
                    key = last[size - n :]
                    table[key] = occ + table.get(key, ())[:keep]
        self.stale.clear()

    def match(self, tid: int, depth: int, shared: bool = True) -> Match:
        """The continuation of text `tid`'s longest suffix match (newest occurrence with a
        continuation, the text's own end excluded); shared=False reads only the text itself and
        the prompt (text 0)."""
        if self.stale:
            self._index()
        text, texts, table = self.texts[tid], self.texts, self.table
        own_end = len(text) - 1
        last = tuple(text[-self.max_match :])
        size = len(last)
        for n in range(size, self.min_match - 1, -1):
            for src, end in table.get(last[size - n :], ()):
                other = texts[src]
                if end + 1 < len(other) and (src != tid or end != own_end) and (shared or src == 0 or src == tid):
                    return Match(other[end + 1 : end + 1 + depth], n)
        return Match([], 0)
