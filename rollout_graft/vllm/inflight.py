"""`InFlight`: what each request has in flight between two `propose` calls, as arrays by request
slot (`groups.Request.slot`) — the draft sent to vLLM, to learn what it earned, and the shadow
chain matched against the tokens the request emits next (docs/DESIGN.md, "The vLLM backend",
step 4: shadows). Every step's work is a few array operations over the batch's slots, not Python
per row: one compiled call each (`_kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Evidence = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Raw scores [n, depth] (0 past a chain's verified tokens), depths [n] (tokens verified) and
accepted [n], of chains a budget policy learns from (`dcut.chains.ChainStep.verified`, `.shadowed`)."""


@dataclass
class InFlight:
    k: int  # the deepest draft
    draft_len: np.ndarray = field(init=False)  # [slots] tokens of the draft sent at the request's last step
    draft_scores: np.ndarray = field(init=False)  # [slots, k] their raw scores (prefix products; 0 past it)
    teaches: np.ndarray = field(init=False)  # [slots] the sent draft teaches by itself (else its chain is a shadow)
    shadow_len: np.ndarray = field(init=False)  # [slots] the shadow's tokens (0: none)
    shadow_tokens: np.ndarray = field(init=False)  # [slots, k]
    shadow_scores: np.ndarray = field(init=False)  # [slots, k]
    shadow_at: np.ndarray = field(init=False)  # [slots] the request's text length when the shadow was drafted
    shadows: int = 0  # requests holding a shadow

    def __post_init__(self) -> None:
        from . import _kernels  # numba: imported when a proposer is built (see there why not before)

        self._k = _kernels
        self._arrays(0)
        self._warm()

    def _warm(self) -> None:
        """Compile (or load from numba's cache) the kernels now, not in a step vLLM times
        (`ngrams.NgramStore._warm` alike), for both dtypes of token ids it may hand over."""
        none, chains = np.zeros(0, np.int64), np.zeros((0, self.k), np.int64)
        self.verified(none, none, none)
        self.send(none, chains, np.zeros((0, self.k)), none, none, none, True)
        for ids in (np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int32)):
            self._k._resolve(self.shadow_len, self.shadow_tokens, self.shadow_scores, self.shadow_at, none, none, none, ids, False)

    def _arrays(self, n: int) -> None:
        k = self.k
        self.draft_len, self.teaches = np.zeros(n, np.int64), np.zeros(n, np.bool_)
        self.draft_scores, self.shadow_scores = np.zeros((n, k)), np.zeros((n, k))
        self.shadow_len, self.shadow_at = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.shadow_tokens = np.zeros((n, k), np.int64)

    def start(self, capacity: int, slots: list[int]) -> None:
        """Room for `capacity` slots; `slots` (requests just started, perhaps reusing a slot) hold nothing."""
        if capacity > len(self.draft_len):
            old = {name: getattr(self, name) for name in ("draft_len", "teaches", "draft_scores", "shadow_scores",
                                                          "shadow_len", "shadow_at", "shadow_tokens")}
            self._arrays(max(capacity, 2 * len(self.draft_len)))
            for name, values in old.items():
                getattr(self, name)[: len(values)] = values
        if slots:
            self.shadows -= int((self.shadow_len[slots] > 0).sum())
            self.draft_len[slots], self.teaches[slots], self.shadow_len[slots] = 0, False, 0

    def send(self, slots: np.ndarray, tokens: np.ndarray, scores: np.ndarray, lengths: np.ndarray, depths: np.ndarray,
             nums: np.ndarray, learns: bool) -> np.ndarray:
        """Row j (its request's slot slots[j], its text nums[j] tokens long) sends the first
        kept[j] = min(depths[j], lengths[j]) tokens of its chain (tokens [rows, k], raw `scores`
        [rows, k], `lengths`); a row that sends none keeps its last draft. For a policy that
        `learns` every chain is also kept as its request's shadow where it holds none, to match
        against what the request emits next (`resolve`), and a sent draft then teaches through its
        shadow only. Returns kept."""
        kept, added = self._k._send(self.draft_len, self.teaches, self.draft_scores, self.shadow_len, self.shadow_tokens,
                                    self.shadow_scores, self.shadow_at, slots, tokens, scores, lengths,
                                    np.asarray(depths, np.int64), nums, learns)
        self.shadows += added
        return kept

    def verified(self, slots: np.ndarray, depths: np.ndarray, lens: np.ndarray) -> tuple[Evidence | None, int, int, int]:
        """What the drafts sent last step earned, for the rows `slots` that vLLM verified `depths`
        tokens of and that emitted `lens` tokens: the evidence of the rows whose draft teaches
        (None: none), the rows that verified any, their tokens verified and accepted; the rows'
        drafts are then done."""
        rows, tokens, accepted, scores, depth, acc = self._k._verified(self.draft_len, self.teaches, self.draft_scores,
                                                                       slots, np.asarray(depths, np.int64), lens)
        return ((scores, depth, acc) if len(depth) else None), int(rows), int(tokens), int(accepted)

    def resolve(self, slots: np.ndarray, rows: np.ndarray, nums: np.ndarray, token_ids: np.ndarray,
                tracker) -> Evidence | None:
        """Shadows whose outcome the emitted text now shows: matched up to the first token that
        differs (the rest counts as verified and rejected, as vLLM counts a draft), or matched whole.
        `slots` are the requests that sampled this step, whose text is token_ids[rows[j], :nums[j]];
        a shadow of any other request (finished, preempted or prefilling) resolves with what its
        text holds after the shadow, every token of it counted as matched. `tracker`: where the requests'
        texts are (`groups.RequestTracker`: `texts[row_of[slot], :length[slot]]`, or `text_from` for a
        text no longer in a row). One compiled pass each (`_kernels._resolve`)."""
        if not self.shadows:
            return None
        held, *found = self._k._resolve(self.shadow_len, self.shadow_tokens, self.shadow_scores, self.shadow_at,
                                        slots, rows, nums, token_ids, False)
        pieces = [found]
        if self.shadows > held:  # shadows of requests that left the batch: from their texts' rows
            away = np.ones(len(self.shadow_len), np.bool_)
            away[slots] = False
            left = np.flatnonzero(away & (self.shadow_len > 0))
            pieces.append(self._k._resolve(self.shadow_len, self.shadow_tokens, self.shadow_scores, self.shadow_at,
                                           left, tracker.row_of[left], tracker.length[left], tracker.texts, True)[1:])
            listed = left[self.shadow_len[left] > 0]  # texts moved out of the rows (they ran out): rare
            if len(listed):
                held_texts = [tracker.text_from(s, 0) for s in listed.tolist()]
                lengths = np.array([len(t) for t in held_texts], np.int64)
                array = np.zeros((len(listed), max(int(lengths.max()), 1)), np.int64)
                for i, t in enumerate(held_texts):
                    array[i, : len(t)] = t
                pieces.append(self._k._resolve(self.shadow_len, self.shadow_tokens, self.shadow_scores, self.shadow_at,
                                               listed, np.arange(len(listed)), lengths, array, True)[1:])
        scores, depth, accepted = pieces[0] if len(pieces) == 1 else (np.concatenate(x) for x in zip(*pieces))
        self.shadows -= len(depth)
        keep = depth > 0
        if not keep.all():
            scores, depth, accepted = scores[keep], depth[keep], accepted[keep]
        return (scores, depth, accepted) if len(depth) else None
