"""Model-free proposer: retrieval trees from a group-shared adjacency index (method="retrieval").

The G rows of one prompt share one index: every sibling's verification feeds it and every
sibling drafts from it. Each rollout's group indices start from a global prior, which itself
learns from every rollout (so it persists across GRPO steps) and can be saved/loaded.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from ..adjacency import AdjacencyIndex
from ..config import RetrievalConfig, SamplingParams
from ..history import TokenHistory
from ..merge import merge_trees
from ..sampling import top_k_probs
from ..selection import keep_best
from ..templates import make_template
from ..tree import SUFFIX, Draft, TreeBatch
from ..verify import Acceptance
from .base import Proposer, StepContext


class RetrievalProposer(Proposer):
    resumes_rows = True  # a later wave of rows starts from the group's text so far

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
            self.prior = self._with_context_order(self.prior)
        else:
            self.prior = self._empty(1)
        self.index: AdjacencyIndex | None = None
        self.tables: torch.Tensor | None = None  # [rollout rows] which table of `index` each row uses
        self.rows: torch.Tensor | None = None  # [rows] rollout row (as passed to `start`) of each active row
        self.history: TokenHistory | None = None  # text of every row, when suffix chains are on
        self.memory: OrderedDict[tuple[int, ...], list[list[int]]] = OrderedDict()  # prompt → recent completions
        self.temperature = 1.0

    def _empty(self, groups: int) -> AdjacencyIndex:
        rows = 0
        if self.cfg.context_order == 2:
            rows = self.cfg.context_rows or min(4 * self.vocab, 1 << 16)
        return AdjacencyIndex.empty(groups, self.vocab, self.cfg.top_k, self.device, context_rows=rows)

    def _with_context_order(self, index: AdjacencyIndex) -> AdjacencyIndex:
        """Drop or add the second-order table so a loaded prior matches `cfg.context_order`."""
        if self.cfg.context_order == 1:
            return AdjacencyIndex(index.ids, index.probs)
        if index.ctx_ids is None:
            ctx = self._empty(1)
            return AdjacencyIndex(index.ids, index.probs, ctx.ctx_ids, ctx.ctx_probs, ctx.ctx_tag)
        return index

    # ------------------------------------------------------------------ lifecycle
    def start(self, prompts, row_prompt, prompt_logits, params: SamplingParams) -> None:
        rows = row_prompt.shape[0]
        self.temperature = params.temperature if params.temperature > 0 else 1.0
        row_prompt = row_prompt.to(self.device)
        self.tables = row_prompt.clone() if self.cfg.share_in_group else torch.arange(rows, device=self.device)
        self.activate(torch.arange(rows, device=self.device))
        tables = len(prompts) if self.cfg.share_in_group else rows
        if self.cfg.suffix_depth > 0:
            self._remember()
            recalled = {g: self.memory[tuple(p)] for g, p in enumerate(prompts) if tuple(p) in self.memory}
            width = max([len(p) + params.max_new_tokens for p in prompts]
                        + [len(prompts[g]) + len(c) for g, cs in recalled.items() for c in cs])
            self.history = TokenHistory(prompts, row_prompt, width, self.cfg.share_in_group, self.device,
                                        self.cfg.suffix_rows, recalled)
        else:
            self.history = None
        base = self.prior if self.cfg.use_prior else self._empty(1)
        self.index = base.expand(tables)
        if prompt_logits is not None:  # the prompts' own transitions, free from the prefill
            self._learn_prompts(prompts, row_prompt, prompt_logits)

    def _learn_prompts(self, prompts, row_prompt, prompt_logits) -> None:
        lens = torch.tensor([len(p) - 1 for p in prompts], device=self.device)  # prefilled positions
        mask = torch.arange(prompt_logits.shape[1], device=self.device).view(1, -1) < lens.view(-1, 1)  # [groups, width]
        top_p, top_i = top_k_probs(prompt_logits[mask], self.index.k, self.temperature)  # [N, k], prompts in order
        self.learn_prompts(prompts, row_prompt, top_i, top_p)

    def _remember(self) -> None:
        """Keep the last rollout's completions per prompt (`cfg.recall` most recent, LRU over prompts)."""
        if not self.cfg.recall or self.history is None:
            return
        for prompt, completion in self.history.completions():
            if completion:
                kept = self.memory.pop(prompt, [])
                self.memory[prompt] = ([completion] + kept)[: self.cfg.recall]
        while len(self.memory) > self.cfg.recall_prompts:
            self.memory.popitem(last=False)

    def activate(self, rows: torch.Tensor) -> None:
        """Make rollout rows `rows` [k] (indices into `start`'s rows) the active batch, e.g. the next
        wave of a staggered rollout; indices, tables and history persist."""
        self.rows = rows.to(self.device)

    @property
    def row_table(self) -> torch.Tensor:
        """[rows] the table of `index` each active row uses."""
        return self.tables.index_select(0, self.rows)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.rows = self.rows.index_select(0, rows.to(self.device))

    def advance(self, emitted: torch.Tensor, n_emitted: list[int]) -> None:
        if self.history is not None:
            self.history.append(self.rows, emitted, torch.tensor(n_emitted, dtype=torch.long, device=emitted.device))

    # ------------------------------------------------------------------ step
    def propose(self, ctx: StepContext, chain: Draft | None = None) -> Draft:
        """chain: this step's `suffix_chain()` when the caller already has it (graft asks for trees
        of several sizes per step; the match is the same for all of them)."""
        template = make_template(self.cfg.template, ctx.budget)
        draft = self.index.lookup(self.row_table, ctx.last_token, template, ctx.prev_token)
        if self.history is not None and ctx.budget > 0:
            # the chain first (retrieval paths it repeats merge into it), then each row's `budget` best
            # nodes: a row whose suffix matched nothing keeps its whole retrieval tree
            chain = chain if chain is not None else self.suffix_chain()
            depth = min(self.cfg.suffix_depth, ctx.budget)  # a chain's first nodes are a chain
            chain = Draft(*(getattr(chain, f)[:, :depth] for f in Draft.__slots__))
            draft = keep_best(merge_trees(chain, draft), torch.full_like(ctx.last_token, ctx.budget))
        draft.valid &= draft.depth < ctx.remaining.view(-1, 1)  # deeper nodes could never be emitted
        return draft.compacted()

    def suffix_chain(self) -> Draft:
        """A chain of `suffix_depth` nodes per row: what followed the row's longest suffix match in
        the text it may read (`TokenHistory.match`); invalid where nothing matched."""
        cfg, depth = self.cfg, self.cfg.suffix_depth
        tokens, valid, _ = self.history.match(self.rows, cfg.suffix_match, depth, cfg.suffix_min_match)
        rows = tokens.shape[0]
        steps = torch.arange(depth, device=self.device).view(1, -1)
        score = torch.full((1, depth), cfg.suffix_confidence, device=self.device).pow(steps + 1)
        return Draft(tokens, (steps - 1).expand(rows, -1), (steps + 1).expand(rows, -1), valid,
                     score.expand(rows, -1).masked_fill(~valid, 0.0),
                     torch.full((rows, depth), SUFFIX, dtype=torch.int8, device=self.device))

    def observe(self, ctx: StepContext, tree: TreeBatch, logits: torch.Tensor, acceptance: Acceptance) -> None:
        top_p, top_i = top_k_probs(logits[tree.valid], self.index.k, self.temperature)  # [N, k] every verified node
        self.learn(tree, tree.valid, ctx.prev_token, top_i, top_p)

    # ------------------------------------------------------------------ the learning rule (also replay's)
    def learn(self, tree: TreeBatch, nodes: torch.Tensor, prev_token: torch.Tensor | None, top_i: torch.Tensor,
              top_p: torch.Tensor) -> None:
        """The active rows' tables (and, with `cfg.update_prior`, the prior) learn the successors of
        `nodes` [rows, n] bool of `tree`: top_i, top_p [N, k] for the N nodes in row-major order. A
        node's context is its parent's token; the root's is prev_token [rows] (None: unknown)."""
        parent_tok = tree.tokens.gather(1, tree.parents)
        parent_tok[:, 0] = prev_token if prev_token is not None else -1
        toks, prev = tree.tokens[nodes], parent_tok[nodes]
        tables = self.row_table.view(-1, 1).expand_as(tree.tokens)[nodes]
        self.index.update_topk(tables, toks, top_i, top_p, self.cfg.merge_decay, prev)
        self._learn_prior(toks, prev, top_i, top_p)

    def learn_prompts(self, prompts: list[list[int]], row_prompt: torch.Tensor, top_i: torch.Tensor,
                      top_p: torch.Tensor) -> None:
        """The prompts' own transitions: top_i, top_p [N, k] are the successors after every prompt
        token but the last, prompts concatenated (N = Σ (len(p) - 1)). A group's table learns its
        prompt once; without `share_in_group` every row's own table (row_prompt [rows]) learns it."""
        toks = torch.tensor([t for p in prompts for t in p[:-1]], dtype=torch.long, device=self.device)
        prev = torch.tensor([t for p in prompts for t in ([-1] + p[:-2])[: len(p) - 1]], dtype=torch.long,
                            device=self.device)
        groups = torch.tensor([g for g, p in enumerate(prompts) for _ in p[1:]], dtype=torch.long, device=self.device)
        decay = self.cfg.merge_decay
        if self.cfg.share_in_group:
            self.index.update_topk(groups, toks, top_i, top_p, decay, prev)
        else:
            for row, g in enumerate(row_prompt.tolist()):
                sel = groups == g
                self.index.update_topk(torch.full_like(toks[sel], row), toks[sel], top_i[sel], top_p[sel], decay, prev[sel])
        self._learn_prior(toks, prev, top_i, top_p)

    def _learn_prior(self, toks: torch.Tensor, prev: torch.Tensor, top_i: torch.Tensor, top_p: torch.Tensor) -> None:
        if self.cfg.update_prior:
            self.prior.update_topk(torch.zeros_like(toks), toks, top_i, top_p, self.cfg.merge_decay, prev)

    def adjacency_prior(self) -> AdjacencyIndex:
        return self.prior
