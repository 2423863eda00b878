"""Upper bounds of acceptance, computed from a replay recording without any model (analysis only)."""

from __future__ import annotations

from pathlib import Path

from .replay import Recording


def suffix_chain_bound(recording: Recording | str | Path, source: str, depth: int = 8, max_match: int = 6) -> float:
    """Tokens per step a lone suffix-chain drafter would reach on a recording: at every step a row
    copies the `depth` tokens that followed the longest match (≤ `max_match` tokens) of its prompt +
    completion so far, and accepts the prefix equal to its recorded continuation (+1 bonus).

    source: where it may copy from — "own" (its own text), "siblings" (also its group's other rows,
    up to the same position: rows in lock step) or "whole" (also those rows' whole completions: an
    upper bound of what siblings that ran earlier could give). Pure Python, for analysis."""
    if source not in ("own", "siblings", "whole"):
        raise ValueError(f"source must be 'own', 'siblings' or 'whole', got {source!r}")
    rec = recording if isinstance(recording, Recording) else Recording.load(recording)
    prompts, comps, groups = rec.prompts, rec.completions, rec.row_group.tolist()

    def chain(texts: list[list[int]], ctx: list[int]) -> list[int]:
        for n in range(min(max_match, len(ctx)), 0, -1):
            for text in texts:
                for j in range(len(text) - n - 1, -1, -1):  # latest match first; a continuation must exist
                    if text[j : j + n] == ctx[-n:]:
                        return text[j + n : j + n + depth]
        return []

    steps = tokens = 0
    for r, c in enumerate(comps):
        p, i = prompts[groups[r]], 0
        sibs = [s for s in range(len(comps)) if groups[s] == groups[r] and s != r]
        while i < len(c):
            ctx = p + c[:i]
            texts = [ctx[:-1]]  # own text without its last token: the suffix itself is not a match
            if source != "own":
                texts += [p + (comps[s] if source == "whole" else comps[s][:i]) for s in sibs]
            guess, a = chain(texts, ctx), 0
            while a < len(guess) and i + a < len(c) - 1 and guess[a] == c[i + a]:
                a += 1
            steps, tokens, i = steps + 1, tokens + a + 1, i + a + 1
    return tokens / max(steps, 1)
