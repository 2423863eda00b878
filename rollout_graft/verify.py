"""Lossless acceptance over a verified tree (DESIGN.md §2 step 6).

Terms: walking from the root, the target draws x ~ p(· | path). If a child of the current node
carries x, that child is **accepted** and the walk moves to it; otherwise x is emitted and the
walk stops. The last emitted token is the **bonus** token when the walk ended at a leaf of the
tree, and the **recovered** token when the target's draw left the tree. Each emitted token is an
exact draw of the target given the tokens before it, so the output law is the target's, for any
tree (for deterministic trees this equals multi-candidate rejection sampling: the acceptance
probability at a node is the target mass its children cover). Greedy: x = argmax.

Draws are made lazily along the walk: one draw per row and depth level, at the node the walk has
reached (so a tree of n nodes costs depth + 1 draws per row, not n). The draw at level l uses the
uniform u[:, l] of the completion position the walk has reached there (`sampling.uniforms`, keyed
by seed, row and position): x = F⁻¹(u; p(· | prefix)) is the very token plain decoding draws at that
position with that seed, so a tree changes how many tokens a forward emits, never which ones.

`walk` is this walk for any source of draws: `accept` draws from the target's logits, replay
(`rollout_graft_tools.replay`) takes a recorded completion's tokens, and graft's calibration
(`accepted_along`) takes the tokens another tree's walk emitted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .config import SamplingParams
from .sampling import penalize, sample, token_logprobs
from .tree import Draft, TreeBatch


@dataclass(slots=True)
class Acceptance:
    """Result of walking each row's tree. Path slot 0 is the root."""

    path: torch.Tensor  # [batch, D+1] node index of the accepted path (root first), -1 after its end
    emitted: torch.Tensor  # [batch, D+1] emitted tokens: accepted candidates then bonus/recovered
    logprobs: torch.Tensor  # [batch, D+1] float32 target logprob of each emitted token
    n_emitted: torch.Tensor  # [batch] accepted candidates + 1

    def kept_nodes(self, n_nodes: int) -> torch.Tensor:
        """[batch, n_nodes] bool: root and accepted nodes, whose KV entries stay cached."""
        return path_nodes(self.path, n_nodes)


def path_nodes(path: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """[rows, n_nodes] bool: the nodes on a walk's `path` [rows, D+1] (node indices, -1 after its end)."""
    keep = torch.zeros(path.shape[0], n_nodes + 1, dtype=torch.bool, device=path.device)
    keep.scatter_(1, path.masked_fill(path < 0, n_nodes), True)
    return keep[:, :n_nodes]


def walk(tree: TreeBatch, draw: Callable[[int, torch.Tensor], torch.Tensor], depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Walk every row's tree from the root along the target's draws (the module docstring's walk).

    draw(level, cur) -> [rows]: the target's token at level `level`, where the walk stands at node
    cur [rows]. A valid child of cur carrying it is accepted and the walk moves there; otherwise the
    row's walk ends (its later draws are made but unused). depth: levels the walk may descend.
    Returns path [rows, depth + 1] node index (root first, -1 after its end) and the draws [rows, depth + 1].
    """
    b, n = tree.tokens.shape
    dev = tree.tokens.device
    candidate = tree.valid & (torch.arange(n, device=dev).view(1, n) > 0)  # the root is nobody's child
    cur = torch.zeros(b, dtype=torch.long, device=dev)
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    path, draws = [cur], []
    for level in range(depth + 1):
        x = draw(level, cur)  # [b]
        draws.append(x)
        if level == depth:  # the deepest level: nothing below to match
            break
        # a valid child of cur carrying x (the first one if a proposer duplicated it)
        match = candidate & (tree.parents == cur.view(-1, 1)) & (tree.tokens == x.view(-1, 1))
        alive = alive & match.any(1)
        cur = torch.where(alive, match.float().argmax(1), cur)
        path.append(torch.where(alive, cur, -1))
    return torch.stack(path, 1), torch.stack(draws, 1)


def accept(tree: TreeBatch, logits: torch.Tensor, params: SamplingParams, u: torch.Tensor | None,
           seen: torch.Tensor | None = None) -> Acceptance:
    """Walk every row's tree. logits: [batch, n, V] target logits at each node; u: [batch, ≥ D+1]
    uniforms, u[:, l] for the token emitted at level l (None when greedy); seen: [batch, ≥ V] bool,
    the tokens of each row's prompt and completion so far, for `params.repetition_penalty` (None:
    no penalty) — a draw at a node also counts the tokens on the path to it."""
    dev = logits.device
    rows = torch.arange(logits.shape[0], device=dev)
    before = None if seen is None else seen.clone()  # the tokens before the walk's node: its path's added level by level

    def draw(level: int, cur: torch.Tensor) -> torch.Tensor:  # x = F⁻¹(u; p(· | path to cur))
        x = logits[rows, cur]
        if before is not None:
            before.scatter_(1, tree.tokens[rows, cur].unsqueeze(1), True)
            x = penalize(x, before, params.repetition_penalty)
        return sample(x, params, None if u is None else u[:, level])

    path, draws = walk(tree, draw, tree.max_depth)  # [batch, D+1] each
    n_emitted = (path >= 0).sum(1)
    # the walk stops at level n_emitted - 1; the draw made there is the bonus/recovered token
    final = draws.gather(1, (n_emitted - 1).unsqueeze(1)).squeeze(1)
    safe = path.clamp(min=0)
    nxt_tokens = tree.tokens.gather(1, torch.cat([safe[:, 1:], safe[:, :1]], 1))
    slot = torch.arange(path.shape[1], device=dev).unsqueeze(0)
    emitted = torch.where(slot < (n_emitted - 1).unsqueeze(1), nxt_tokens, final.unsqueeze(1))
    emitted = emitted.masked_fill(slot >= n_emitted.unsqueeze(1), -1)
    # each emitted token's logprob comes from the logits at the path node that precedes it
    path_logits = logits.gather(1, safe.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [batch, D+1, V]
    logprobs = token_logprobs(path_logits, emitted.clamp(min=0), params.temperature)
    return Acceptance(path=path, emitted=emitted, logprobs=logprobs, n_emitted=n_emitted)


def accepted_along(draft: Draft, tokens: torch.Tensor, n_tokens: torch.Tensor) -> torch.Tensor:
    """Tokens a tree accepts along another tree's verified walk: the walk of `draft` with that walk's
    emitted tokens as the draws (the same prefix gives the same draw, so this is exactly what the
    draft would have accepted). draft: [rows, m]; tokens: [rows, D] emitted tokens (accepted then
    the last draw); n_tokens: [rows] how many of them count. Returns [rows] int64."""
    slot = torch.arange(tokens.shape[1] + 1, device=tokens.device).view(1, -1)
    draws = torch.nn.functional.pad(tokens, (0, 1), value=-1).masked_fill(slot >= n_tokens.view(-1, 1), -1)
    tree = TreeBatch.from_draft(torch.zeros_like(n_tokens), draft)  # the root's token is never matched
    path, _ = walk(tree, lambda level, cur: draws[:, level], min(tree.max_depth, tokens.shape[1]))
    return (path >= 0).sum(1) - 1
