"""Retrieval-tree templates: which successor ranks to expand, to what depth (DESIGN.md §2 step 3).

A template is a static tree over *ranks*: node i says "take the r_i-th successor (by target
probability) of my parent's token". The adjacency index turns it into tokens by gathers.

- `breadth_first`: Token-Recycling-like — every node gets `width` children, level by level.
- `best_first`: Graft's asymmetric, stage-adaptive shape — keep the `n_slots` paths with the
  highest prior acceptance Π a[rank]; a rank-0 successor is likelier to be accepted, so it
  gets more children and goes deeper (a strong greedy chain) while lower ranks keep width.
  The shape adapts to the number of slots to fill (the pruning stage).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import torch

DEFAULT_RANK_ACCEPTANCE = (0.55, 0.15, 0.07, 0.04, 0.025, 0.015, 0.01, 0.008)
"""Prior P(the r-th ranked successor is the token the target draws), typical of retrieval."""


@dataclass(frozen=True, slots=True)
class TemplateConfig:
    """Shape of the retrieval trees.

    Args:
        kind: "best_first" (asymmetric, Graft) or "breadth_first" (Token-Recycling-like).
        depth: deepest retrieval node.
        width: most children per node (≤ the index's k).
        rank_acceptance: prior acceptance per successor rank (best_first only).
    """

    kind: Literal["best_first", "breadth_first"] = "best_first"
    depth: int = 8
    width: int = 8
    rank_acceptance: tuple[float, ...] = DEFAULT_RANK_ACCEPTANCE

    def __post_init__(self) -> None:
        from .config import _real, check_types  # config imports this module

        if self.kind not in ("best_first", "breadth_first"):
            raise ValueError(f"template kind must be 'best_first' or 'breadth_first', got {self.kind!r}")
        check_types(self, ints=("depth", "width"))
        if self.depth < 1 or self.width < 1:
            raise ValueError(f"template depth and width must be >= 1, got {self.depth}, {self.width}")
        if not isinstance(self.rank_acceptance, (list, tuple)):
            raise TypeError(f"TemplateConfig.rank_acceptance must be a tuple of probabilities, one per successor rank, "
                            f"e.g. {DEFAULT_RANK_ACCEPTANCE}; got {type(self.rank_acceptance).__name__} "
                            f"{self.rank_acceptance!r}")
        ranks = tuple(_real("every TemplateConfig.rank_acceptance value", a, "a probability such as 0.15")
                      for a in self.rank_acceptance)
        if any(not 0.0 <= a <= 1.0 for a in ranks):  # NaN fails too
            raise ValueError(f"TemplateConfig.rank_acceptance must hold probabilities in [0, 1], got {ranks}")
        object.__setattr__(self, "rank_acceptance", ranks)  # a tuple: templates are cached by config
        if len(self.rank_acceptance) < self.width:
            raise ValueError(f"rank_acceptance needs one value per successor rank up to width={self.width}, got "
                             f"{len(self.rank_acceptance)}: add values or lower width")


@dataclass(frozen=True, slots=True)
class Template:
    parents: torch.Tensor  # [m] int64 parent node index, -1 = child of the root
    ranks: torch.Tensor  # [m] int64 successor rank within the parent's adjacency row
    depth: torch.Tensor  # [m] int64, children of the root = 1
    levels: tuple[torch.Tensor, ...]  # node indices per depth 1..D (parents precede children)

    @property
    def size(self) -> int:
        return int(self.parents.numel())


def _finish(nodes: list[tuple[int, int, int]]) -> Template:
    """nodes: (parent, rank, depth) in an order where parents precede children."""
    parents = torch.tensor([p for p, _, _ in nodes], dtype=torch.long)
    ranks = torch.tensor([r for _, r, _ in nodes], dtype=torch.long)
    depth = torch.tensor([d for _, _, d in nodes], dtype=torch.long)
    top = int(depth.max()) if nodes else 0
    levels = tuple(torch.nonzero(depth == d).flatten() for d in range(1, top + 1))
    return Template(parents, ranks, depth, levels)


def breadth_first(n_slots: int, depth: int, width: int) -> Template:
    nodes: list[tuple[int, int, int]] = []
    frontier = [(-1, 0)]  # (node index, depth)
    while frontier and len(nodes) < n_slots:
        nxt = []
        for parent, d in frontier:
            if d >= depth:
                continue
            for rank in range(width):
                if len(nodes) == n_slots:
                    break
                nodes.append((parent, rank, d + 1))
                nxt.append((len(nodes) - 1, d + 1))
        frontier = nxt
    return _finish(nodes)


def best_first(n_slots: int, depth: int, width: int, rank_acceptance: tuple[float, ...]) -> Template:
    """The n_slots nodes with the largest Π rank_acceptance along their path (ancestor-closed,
    since every factor is < 1). Ties break by insertion order, so the shape is deterministic."""
    nodes: list[tuple[int, int, int]] = []
    heap = [(-rank_acceptance[r], r, -1, r, 1) for r in range(width)]  # (-score, tiebreak, parent, rank, depth)
    heapq.heapify(heap)
    counter = width
    while heap and len(nodes) < n_slots:
        neg, _, parent, rank, d = heapq.heappop(heap)
        nodes.append((parent, rank, d))
        if d < depth:
            me = len(nodes) - 1
            for r in range(width):
                heapq.heappush(heap, (neg * rank_acceptance[r], counter, me, r, d + 1))
                counter += 1
    # re-order breadth-first by depth so that levels are contiguous; parents still precede children
    order = sorted(range(len(nodes)), key=lambda i: (nodes[i][2], i))
    new_index = {old: new for new, old in enumerate(order)}
    return _finish([(new_index.get(nodes[i][0], -1), nodes[i][1], nodes[i][2]) for i in order])


@lru_cache(maxsize=64)
def chain(depth: int) -> Template:
    """One path of `depth` rank-0 successors: the greedy chain (vLLM verifies chains only)."""
    return _finish([(d - 1, 0, d + 1) for d in range(depth)])


@lru_cache(maxsize=256)
def make_template(cfg: TemplateConfig, n_slots: int) -> Template:
    """Template with at most `n_slots` nodes (cached: shapes repeat every step)."""
    if cfg.kind == "breadth_first":
        return breadth_first(n_slots, cfg.depth, cfg.width)
    return best_first(n_slots, cfg.depth, cfg.width, cfg.rank_acceptance)
