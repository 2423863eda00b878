"""Lossless acceptance over a verified tree (DESIGN.md §2 step 6).

Terms: walking from the root, the target draws x ~ p(· | path). If a child of the current node
carries x, that child is **accepted** and the walk moves to it; otherwise x is emitted and the
walk stops. The last emitted token is the **bonus** token when the walk ended at a leaf of the
tree, and the **recovered** token when the target's draw left the tree. Each emitted token is an
exact draw of the target given the tokens before it, so the output law is the target's, for any
tree (for deterministic trees this equals multi-candidate rejection sampling: the acceptance
probability at a node is the target mass its children cover). Greedy: x = argmax.

Draws are made for every node at once (independent noise per node); nodes along one walk are
distinct, so the draws the walk uses are independent exact samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SamplingParams
from .sampling import sample, token_logprobs
from .tree import TreeBatch


@dataclass(slots=True)
class Acceptance:
    """Result of walking each row's tree. Path slot 0 is the root."""

    path: torch.Tensor  # [batch, D+1] node index of the accepted path (root first), -1 after its end
    emitted: torch.Tensor  # [batch, D+1] emitted tokens: accepted candidates then bonus/recovered
    logprobs: torch.Tensor  # [batch, D+1] float32 target logprob of each emitted token
    n_emitted: torch.Tensor  # [batch] accepted candidates + 1

    def kept_nodes(self, n_nodes: int) -> torch.Tensor:
        """[batch, n_nodes] bool: root and accepted nodes, whose KV entries stay cached."""
        keep = torch.zeros(self.path.shape[0], n_nodes + 1, dtype=torch.bool, device=self.path.device)
        keep.scatter_(1, self.path.masked_fill(self.path < 0, n_nodes), True)
        return keep[:, :n_nodes]


def accept(tree: TreeBatch, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> Acceptance:
    """Walk every row's tree. logits: [batch, n, V] target logits at each node."""
    b, n = tree.tokens.shape
    draws = sample(logits, params, generator)  # [batch, n] x_i ~ p(· | path to node i)
    # child_of[b, i, j]: node j is a valid child of node i carrying the token drawn at node i
    is_child = (tree.parents.unsqueeze(1) == torch.arange(n, device=logits.device).view(1, n, 1)) & tree.valid.unsqueeze(1)
    is_child[:, :, 0] = False  # the root is nobody's child
    match = is_child & (tree.tokens.unsqueeze(1) == draws.unsqueeze(2))  # [batch, n, n]
    has_match = match.any(-1)  # [batch, n]
    next_node = match.float().argmax(-1)  # [batch, n] the matching child (first if duplicated)

    rows = torch.arange(b, device=logits.device)
    cur = torch.zeros(b, dtype=torch.long, device=logits.device)
    alive = torch.ones(b, dtype=torch.bool, device=logits.device)
    path = [cur]
    for _ in range(tree.max_depth):
        step = alive & has_match[rows, cur]
        cur = torch.where(step, next_node[rows, cur], cur)
        path.append(torch.where(step, cur, -1))
        alive = step
    path_t = torch.stack(path, 1)  # [batch, D+1]
    n_emitted = (path_t >= 0).sum(1)
    last = path_t.gather(1, (n_emitted - 1).unsqueeze(1)).squeeze(1)  # node the walk stopped at
    # emitted[j] = token of path node j+1 for accepted nodes, then the draw at the last node
    safe = path_t.clamp(min=0)
    nxt_tokens = tree.tokens.gather(1, torch.cat([safe[:, 1:], safe[:, :1]], 1))
    slot = torch.arange(path_t.shape[1], device=logits.device).unsqueeze(0)
    emitted = torch.where(slot < (n_emitted - 1).unsqueeze(1), nxt_tokens, draws[rows, last].unsqueeze(1))
    emitted = emitted.masked_fill(slot >= n_emitted.unsqueeze(1), -1)
    # each emitted token's logprob comes from the logits at the path node that precedes it
    path_logits = logits.gather(1, safe.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [batch, D+1, V]
    logprobs = token_logprobs(path_logits, emitted.clamp(min=0), params.temperature)
    return Acceptance(path=path_t, emitted=emitted, logprobs=logprobs, n_emitted=n_emitted)
