"""NgramCounts: how often each token followed each context of 1…order tokens, for draft chains.

The draft sources of our vLLM proposer are count tables over text: one per GRPO group (its
prompt, every sibling's completion so far, a previous epoch's completions: `TextIndex`) and one
global table over every completion this proposer has seen, kept across rollouts (the prior). A
chain continues a request's text greedily: each next token is the most frequent successor (ties:
the lower token id — tokenizers number frequent tokens first) of the longest context (the last
`order` tokens or fewer, of the text and the chain so far) that the table has seen. Its
confidence is

    count / (total + 0.5) · n / (n + 1)

for a successor seen `count` times among the `total` successors of a context of n tokens: the
successor's share, shrunk for contexts seen rarely (seen once: 2/3, not 1) and for short
contexts (a match of one token says less than a match of four). A chain's scores are the prefix
products: the raw scores the budget policy calibrates against acceptance and ranks by. This is
suffix decoding's estimate (Arctic Inference: count(child) / count(node) along a path of its
suffix tree, whose drafts its `max_spec_factor` bounds by the match length), with contexts of at
most `order` tokens that back off to shorter ones within a chain. By replay
(`scripts/replay_vllm.py`, docs/BENCHMARKS.md "Chains by replay") the two shrink factors raised
MAT at equal draft tokens on every recording; without them the ranking was below suffix decoding's.

Counts do not depend on the order they are made in, and neither does a chain (the tie rule reads
counts and token ids only). Teaching a text position costs `order` dict updates; a chain token at
most `order` dict reads. The tables hold tuples and dicts of ints only, which Python's garbage
collector stops tracking (a table of lists made collections ~18 % of `propose`'s time at batch 256).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SHRINK = 0.5
"""Added to a context's total in a confidence: count / (total + SHRINK)."""


class NgramCounts:
    """context (1…`order` tokens, at least `min_order`) → successor counts, and each context's
    most frequent successor (ties: the lower token id). `max_contexts`: when the table holds more
    contexts, it starts over from empty (a bound on memory for a table that learns forever)."""

    def __init__(self, order: int = 4, min_order: int = 1, max_contexts: int | None = None):
        self.order, self.min_order, self.max_contexts = order, min_order, max_contexts
        self.best: dict[tuple[int, ...], tuple[int, int, int]] = {}  # context → (token, its count, total)
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}  # successor counts of contexts with ≥ 2 successors
        self.resets = 0  # times the table started over (max_contexts)

    def __len__(self) -> int:
        return len(self.best)

    def teach(self, text: list[int], start: int, end: int | None = None, also: NgramCounts | None = None) -> None:
        """Count text[i] as the successor of its preceding contexts, for i in [start, end); `also`
        (a table of the same context lengths) counts them too. Most contexts have one successor
        only: they are a `best` entry and no `counts` dict."""
        tables = [(self.best, self.counts)] + ([(also.best, also.counts)] if also is not None else [])
        lo, hi = self.min_order, self.order
        for i in range(max(start, lo), len(text) if end is None else end):
            tok = text[i]
            window = tuple(text[max(i - hi, 0) : i])
            size = len(window)
            for n in range(lo, size + 1):
                ctx = window[size - n :]
                for best, counts in tables:
                    hit = best.get(ctx)
                    if hit is None:
                        best[ctx] = (tok, 1, 1)
                        continue
                    b_tok, b_c, total = hit
                    if tok == b_tok:
                        best[ctx] = (tok, b_c + 1, total + 1)
                        if total != b_c:  # other successors were seen: their counts are kept
                            counts[ctx][tok] = b_c + 1
                        continue
                    succ = counts.get(ctx)
                    if succ is None:
                        succ = counts[ctx] = {b_tok: b_c}
                    c = succ.get(tok, 0) + 1
                    succ[tok] = c
                    if c > b_c or (c == b_c and tok < b_tok):
                        best[ctx] = (tok, c, total + 1)
                    else:
                        best[ctx] = (b_tok, b_c, total + 1)
        for table in (self, also):
            if table is not None and table.max_contexts is not None and len(table.best) > table.max_contexts:
                table.best, table.counts = {}, {}
                table.resets += 1

    def chain(self, context: list[int], depth: int) -> tuple[list[int], list[float]]:
        """Up to `depth` tokens continuing `context` (its last `order` tokens are read) and their
        scores (prefix products of the confidences); stops where no context is known."""
        best, lo, order = self.best, self.min_order, self.order
        window = tuple(context[-order:])
        tokens: list[int] = []
        scores: list[float] = []
        score = 1.0
        while len(tokens) < depth:
            size = len(window)
            for n in range(size, lo - 1, -1):
                hit = best.get(window[size - n :])
                if hit is not None:
                    break
            else:
                break
            tok, c, total = hit
            score *= c / (total + SHRINK) * n / (n + 1)
            tokens.append(tok)
            scores.append(score)
            window = (window + (tok,))[-order:]
        return tokens, scores

    # ------------------------------------------------------------------ persistence
    def successors(self, ctx: tuple[int, ...]) -> dict[int, int]:
        """How often each token followed `ctx`."""
        hit = self.best.get(ctx)
        return {} if hit is None else dict(self.counts.get(ctx) or {hit[0]: hit[1]})

    def save(self, path: str | Path) -> None:
        """The counts as safetensors: `contexts` [n, order] (right-aligned, -1 before a shorter
        context), `successors` [n] and `counts` [n], one row per (context, successor)."""
        from safetensors.numpy import save_file

        ctx, succ, cnt = [], [], []
        for key in self.best:
            pad = (-1,) * (self.order - len(key)) + key
            for tok, c in self.successors(key).items():
                ctx.append(pad)
                succ.append(tok)
                cnt.append(c)
        save_file({"contexts": np.array(ctx, dtype=np.int64).reshape(-1, self.order),
                   "successors": np.array(succ, dtype=np.int64), "counts": np.array(cnt, dtype=np.int64),
                   "order": np.array([self.order, self.min_order], dtype=np.int64)}, str(path))

    def load(self, path: str | Path) -> None:
        """Add the counts `save` wrote to this table (same context lengths)."""
        from safetensors.numpy import load_file

        data = load_file(str(path))
        if "contexts" not in data:
            raise ValueError(f"{path} is not an n-gram prior saved by the vLLM backend (keys {sorted(data)}): "
                             "pass the prior.safetensors that `save_state` (or TRL's graft_vllm_state) wrote; "
                             "the engine's adjacency prior (graft_prior.safetensors) is a different table")
        order, min_order = data["order"].tolist()
        if (order, min_order) != (self.order, self.min_order):
            raise ValueError(f"{path} counts contexts of {min_order}…{order} tokens but this table counts "
                             f"{self.min_order}…{self.order}: set min_match={min_order}, max_match={order}")
        merged: dict[tuple[int, ...], dict[int, int]] = {}
        for key in self.best:
            merged[key] = self.successors(key)
        for row, tok, c in zip(data["contexts"].tolist(), data["successors"].tolist(), data["counts"].tolist()):
            succ = merged.setdefault(tuple(t for t in row if t >= 0), {})
            succ[tok] = succ.get(tok, 0) + c
        self.best, self.counts = {}, {}
        for key, succ in merged.items():
            tok = min(succ, key=lambda t: (-succ[t], t))
            self.best[key] = (tok, succ[tok], sum(succ.values()))
            if len(succ) > 1:
                self.counts[key] = succ
