"""Test-only proposers: hand-made trees around a known reference (oracle) and random trees."""

from __future__ import annotations

import torch

from rollout_graft.proposers import Proposer, StepContext
from rollout_graft.tree import Draft


class _RowTracking(Proposer):
    """Knows the original row index of every active row."""

    def start(self, prompts, row_prompt, prompt_logits, params):
        self.rows = list(range(len(row_prompt)))

    def select_rows(self, rows):
        self.rows = [self.rows[i] for i in rows.tolist()]


class OracleProposer(_RowTracking):
    """Trees built from reference completions (e.g. plain greedy outputs).

    kind: "right" — a chain of the next `depth` reference tokens;
          "partly" — `depth // 2` right tokens then wrong ones, plus a wrong sibling at each level;
          "wrong"  — a wide tree whose tokens are never the reference token.
    """

    def __init__(self, references: list[list[int]], vocab: int, kind: str, depth: int = 4, max_new_tokens: int = 32):
        self.refs, self.vocab, self.kind, self.depth, self.max_new = references, vocab, kind, depth, max_new_tokens

    def _ref(self, row: int, g: int, k: int) -> list[int]:
        ref = self.refs[row][g : g + k]
        return ref + [(ref[-1] if ref else 0) + 1] * (k - len(ref))

    def _tree(self, row: int, generated: int) -> list[tuple[int, int]]:
        ref = self._ref(row, generated, self.depth)
        wrong = lambda t, j=1: (t + j) % self.vocab  # noqa: E731
        if self.kind == "right":
            return [(t, i - 1) for i, t in enumerate(ref)]
        if self.kind == "partly":
            nodes, parent, good = [], -1, self.depth // 2
            for i, t in enumerate(ref):
                nodes.append((wrong(t, 3), parent))  # a wrong sibling at every level
                nodes.append((t if i < good else wrong(t), parent))
                parent = len(nodes) - 1
            return nodes
        nodes = [(wrong(ref[0], j), -1) for j in range(1, 4)]  # "wrong": 3 wrong children
        nodes += [(wrong(ref[1], j), 0) for j in range(1, 3)]
        return nodes

    def propose(self, ctx: StepContext) -> Draft:
        generated = (self.max_new - ctx.remaining).tolist()
        trees = [self._tree(row, g) for row, g in zip(self.rows, generated)]
        return Draft.from_lists(trees, ctx.last_token.device)


class RandomTreeProposer(_RowTracking):
    """Random trees over a small token range: `width` children per node, `depth` levels (capped
    at `budget`). Seeded by its own generator so the engine's sampling noise is untouched."""

    def __init__(self, vocab: int, width: int = 3, depth: int = 3, seed: int = 0):
        self.vocab, self.width, self.depth = vocab, width, depth
        self.gen = torch.Generator().manual_seed(seed)

    def propose(self, ctx: StepContext) -> Draft:
        trees = []
        for _ in range(ctx.last_token.shape[0]):
            nodes, frontier = [], [-1]
            for _ in range(self.depth):
                nxt = []
                for parent in frontier:
                    toks = torch.randperm(self.vocab, generator=self.gen)[: self.width].tolist()
                    for t in toks:
                        if len(nodes) < ctx.budget:
                            nodes.append((t, parent))
                            nxt.append(len(nodes) - 1)
                frontier = nxt[: self.width]
            trees.append(nodes)
        return Draft.from_lists(trees, ctx.last_token.device)
