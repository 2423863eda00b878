"""Flattened draft trees for a batch (DESIGN.md §3).

A proposer returns a `Draft`: candidate nodes only, padded to `[batch, m]`. The engine turns it
into a `TreeBatch` by putting the root — the last committed token, whose KV is not cached yet —
at node 0. Invariants (checked by `Draft.validate` in tests): a node's parent precedes it,
parent -1 means "child of the root", invalid (padding) nodes have no valid descendants.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DRAFT, RETRIEVAL, SUFFIX = 0, 1, 2
"""Node sources: a drafter's tree, the adjacency index's tree, a suffix chain copied from text."""
SOURCES = (DRAFT, RETRIEVAL, SUFFIX)
"""Values of `Draft.source`."""


@dataclass(slots=True)
class Draft:
    """Candidate nodes proposed for each sequence (the root is not included)."""

    tokens: torch.Tensor  # [batch, m] int64 candidate token ids (0 where invalid)
    parents: torch.Tensor  # [batch, m] int64 parent candidate index, -1 = child of the root
    depth: torch.Tensor  # [batch, m] int64 depth below the root (children of the root: 1)
    valid: torch.Tensor  # [batch, m] bool, False = padding
    score: torch.Tensor  # [batch, m] float32 estimated P(verification reaches and accepts node)
    source: torch.Tensor  # [batch, m] int8 DRAFT, RETRIEVAL or SUFFIX

    @staticmethod
    def empty(batch: int, device: torch.device | str) -> "Draft":
        z = torch.zeros(batch, 0, dtype=torch.long, device=device)
        return Draft(z, z, z, z.bool(), z.float(), z.to(torch.int8))

    @staticmethod
    def from_lists(trees: list[list[tuple[int, int]]], device: torch.device | str = "cpu") -> "Draft":
        """Build from per-sequence lists of (token, parent) pairs — for tests and simple proposers."""
        b, m = len(trees), max((len(t) for t in trees), default=0)
        tokens = torch.zeros(b, m, dtype=torch.long)
        parents = torch.full((b, m), -1, dtype=torch.long)
        depth = torch.ones(b, m, dtype=torch.long)
        valid = torch.zeros(b, m, dtype=torch.bool)
        for row, nodes in enumerate(trees):
            for i, (tok, par) in enumerate(nodes):
                if par >= i:
                    raise ValueError(f"node {i} of row {row}: parent {par} must precede it")
                tokens[row, i], parents[row, i], valid[row, i] = tok, par, True
                depth[row, i] = 1 if par < 0 else int(depth[row, par]) + 1
        score = valid.float()
        source = torch.zeros(b, m, dtype=torch.int8)
        return Draft(tokens, parents, depth, valid, score, source).to(device)

    def to(self, device: torch.device | str) -> "Draft":
        return Draft(*(getattr(self, f).to(device) for f in Draft.__slots__))

    @property
    def max_depth(self) -> int:
        return int(self.depth.masked_fill(~self.valid, 0).max()) if self.valid.numel() else 0

    def path_min(self, values: torch.Tensor) -> torch.Tensor:
        """values [batch, m] made non-increasing along every path: each node's the least of its own
        and its ancestors' (a node is accepted only where its parent is, so its estimated acceptance
        is at most its parent's)."""
        m = values.shape[1]
        # pointer jumping: after round r each node holds the least over itself and its 2^r - 1 nearest
        # ancestors (a child of the root points at itself); a path has at most m nodes, so the rounds
        # follow from the shape and need no host read of the depth
        up = torch.where(self.parents < 0, torch.arange(m, device=values.device), self.parents)
        out = values
        for _ in range(max(m - 1, 0).bit_length()):
            out = torch.minimum(out, out.gather(1, up))
            up = up.gather(1, up)
        return out

    def compacted(self) -> "Draft":
        """Valid nodes first (order kept, parents remapped), padding columns dropped."""
        if self.tokens.shape[1] == 0:
            return self
        width = int(self.valid.sum(1).max())
        order = torch.sort((~self.valid).to(torch.int8), dim=1, stable=True).indices[:, :width]
        new_pos = self.valid.long().cumsum(1) - 1  # [batch, m] new index of each valid node
        parents = torch.where(self.parents < 0, -1, new_pos.gather(1, self.parents.clamp(min=0)))
        fields = dict(tokens=self.tokens, parents=parents, depth=self.depth, valid=self.valid,
                      score=self.score, source=self.source)
        return Draft(**{k: v.gather(1, order) for k, v in fields.items()})

    def validate(self) -> None:
        """Assert the structural invariants (for tests and debugging)."""
        idx = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        assert bool((self.parents < idx).all()), "a parent must precede its child"
        par = self.parents.clamp(min=0)
        parent_valid = torch.where(self.parents < 0, True, self.valid.gather(1, par))
        assert bool((parent_valid | ~self.valid).all()), "a valid node has an invalid parent"
        parent_depth = torch.where(self.parents < 0, 0, self.depth.gather(1, par))
        assert bool(((parent_depth + 1 == self.depth) | ~self.valid).all()), "depth != parent depth + 1"


@dataclass(slots=True)
class TreeBatch:
    """Root + candidates: what one verify forward sees. Node 0 is the root of every row."""

    tokens: torch.Tensor  # [batch, n] int64
    parents: torch.Tensor  # [batch, n] int64, root's parent = 0 (itself)
    depth: torch.Tensor  # [batch, n] int64, root = 0
    valid: torch.Tensor  # [batch, n] bool
    max_depth: int

    @staticmethod
    def from_draft(root_tokens: torch.Tensor, draft: Draft) -> "TreeBatch":
        """root_tokens: [batch] last committed tokens."""
        root = root_tokens.view(-1, 1)
        ones = torch.ones_like(root)
        return TreeBatch(
            tokens=torch.cat([root, draft.tokens], 1),
            parents=torch.cat([ones * 0, draft.parents + 1], 1),  # candidate -1 → root (0)
            depth=torch.cat([ones * 0, draft.depth.masked_fill(~draft.valid, 0)], 1),
            valid=torch.cat([ones.bool(), draft.valid], 1),
            max_depth=draft.max_depth,
        )

    def ancestor_mask(self) -> torch.Tensor:
        """[batch, n, n] bool: mask[b, i, j] = node j is node i or one of its ancestors.

        mask[i] = mask[parent[i]] ∪ {i}; iterating max_depth times reaches the root.
        Padding nodes see themselves and the root only (their outputs are ignored).
        """
        b, n = self.tokens.shape
        eye = torch.eye(n, dtype=torch.bool, device=self.tokens.device).expand(b, n, n)
        mask = eye
        parent_rows = self.parents.unsqueeze(-1).expand(b, n, n)
        for _ in range(self.max_depth):
            mask = eye | mask.gather(1, parent_rows)
        return mask
