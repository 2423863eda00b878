"""AdjacencyIndex: per-group successor tables fed by the target's own logits (DESIGN.md §3).

Row t of a group's table holds the top-k successors of token t as the target last saw them
(ids + probabilities). `update` overwrites rows from verification logits — accepted and rejected
nodes alike, the logits were computed anyway; `lookup` expands a retrieval tree from a root
token along a `Template` with one gather per depth level (no per-node Python).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .files import atomic_save_safetensors, load_safetensors
from .templates import Template
from .tree import RETRIEVAL, Draft

EMPTY = -1  # successor id of a never-written slot


def _last_occurrence(keys: torch.Tensor) -> torch.Tensor:
    """Index of the last occurrence of each distinct key in `keys` [N]."""
    uniq, inverse = torch.unique(keys, return_inverse=True)
    pos = torch.arange(keys.numel(), device=keys.device)
    return torch.full((uniq.numel(),), -1, dtype=torch.long, device=keys.device).scatter_reduce(
        0, inverse, pos, reduce="amax")


def _write(ids: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor, new_i: torch.Tensor, new_p: torch.Tensor,
           decay: float, same: torch.Tensor | None) -> None:
    """Write successor lists into flat tables ids/probs [R, k] at `rows` [N] (last occurrence wins).
    same: [N] bool where merging is allowed (None: everywhere; already deduplicated if given)."""
    if same is None:
        last = _last_occurrence(rows)
        rows, new_i, new_p = rows[last], new_i[last], new_p[last]
    if decay > 0:
        merged_i, merged_p = _merge_rows(new_i, new_p, ids[rows], probs[rows].float() * decay, ids.shape[1])
        if same is not None:
            merged_i = torch.where(same.view(-1, 1), merged_i, new_i)
            merged_p = torch.where(same.view(-1, 1), merged_p, new_p)
        new_i, new_p = merged_i, merged_p
    ids[rows] = new_i
    probs[rows] = new_p.to(probs.dtype)


def _merge_rows(ids_a, p_a, ids_b, p_b, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the union of two successor lists [N, k] (a duplicate id keeps its larger prob)."""
    ids = torch.cat([ids_a, ids_b], 1)  # [N, 2k]
    p = torch.cat([p_a, p_b], 1).masked_fill(ids == EMPTY, -1.0)
    p, order = torch.sort(p, dim=1, descending=True)
    ids = ids.gather(1, order)
    same = ids.unsqueeze(2) == ids.unsqueeze(1)  # [N, 2k, 2k]
    earlier = torch.ones(same.shape[1:], dtype=torch.bool, device=ids.device).tril(-1)  # not same[0]: N may be 0
    dup = (same & earlier).any(2)  # an earlier (larger) copy exists
    p = p.masked_fill(dup, -1.0)
    p, keep = torch.topk(p, k, dim=1)
    ids = ids.gather(1, keep).masked_fill(p < 0, EMPTY)
    return ids, p.clamp(min=0.0)


_HASH_MUL = 1_000_003


class AdjacencyIndex:
    """`[groups, V, k]` successor ids and probabilities on one device, plus an optional
    second-order table keyed by (previous token, token), hashed into `H` rows and tagged so a
    hash collision reads as a miss. Lookups use the second-order row when it holds the exact
    context and back off to the first-order row otherwise: "7" after "=" and "7" after "4" get
    different successors, which is what makes a sibling's arithmetic reusable."""

    def __init__(self, ids: torch.Tensor, probs: torch.Tensor, ctx_ids: torch.Tensor | None = None,
                 ctx_probs: torch.Tensor | None = None, ctx_tag: torch.Tensor | None = None):
        self.ids = ids  # [groups, V, k] int64, EMPTY where unknown
        self.probs = probs  # [groups, V, k] float16 target probability of each successor
        self.ctx_ids = ctx_ids  # [groups, H, k] int64 second-order successors (None: first order only)
        self.ctx_probs = ctx_probs  # [groups, H, k] float16
        self.ctx_tag = ctx_tag  # [groups, H] int64 prev * V + token stored in each row, EMPTY if unused

    @staticmethod
    def empty(groups: int, vocab: int, k: int, device: torch.device | str = "cpu", context_rows: int = 0) -> "AdjacencyIndex":
        ids = torch.full((groups, vocab, k), EMPTY, dtype=torch.long, device=device)
        probs = torch.zeros(groups, vocab, k, dtype=torch.float16, device=device)
        if context_rows <= 0:
            return AdjacencyIndex(ids, probs)
        ctx_ids = torch.full((groups, context_rows, k), EMPTY, dtype=torch.long, device=device)
        ctx_probs = torch.zeros(groups, context_rows, k, dtype=torch.float16, device=device)
        ctx_tag = torch.full((groups, context_rows), EMPTY, dtype=torch.long, device=device)
        return AdjacencyIndex(ids, probs, ctx_ids, ctx_probs, ctx_tag)

    @property
    def groups(self) -> int:
        return self.ids.shape[0]

    @property
    def vocab(self) -> int:
        return self.ids.shape[1]

    @property
    def k(self) -> int:
        return self.ids.shape[2]

    @property
    def context_rows(self) -> int:
        return 0 if self.ctx_ids is None else self.ctx_ids.shape[1]

    def expand(self, groups: int) -> "AdjacencyIndex":
        """A fresh index of `groups` copies of group 0 (a prior → one table per group)."""
        rep = lambda t: None if t is None else t[:1].repeat(groups, *([1] * (t.dim() - 1)))  # noqa: E731
        return AdjacencyIndex(rep(self.ids), rep(self.probs), rep(self.ctx_ids), rep(self.ctx_probs), rep(self.ctx_tag))

    def _ctx_row(self, prev: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hashed row and exact tag of the context (prev, token)."""
        tag = prev * self.vocab + tokens
        return (prev * _HASH_MUL + tokens) % self.context_rows, tag

    # ------------------------------------------------------------------ learn
    def update(self, group: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor, decay: float = 0.0,
               prev: torch.Tensor | None = None) -> None:
        """Write the top-k of the distribution that follows each token into that token's row.

        group, tokens: [N]; probs: [N, V] target next-token probabilities at each position;
        prev: [N] the token before each position (-1 unknown), for the second-order table.
        decay = 0 overwrites the row (Token Recycling); decay > 0 merges: the row becomes the top-k
        of the new successors ∪ the old ones with probabilities × decay, so successors seen in a
        sibling's context stay as alternatives behind the fresh ones. When one row is written
        several times in a call, the last occurrence wins.
        """
        if tokens.numel() == 0:
            return
        top_p, top_i = torch.topk(probs.float(), self.k, dim=-1)  # [N, k]
        self.update_topk(group, tokens, top_i, top_p, decay, prev)

    def update_topk(self, group: torch.Tensor, tokens: torch.Tensor, top_i: torch.Tensor, top_p: torch.Tensor,
                    decay: float = 0.0, prev: torch.Tensor | None = None) -> None:
        """`update` from the top-k successors already extracted: top_i, top_p [N, k], probabilities
        descending (`sampling.top_k_probs` gets them from logits without a full softmax)."""
        if tokens.numel() == 0:
            return
        top_i = top_i.masked_fill(top_p <= 0, EMPTY)
        _write(self.ids.view(-1, self.k), self.probs.view(-1, self.k), group * self.vocab + tokens,
               top_i, top_p, decay, same=None)
        if self.ctx_ids is None or prev is None:
            return
        known = prev >= 0
        row, tag = self._ctx_row(prev[known], tokens[known])
        flat = group[known] * self.context_rows + row
        tags = self.ctx_tag.view(-1)
        last = _last_occurrence(flat)
        same = tags[flat[last]] == tag[last]  # same context already stored: merge; else replace
        _write(self.ctx_ids.view(-1, self.k), self.ctx_probs.view(-1, self.k), flat[last],
               top_i[known][last], top_p[known][last], decay, same=same)
        tags[flat[last]] = tag[last]

    # ------------------------------------------------------------------ draft
    def lookup(self, group: torch.Tensor, root: torch.Tensor, template: Template,
               prev_root: torch.Tensor | None = None) -> Draft:
        """Retrieval tree per row. group, root, prev_root (token before the root, -1 unknown): [rows]
        → Draft with template.size nodes per row."""
        rows, m = root.shape[0], template.size
        dev = root.device
        tokens = torch.zeros(rows, m, dtype=torch.long, device=dev)
        score = torch.zeros(rows, m, dtype=torch.float32, device=dev)
        valid = torch.zeros(rows, m, dtype=torch.bool, device=dev)
        parents = template.parents.to(dev)
        ranks = template.ranks.to(dev)
        g = group.view(rows, 1)
        use_ctx = self.ctx_ids is not None and prev_root is not None
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
            if use_ctx:  # grandparent token: the token before the parent
                gpar = parents[par.clamp(min=0)].view(1, -1)
                gtok = torch.where(gpar < 0, root.view(rows, 1), tokens.gather(1, gpar.clamp(min=0).expand(rows, -1)))
                gtok = torch.where(at_root, prev_root.view(rows, 1), gtok)
                row, tag = self._ctx_row(gtok.clamp(min=0), ptok)
                hit = (gtok >= 0) & (self.ctx_tag[g, row] == tag)
                ids = torch.where(hit, self.ctx_ids[g, row, r], ids)
                p = torch.where(hit, self.ctx_probs[g, row, r].float(), p)
            ok = pvalid & (ids != EMPTY)
            tokens[:, level] = ids.clamp(min=0).masked_fill(~ok, 0)
            valid[:, level] = ok
            score[:, level] = (pscore * p).masked_fill(~ok, 0.0)
        depth = template.depth.to(dev).view(1, m).expand(rows, m)
        source = torch.full((rows, m), RETRIEVAL, dtype=torch.int8, device=dev)
        return Draft(tokens, parents.view(1, m).expand(rows, m), depth, valid, score, source)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write the index as safetensors, atomically (an interrupted save leaves the old file)."""
        fields = {"ids": self.ids, "probs": self.probs, "ctx_ids": self.ctx_ids, "ctx_probs": self.ctx_probs,
                  "ctx_tag": self.ctx_tag}
        atomic_save_safetensors({k: v.cpu().contiguous() for k, v in fields.items() if v is not None}, path)

    @staticmethod
    def load(path: str | Path, device: torch.device | str = "cpu") -> "AdjacencyIndex":
        """The index `save` wrote; ValueError naming `path` when it is unreadable or malformed (`_check_saved`)."""
        t = load_safetensors(path, "the adjacency prior")
        _check_saved(t, path)
        ctx = [t[k].to(device) if k in t else None for k in ("ctx_ids", "ctx_probs", "ctx_tag")]
        return AdjacencyIndex(t["ids"].long().to(device), t["probs"].to(torch.float16).to(device),
                              None if ctx[0] is None else ctx[0].long(),
                              None if ctx[1] is None else ctx[1].to(torch.float16), None if ctx[2] is None else ctx[2].long())


def _check_saved(t: dict[str, torch.Tensor], path) -> None:
    """A saved index: `ids` [groups, V, k] integer successor ids in [0, V) or EMPTY, `probs` of
    the same shape, finite and in [0, 1]; the second-order table complete or absent, its ids
    alike and its tags in [0, V²) or EMPTY."""
    def bad(what: str) -> ValueError:
        return ValueError(f"the adjacency prior {path} {what}: it is corrupt or not a prior saved by "
                          "rollout_graft (`save_prior`, graft_prior.safetensors); warm or save it again")

    if "ids" not in t or "probs" not in t:
        raise bad(f"lacks tensor(s) {[k for k in ('ids', 'probs') if k not in t]} (has {sorted(t)})")
    ids, probs = t["ids"], t["probs"]
    if ids.dim() != 3 or probs.shape != ids.shape or 0 in ids.shape:
        raise bad(f"has ids {list(ids.shape)} and probs {list(probs.shape)}; both must be [groups, vocab, k], non-empty")
    vocab = ids.shape[1]
    ctx = [k for k in ("ctx_ids", "ctx_probs", "ctx_tag") if k in t]
    if ctx and len(ctx) != 3:
        raise bad(f"has only {ctx} of its second-order table (ctx_ids, ctx_probs, ctx_tag)")
    pairs = [("ids", ids, probs)] + ([("ctx_ids", t["ctx_ids"], t["ctx_probs"])] if ctx else [])
    for name, i, p in pairs:
        if i.dtype.is_floating_point or i.dtype == torch.bool or not p.dtype.is_floating_point:
            raise bad(f"has {name} of dtype {i.dtype} and its probabilities of dtype {p.dtype} (want integer ids, float probs)")
        if i.shape != p.shape or i.dim() != 3 or i.shape[2] != ids.shape[2]:
            raise bad(f"has {name} {list(i.shape)} and its probabilities {list(p.shape)}: want both "
                      f"[groups, rows, k={ids.shape[2]}]")
        i = i.long()  # compared as int64: an int8/int16 tensor would wrap `vocab` (749 as int8 is -19)
        out = (i != EMPTY) & ((i < 0) | (i >= vocab))
        if out.any():
            raise bad(f"has {name} {int(i[out][0])} outside the vocabulary [0, {vocab}) ({int(out.sum())} such)")
        p = p.float()
        if not torch.isfinite(p).all() or ((p < 0) | (p > 1.001)).any():
            raise bad(f"has probabilities for {name} that are NaN/inf or outside [0, 1]")
    if ctx:
        tag = t["ctx_tag"]
        if tag.shape != t["ctx_ids"].shape[:2] or tag.dtype.is_floating_point:
            raise bad(f"has ctx_tag {list(tag.shape)} {tag.dtype}, want integer [groups, rows] = {list(t['ctx_ids'].shape[:2])}")
        tag = tag.long()
        if ((tag != EMPTY) & ((tag < 0) | (tag >= vocab * vocab))).any():
            raise bad(f"has ctx_tag values outside [0, vocab²={vocab * vocab})")
