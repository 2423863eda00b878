"""Keeping a draft's best nodes, for both shapes of verification:

- `keep_best`: each row's best `quota` nodes of a draft tree — our engine's padded [rows, 1 + W]
  tree forward, whose cost is set by its widest row (per-row top-W);
- `global_top_k_depths`: the batch's best `k` tokens over every (request, depth) of draft chains —
  vLLM's ragged chains, whose step cost follows the number of scheduled tokens (the D-cut paper's
  global top-K); numpy, as the vLLM proposer's arrays are.

A node's score (the prefix product of confidences along its path) never exceeds its parent's, and a
tie goes to the shallower node, then to the earlier one — so a parent always ranks before its child
and the kept nodes stay ancestor-closed.
"""

from __future__ import annotations

import numpy as np
import torch

from .tree import Draft


def _rank(depth: torch.Tensor, *scores: torch.Tensor) -> torch.Tensor:
    """Position of each node in its row's best-first order: by `scores` (the first decides, the next
    break its ties), then the shallower, then the earlier. depth, scores: [rows, m]."""
    order = torch.sort(depth, dim=1, stable=True).indices
    for score in reversed(scores):
        order = order.gather(1, torch.sort(score.gather(1, order), dim=1, descending=True, stable=True).indices)
    rows, m = order.shape
    return torch.empty_like(order).scatter_(1, order, torch.arange(m, device=order.device).expand(rows, m))


def _keep(draft: Draft, valid: torch.Tensor) -> Draft:
    parent_kept = torch.where(draft.parents < 0, True, valid.gather(1, draft.parents.clamp(min=0)))
    assert bool((parent_kept | ~valid).all()), "a child scored above its parent: scores must not increase along paths"
    return Draft(draft.tokens, draft.parents, draft.depth, valid, draft.score, draft.source).compacted()


def keep_best(draft: Draft, quota: int | torch.Tensor, score: torch.Tensor | None = None) -> Draft:
    """Keep the `quota` best valid nodes of every row (an int, or [rows] int64 per row), best by
    `score` [rows, m] (non-increasing along every path, as `Draft.path_min` makes it), its ties
    broken by the draft's own scores (None: by those alone). Returns a compacted Draft."""
    if draft.tokens.shape[1] == 0:
        return draft
    quota = torch.as_tensor(quota, device=draft.tokens.device).view(-1, 1)
    scores = [draft.score] if score is None else [score, draft.score]  # the draft's own scores break ties
    rank = _rank(draft.depth, *(s.masked_fill(~draft.valid, -1.0) for s in scores))
    return _keep(draft, draft.valid & (rank < quota))


def global_top_k_order(scores: np.ndarray) -> np.ndarray:
    """The batch's draft tokens with a score > 0, best first, as flat indices into scores [rows,
    depth] (non-increasing along each row): a shallower token wins a tie (its child cannot be kept
    without it), so every prefix of the order keeps each row's leading tokens."""
    rows, depth = scores.shape
    flat = scores.reshape(-1)
    return np.lexsort((np.tile(np.arange(depth), rows), -flat))[: int((flat > 0).sum())]


def global_top_k_depths(scores: np.ndarray, k: int, order: np.ndarray | None = None) -> np.ndarray:
    """Depth per row of the batch's k best draft tokens. scores: [rows, depth], non-increasing
    along each row (0 where a row has no token); `order`: its `global_top_k_order`, where the caller
    has it. Returns [rows] int: how many of each row's leading tokens are among the global top k."""
    rows, depth = scores.shape
    if k <= 0 or scores.size == 0:
        return np.zeros(rows, dtype=np.int64)
    order = global_top_k_order(scores) if order is None else order
    return np.bincount(order[:k] // depth, minlength=rows).astype(np.int64)
