"""Model-free proposer: retrieval trees from a group-shared adjacency index (method="retrieval").

The G rows of one prompt share one index: every sibling's verification feeds it and every
sibling drafts from it. Each rollout's group indices start from a global prior, which itself
learns from every rollout (so it persists across GRPO steps) and can be saved/loaded.
"""

from __future__ import annotations

import torch

from ..adjacency import AdjacencyIndex
from ..config import RetrievalConfig, SamplingParams
from ..templates import make_template
from ..tree import Draft, TreeBatch
from ..verify import Acceptance
from .base import Proposer, StepContext


class RetrievalProposer(Proposer):
    def __init__(self, cfg: RetrievalConfig, vocab: int, device: torch.device | str):
        self.cfg = cfg
        self.vocab = vocab
        self.device = torch.device(device)
        if cfg.prior_path:
            self.prior = AdjacencyIndex.load(cfg.prior_path, self.device)
            if self.prior.vocab != vocab:
                raise ValueError(
                    f"the adjacency prior {cfg.prior_path} has {self.prior.vocab} rows but the model's vocabulary "
                    f"has {vocab}: warm a prior for this model (scripts/warm_prior.py)"
                )
        else:
            self.prior = AdjacencyIndex.empty(1, vocab, cfg.top_k, self.device)
        self.index: AdjacencyIndex | None = None
        self.row_table: torch.Tensor | None = None  # [rows] which table of `index` each row uses
        self.temperature = 1.0

    # ------------------------------------------------------------------ lifecycle
    def start(self, prompts, row_prompt, prompt_logits, params: SamplingParams) -> None:
        rows = row_prompt.shape[0]
        self.temperature = params.temperature if params.temperature > 0 else 1.0
        self.row_table = row_prompt.clone() if self.cfg.share_in_group else torch.arange(rows, device=self.device)
        tables = len(prompts) if self.cfg.share_in_group else rows
        base = self.prior if self.cfg.use_prior else AdjacencyIndex.empty(1, self.vocab, self.cfg.top_k, self.device)
        self.index = base.expand(tables)
        if prompt_logits is not None:  # the prompts' own transitions, free from the prefill
            self._learn_prompts(prompts, row_prompt, prompt_logits)

    def _learn_prompts(self, prompts, row_prompt, prompt_logits) -> None:
        lens = torch.tensor([len(p) - 1 for p in prompts], device=self.device)  # prefilled positions
        width = prompt_logits.shape[1]
        ids = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        for g, p in enumerate(prompts):
            ids[g, : len(p) - 1] = torch.tensor(p[:-1], device=self.device)
        mask = torch.arange(width, device=self.device).view(1, -1) < lens.view(-1, 1)  # [groups, width]
        probs = (prompt_logits.float() / self.temperature).softmax(-1)[mask]  # [N, V]
        groups = torch.arange(len(prompts), device=self.device).view(-1, 1).expand_as(mask)[mask]
        toks = ids[mask]
        if self.cfg.share_in_group:
            self.index.update(groups, toks, probs, self.cfg.merge_decay)
        else:  # every row's own table learns its prompt
            for row, g in enumerate(row_prompt.tolist()):
                sel = groups == g
                self.index.update(torch.full_like(toks[sel], row), toks[sel], probs[sel], self.cfg.merge_decay)
        if self.cfg.update_prior:
            self.prior.update(torch.zeros_like(toks), toks, probs, self.cfg.merge_decay)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.row_table = self.row_table.index_select(0, rows.to(self.device))

    # ------------------------------------------------------------------ step
    def propose(self, ctx: StepContext) -> Draft:
        template = make_template(self.cfg.template, ctx.budget)
        draft = self.index.lookup(self.row_table, ctx.last_token, template)
        draft.valid &= draft.depth < ctx.remaining.view(-1, 1)  # deeper nodes could never be emitted
        return draft.compacted()

    def observe(self, ctx: StepContext, tree: TreeBatch, logits: torch.Tensor, acceptance: Acceptance) -> None:
        probs = (logits[tree.valid].float() / self.temperature).softmax(-1)  # [N, V] every verified node
        toks = tree.tokens[tree.valid]
        self.index.update(self.row_table.view(-1, 1).expand_as(tree.tokens)[tree.valid], toks, probs,
                          self.cfg.merge_decay)
        if self.cfg.update_prior:
            self.prior.update(torch.zeros_like(toks), toks, probs, self.cfg.merge_decay)

    def save_prior(self, path) -> None:
        self.prior.save(path)
