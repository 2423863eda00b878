"""AdjacencyIndex: per-group successor tables fed by the target's own logits (DESIGN.md §3).

Row t of a group's table holds the top-k successors of token t as the target last saw them
(ids + probabilities). `update` overwrites rows from verification logits — accepted and rejected
nodes alike, the logits were computed anyway; `lookup` expands a retrieval tree from a root
token along a `Template` with one gather per depth level (no per-node Python).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .templates import Template
from .tree import RETRIEVAL, Draft

EMPTY = -1  # successor id of a never-written slot


def _merge_rows(ids_a, p_a, ids_b, p_b, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the union of two successor lists [N, k] (a duplicate id keeps its larger prob)."""
    ids = torch.cat([ids_a, ids_b], 1)  # [N, 2k]
    p = torch.cat([p_a, p_b], 1).masked_fill(ids == EMPTY, -1.0)
    p, order = torch.sort(p, dim=1, descending=True)
    ids = ids.gather(1, order)
    same = ids.unsqueeze(2) == ids.unsqueeze(1)  # [N, 2k, 2k]
    dup = (same & torch.ones_like(same[0]).tril(-1)).any(2)  # an earlier (larger) copy exists
    p = p.masked_fill(dup, -1.0)
    p, keep = torch.topk(p, k, dim=1)
    ids = ids.gather(1, keep).masked_fill(p < 0, EMPTY)
    return ids, p.clamp(min=0.0)


class AdjacencyIndex:
    """`[groups, V, k]` successor ids and probabilities on one device."""

    def __init__(self, ids: torch.Tensor, probs: torch.Tensor):
        self.ids = ids  # [groups, V, k] int64, EMPTY where unknown
        self.probs = probs  # [groups, V, k] float16 target probability of each successor

    @staticmethod
    def empty(groups: int, vocab: int, k: int, device: torch.device | str = "cpu") -> "AdjacencyIndex":
        ids = torch.full((groups, vocab, k), EMPTY, dtype=torch.long, device=device)
        return AdjacencyIndex(ids, torch.zeros(groups, vocab, k, dtype=torch.float16, device=device))

    @property
    def groups(self) -> int:
        return self.ids.shape[0]

    @property
    def vocab(self) -> int:
        return self.ids.shape[1]

    @property
    def k(self) -> int:
        return self.ids.shape[2]

    def expand(self, groups: int) -> "AdjacencyIndex":
        """A fresh index of `groups` copies of group 0 (a prior → one table per group)."""
        return AdjacencyIndex(self.ids[:1].repeat(groups, 1, 1), self.probs[:1].repeat(groups, 1, 1))

    # ------------------------------------------------------------------ learn
    def update(self, group: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor, decay: float = 0.0) -> None:
        """Write the top-k of the distribution that follows each token into that token's row.

        group, tokens: [N]; probs: [N, V] target next-token probabilities at each position.
        decay = 0 overwrites the row (Token Recycling); decay > 0 merges: the row becomes the top-k
        of the new successors ∪ the old ones with probabilities × decay, so successors seen in a
        sibling's context stay as alternatives behind the fresh ones. When one (group, token) row
        is written several times in a call, the last occurrence wins.
        """
        if tokens.numel() == 0:
            return
        top_p, top_i = torch.topk(probs.float(), self.k, dim=-1)  # [N, k]
        top_i = top_i.masked_fill(top_p <= 0, EMPTY)
        key = group * self.vocab + tokens  # [N]
        uniq, inverse = torch.unique(key, return_inverse=True)
        pos = torch.arange(key.numel(), device=key.device)
        last = torch.full((uniq.numel(),), -1, dtype=torch.long, device=key.device).scatter_reduce(
            0, inverse, pos, reduce="amax"
        )
        g, t, new_i, new_p = group[last], tokens[last], top_i[last], top_p[last]
        if decay > 0:
            new_i, new_p = _merge_rows(new_i, new_p, self.ids[g, t], self.probs[g, t].float() * decay, self.k)
        self.ids[g, t] = new_i
        self.probs[g, t] = new_p.to(self.probs.dtype)

    # ------------------------------------------------------------------ draft
    def lookup(self, group: torch.Tensor, root: torch.Tensor, template: Template) -> Draft:
        """Retrieval tree per row. group, root: [rows] → Draft with template.size nodes per row."""
        rows, m = root.shape[0], template.size
        dev = root.device
        tokens = torch.zeros(rows, m, dtype=torch.long, device=dev)
        score = torch.zeros(rows, m, dtype=torch.float32, device=dev)
        valid = torch.zeros(rows, m, dtype=torch.bool, device=dev)
        parents = template.parents.to(dev)
        ranks = template.ranks.to(dev)
        g = group.view(rows, 1)
        for level in template.levels:
            level = level.to(dev)
            par = parents[level]  # [L]
            at_root = (par < 0).view(1, -1)
            pidx = par.clamp(min=0).view(1, -1).expand(rows, -1)
            ptok = torch.where(at_root, root.view(rows, 1), tokens.gather(1, pidx))  # [rows, L]
            pvalid = torch.where(at_root, True, valid.gather(1, pidx))
            pscore = torch.where(at_root, 1.0, score.gather(1, pidx))
            r = ranks[level].view(1, -1).expand(rows, -1)
            ids = self.ids[g, ptok, r]  # [rows, L]
            p = self.probs[g, ptok, r].float()
            ok = pvalid & (ids != EMPTY)
            tokens[:, level] = ids.clamp(min=0).masked_fill(~ok, 0)
            valid[:, level] = ok
            score[:, level] = (pscore * p).masked_fill(~ok, 0.0)
        depth = template.depth.to(dev).view(1, m).expand(rows, m)
        source = torch.full((rows, m), RETRIEVAL, dtype=torch.int8, device=dev)
        return Draft(tokens, parents.view(1, m).expand(rows, m), depth, valid, score, source)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        save_file({"ids": self.ids.cpu().contiguous(), "probs": self.probs.cpu().contiguous()}, str(path))

    @staticmethod
    def load(path: str | Path, device: torch.device | str = "cpu") -> "AdjacencyIndex":
        t = load_file(str(path), device=str(device))
        ids, probs = t["ids"], t["probs"]
        if ids.dim() == 2:
            ids, probs = ids.unsqueeze(0), probs.unsqueeze(0)
        return AdjacencyIndex(ids.long(), probs.to(torch.float16))
