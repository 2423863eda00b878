"""The one interface every draft source implements (STYLE.md principle 4).

The engine never branches on the kind of proposer: it calls `start` once per rollout, `activate`
once per wave of rows, `propose` / `observe` / `advance` once per step, and `select_rows` when
finished rows leave the batch. What a proposer keeps across rollouts is stated, not probed:
`adjacency_prior` (None when it keeps no prior) and `reload_drafter` (ValueError without a drafter).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch

from ..adjacency import AdjacencyIndex
from ..config import SamplingParams
from ..runner import ModelRunner
from ..tree import Draft, TreeBatch
from ..verify import Acceptance


@dataclass(slots=True)
class StepContext:
    """What a proposer may read about the active rows at the start of a step."""

    last_token: torch.Tensor  # [rows] int64 last committed token (the root of this step's tree)
    length: torch.Tensor  # [rows] int64 committed tokens incl. the root (prompt + completion)
    group: torch.Tensor  # [rows] int64 group id (rows with the same prompt share it)
    remaining: torch.Tensor  # [rows] int64 tokens each row may still emit
    budget: int  # candidate nodes per row for this step
    prev_token: torch.Tensor | None = None  # [rows] int64 token before the root (-1: none)


class Proposer(ABC):
    """A source of candidate trees."""

    resumes_rows: bool = False
    """Whether `activate` can start a later wave of rows (`EngineConfig.group_lead`). Every proposer
    lets a step go without `propose` (the budget policy decoding plainly): `advance` still sees its tokens."""

    def start(self, prompts: list[list[int]], row_prompt: torch.Tensor, prompt_logits: torch.Tensor | None,
              params: SamplingParams) -> None:
        """A rollout begins. prompts: the distinct prompts (group g = prompts[g]); row_prompt: [rows]
        group of each row; prompt_logits: [groups, max_prompt_len - 1, V] target logits of the
        prefilled prompt positions, or None; params: the sampling parameters of this rollout."""

    @abstractmethod
    def propose(self, ctx: StepContext) -> Draft:
        """Candidate nodes for every active row (at most ctx.budget valid nodes per row)."""

    def observe(self, ctx: StepContext, tree: TreeBatch, logits: torch.Tensor, acceptance: Acceptance) -> None:
        """Learn from a verify forward. logits: [rows, n, V] target logits of every tree node."""

    def activate(self, rows: torch.Tensor) -> None:
        """Rows `rows` [k] (indices into `start`'s rows) form the active batch from now on: called after
        `start` with every row, or per wave of a staggered rollout (`EngineConfig.group_lead`, which
        only proposers that can resume rows support; the default assumes a single wave)."""

    def advance(self, emitted: torch.Tensor, n_emitted: list[int]) -> None:
        """The active rows committed emitted[i, :n_emitted[i]] this step (every step, also when
        D-cut skipped `propose`). emitted: [rows, T]; n_emitted: host ints (a proposer that keeps no
        text costs the engine nothing here)."""

    def select_rows(self, rows: torch.Tensor) -> None:
        """Only `rows` [k] of the current batch stay active (others finished)."""

    # ------------------------------------------------------------------ state kept across rollouts
    def adjacency_prior(self) -> AdjacencyIndex | None:
        """The global adjacency prior this proposer learns across rollouts (what `save_prior` writes
        and `RetrievalConfig.prior_path` loads), or None when it keeps none."""
        return None

    def save_prior(self, path: str | Path) -> None:
        """Write `adjacency_prior()` to `path` (safetensors); ValueError when there is none."""
        prior = self.adjacency_prior()
        if prior is None:
            raise ValueError(f"{type(self).__name__} keeps no adjacency prior: use method 'retrieval', "
                             "or 'graft' with DraftConfig(graft=True)")
        prior.save(path)

    def reload_drafter(self, source, target: ModelRunner, tokenizer=None) -> None:
        """Swap in new draft-model weights between rollouts (method "graft"); ValueError here: this
        proposer has no draft model."""
        raise ValueError(f"{type(self).__name__} has no draft model to reload: use method='graft'")


class NoProposer(Proposer):
    """Plain autoregressive decoding: every tree is just the root."""

    def propose(self, ctx: StepContext) -> Draft:
        return Draft.empty(ctx.last_token.shape[0], ctx.last_token.device)
