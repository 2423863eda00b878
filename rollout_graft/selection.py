"""Keeping a draft's best nodes, for both shapes of verification:

- `keep_best`: each row's best `quota` nodes — our engine's padded [rows, 1 + W] tree forward, whose
  cost is set by its widest row (per-row top-W);
- `keep_global_best`: the batch's best `k` nodes over every (row, node) — vLLM's ragged chains,
  whose step cost follows the number of scheduled tokens (the D-cut paper's global top-K).

A node's score (the prefix product of confidences along its path) never exceeds its parent's, and a
tie goes to the shallower node, then to the earlier one — so a parent always ranks before its child
and the kept nodes stay ancestor-closed.
"""

from __future__ import annotations

import torch

from .tree import Draft


def _rank(score: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """Position of each node in its row's best-first order. score, depth: [rows, m]."""
    by_depth = torch.sort(depth, dim=1, stable=True).indices
    by_score = torch.sort(score.gather(1, by_depth), dim=1, descending=True, stable=True).indices
    order = by_depth.gather(1, by_score)  # [rows, m] node ids, best first
    rows, m = order.shape
    return torch.empty_like(order).scatter_(1, order, torch.arange(m, device=order.device).expand(rows, m))


def _keep(draft: Draft, valid: torch.Tensor) -> Draft:
    parent_kept = torch.where(draft.parents < 0, True, valid.gather(1, draft.parents.clamp(min=0)))
    assert bool((parent_kept | ~valid).all()), "a child scored above its parent: scores must not increase along paths"
    return Draft(draft.tokens, draft.parents, draft.depth, valid, draft.score, draft.source).compacted()


def keep_best(draft: Draft, quota: int | torch.Tensor) -> Draft:
    """Keep the `quota` best valid nodes of every row (an int, or [rows] int64 per row). Returns a
    compacted Draft."""
    if draft.tokens.shape[1] == 0:
        return draft
    quota = torch.as_tensor(quota, device=draft.tokens.device).view(-1, 1)
    score = draft.score.masked_fill(~draft.valid, -1.0)
    return _keep(draft, draft.valid & (_rank(score, draft.depth) < quota))


def keep_global_best(draft: Draft, k: int) -> Draft:
    """Keep the `k` best valid nodes of the whole batch (ties: shallower, then lower row and
    index). Returns a compacted Draft."""
    rows, m = draft.tokens.shape
    if m == 0:
        return draft
    score = draft.score.masked_fill(~draft.valid, -1.0).reshape(1, -1)
    rank = _rank(score, draft.depth.reshape(1, -1)).view(rows, m)
    return _keep(draft, draft.valid & (rank < k))
