"""Tree surgery for grafting (DESIGN.md §2 steps 2–3): tree union (selection: `selection.keep_best`).

- `merge_trees`: the union of two trees per row, where nodes with the same token path are one
  node. The first tree's nodes all survive unchanged in shape (so the result ⊇ the first tree);
  a node of the second tree is dropped when its (merged parent, token) already exists, and its
  children are re-attached to the surviving node. Vectorised level by level over the batch.
"""

from __future__ import annotations

import torch

from .tree import Draft


def _cat(first: Draft, second: Draft) -> Draft:
    m1 = first.tokens.shape[1]
    parents = torch.where(second.parents < 0, -1, second.parents + m1)
    return Draft(
        tokens=torch.cat([first.tokens, second.tokens], 1),
        parents=torch.cat([first.parents, parents], 1),
        depth=torch.cat([first.depth, second.depth], 1),
        valid=torch.cat([first.valid, second.valid], 1),
        score=torch.cat([first.score, second.score], 1),
        source=torch.cat([first.source, second.source], 1),
    )


def merge_trees(first: Draft, second: Draft) -> Draft:
    """Per-row union of two candidate trees with identical token paths merged (never duplicated).

    first, second: Drafts over the same rows and roots. A merged node keeps the first tree's source
    and the larger of the two scores (still non-increasing along every path). Returns a compacted
    Draft with at most `first` + `second` valid nodes per row and no duplicate sibling tokens.
    """
    both = _cat(first, second)
    rows, n = both.tokens.shape
    if n == 0:
        return both
    dev = both.tokens.device
    col = torch.arange(n, device=dev).expand(rows, n)
    canon = col.clone()  # [rows, n] the surviving node each node is merged into
    parents = both.parents.clone()
    keep = both.valid.clone()
    score = both.score.clone()
    vocab = int(both.tokens.max()) + 1
    row_id = torch.arange(rows, device=dev).view(-1, 1)
    for d in range(1, both.max_depth + 1):
        level = both.valid & (both.depth == d)  # [rows, n]
        if not level.any():
            continue
        cparent = torch.where(both.parents < 0, -1, canon.gather(1, both.parents.clamp(min=0)))
        key = ((row_id * (n + 1) + cparent + 1) * vocab + both.tokens)[level]  # (row, merged parent, token)
        uniq, inverse = torch.unique(key, return_inverse=True)
        cols = col[level]
        first_col = torch.full((uniq.numel(),), n, device=dev).scatter_reduce(0, inverse, cols, reduce="amin")
        best = torch.zeros(uniq.numel(), device=dev).scatter_reduce(0, inverse, score[level], reduce="amax")
        canon[level] = first_col[inverse]
        keep[level] = first_col[inverse] == cols
        parents[level] = cparent[level]
        score[level] = best[inverse]
    merged = Draft(both.tokens, parents, both.depth, keep, score.masked_fill(~keep, 0.0), both.source)
    return merged.compacted()


def sibling_duplicates(draft: Draft) -> int:
    """Number of valid nodes whose parent already has a valid child with the same token (tests)."""
    rows, n = draft.tokens.shape
    if n == 0:
        return 0
    same = draft.parents.unsqueeze(2) == draft.parents.unsqueeze(1)
    same &= draft.tokens.unsqueeze(2) == draft.tokens.unsqueeze(1)
    same &= draft.valid.unsqueeze(2) & draft.valid.unsqueeze(1)
    earlier = torch.ones(n, n, dtype=torch.bool, device=draft.tokens.device).tril(-1)  # j < i
    return int((same & earlier).any(2).sum())


def token_paths(draft: Draft, row: int) -> set[tuple[int, ...]]:
    """The token path from the root of every valid node of one row (tests, debugging)."""
    paths: list[tuple[int, ...]] = []
    toks, pars, valid = draft.tokens[row].tolist(), draft.parents[row].tolist(), draft.valid[row].tolist()
    for i, (t, p) in enumerate(zip(toks, pars)):
        paths.append(((paths[p] if p >= 0 else ()) + (t,)) if valid[i] else ())
    return {p for p, v in zip(paths, valid) if v}
