"""The n-gram count tables' rule in plain Python: the reference the vLLM proposer's compiled tables
(`rollout_graft.vllm.ngrams`, numba) are tested against. It is the rule the proposer used before
its tables were compiled."""

from __future__ import annotations

SHRINK = 0.5


class PyNgramCounts:
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

    def teach(self, text: list[int], start: int, end: int | None = None, also: PyNgramCounts | None = None) -> None:
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

    def table(self) -> dict[tuple[int, ...], dict[int, int]]:
        """context → {successor: count}."""
        return {ctx: dict(self.counts.get(ctx) or {hit[0]: hit[1]}) for ctx, hit in self.best.items()}
