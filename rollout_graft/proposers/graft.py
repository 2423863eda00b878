"""Graft: drafter trees pruned by calibrated confidence, freed slots grafted with retrieval
(method="graft"; DESIGN.md §2 steps 1–3, arXiv 2605.20104).

Per step and row, with a fixed budget of N candidate nodes:
1. the drafter expands its tree; at checkpoint levels a row whose best cumulative confidence is
   below τ stops growing (`pruning.pruning_stage`);
2. the row keeps its `quota` best draft nodes — by stage: 8 / 24 / 40 / 60 of N = 60;
3. the N − quota freed slots get a retrieval tree from the group's adjacency index, rooted at the
   row's last token, shaped by the asymmetric best-first template of that size;
4. both trees are merged (`merge.merge_trees`): identical token paths become one node, so the
   result ⊇ the pruned draft tree and never exceeds N nodes.

Ablations are options of this one proposer (`DraftConfig`): dense draft (prune=False,
graft=False), prune-only (graft=False), fixed split (adaptive_split=False), full graft.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import get_args

import torch

from ..adjacency import AdjacencyIndex
from ..config import DraftConfig, EngineConfig, SamplingParams
from ..merge import merge_trees
from ..pruning import CalibrationObjective, calibrated_thresholds, calibration_summary, draft_quota, load_thresholds, save_thresholds
from ..runner import ModelRunner
from ..selection import keep_best
from ..tree import Draft, TreeBatch
from ..verify import Acceptance, accepted_along
from .base import Proposer, StepContext
from .drafter import DrafterProposer, check_same_vocabulary, load_draft_model
from .retrieval import RetrievalProposer


def _select_rows(draft: Draft, rows: torch.Tensor, width: int) -> Draft:
    """Keep `rows` ([rows] bool) valid, pad the node axis to `width`."""
    pad = width - draft.tokens.shape[1]
    fields = {}
    for name in Draft.__slots__:
        value = getattr(draft, name)
        fill = -1 if name == "parents" else (1 if name == "depth" else 0)
        fields[name] = torch.nn.functional.pad(value, (0, pad), value=fill) if pad else value
    fields["valid"] = fields["valid"] & rows.view(-1, 1)
    return Draft(**fields)


class GraftProposer(Proposer):
    """Drafter + calibrated pruning + retrieval grafting.

    Args:
        cfg: `DraftConfig`.
        drafter: the `DrafterProposer` (owns the draft model's runner).
        retrieval: the group-shared `RetrievalProposer` (None when `cfg.graft` is False).
    """

    def __init__(self, cfg: DraftConfig, drafter: DrafterProposer, retrieval: RetrievalProposer | None):
        self.cfg = cfg
        self.drafter = drafter
        self.retrieval = retrieval
        self.thresholds = cfg.thresholds  # τ per checkpoint; `calibrate` replaces it
        if cfg.thresholds_path:
            self.thresholds = load_thresholds(cfg.thresholds_path, cfg.checkpoints)
        self._calibration_log: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # during `calibrate`: (best, accepted) per step
        self.seconds: dict[str, float] = {}  # "draft", "graft": proposer time per phase, this rollout
        self._best: torch.Tensor | None = None  # calibration: [rows, C] confidences of this step
        self._stage_trees: list[Draft] = []  # calibration: the tree each stage would have verified
        self._chain: Draft | None = None  # this step's suffix chain (retrieval with suffix_depth > 0)

    @staticmethod
    def build(config: EngineConfig, target: ModelRunner, draft_model=None, tokenizer=None) -> "GraftProposer":
        """The proposer for `config` (method "graft"): loads the draft model, checks its vocabulary."""
        cfg = config.draft
        source = draft_model if draft_model is not None else cfg.draft_model
        if source is None:
            raise ValueError("method 'graft' needs a draft model: pass draft_model=<directory or model> to "
                             "RolloutEngine / RolloutEngine.from_pretrained, or set DraftConfig(draft_model=...)")
        model, draft_tokenizer = load_draft_model(source, target.device, target.dtype)
        runner = ModelRunner(model, compact_slack=config.compact_slack)
        check_same_vocabulary(target.vocab_size, runner.vocab_size, tokenizer, draft_tokenizer)
        if cfg.top_k > runner.vocab_size:
            raise ValueError(f"DraftConfig.top_k={cfg.top_k} exceeds the drafter's vocabulary of {runner.vocab_size} tokens "
                             f"(each expanded node takes its top_k children): use a top_k <= {runner.vocab_size}, "
                             f"e.g. the default 8")
        retrieval = RetrievalProposer(config.retrieval, target.vocab_size, target.device) if cfg.graft else None
        return GraftProposer(cfg, DrafterProposer(cfg, runner, config.max_depth), retrieval)

    def reload_drafter(self, source, target: ModelRunner, tokenizer=None) -> None:
        """Swap in new drafter weights between rollouts (a directory or a loaded model with the
        target's vocabulary), e.g. a drafter re-distilled from the current policy; pruning
        thresholds, adjacency indices and the prior are kept. OSError when the weights cannot be
        read (e.g. a directory another job is still writing), ValueError for another vocabulary;
        either way the current drafter stays in place."""
        try:
            model, draft_tokenizer = load_draft_model(source, target.device, target.dtype)
        except Exception as exc:  # missing, partial or corrupt files: the old drafter keeps drafting
            raise OSError(f"could not read the draft model from {source} ({type(exc).__name__}: {exc}); "
                          "the current drafter is kept") from exc
        check_same_vocabulary(target.vocab_size, model.get_output_embeddings().weight.shape[0], tokenizer, draft_tokenizer)
        self.drafter.runner = ModelRunner(model, compact_slack=self.drafter.runner.compact_slack)

    # ------------------------------------------------------------------ lifecycle
    def start(self, prompts, row_prompt, prompt_logits, params: SamplingParams) -> None:
        self.seconds = {"draft": 0.0, "graft": 0.0}
        self.drafter.start(prompts, row_prompt, prompt_logits, params)
        if self.retrieval is not None:
            self.retrieval.start(prompts, row_prompt, prompt_logits, params)

    def observe(self, ctx: StepContext, tree: TreeBatch, logits: torch.Tensor, acceptance: Acceptance) -> None:
        self.drafter.observe(ctx, tree, logits, acceptance)
        if self.retrieval is not None:  # the group index learns exactly as for method "retrieval"
            self.retrieval.observe(ctx, tree, logits, acceptance)
        if self._calibration_log is not None:  # tokens each stage's tree accepts along the verified walk
            walk = [accepted_along(t, acceptance.emitted, acceptance.n_emitted) for t in self._stage_trees]
            self._calibration_log.append((self._best.cpu(), torch.stack(walk, 1).cpu()))

    def advance(self, emitted: torch.Tensor, n_emitted: list[int]) -> None:
        self.drafter.advance(emitted, n_emitted)
        if self.retrieval is not None:
            self.retrieval.advance(emitted, n_emitted)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.drafter.select_rows(rows)
        if self.retrieval is not None:
            self.retrieval.select_rows(rows)

    def adjacency_prior(self) -> AdjacencyIndex | None:
        """The grafted retrieval's prior (None without grafting: DraftConfig.graft=False)."""
        return None if self.retrieval is None else self.retrieval.adjacency_prior()

    # ------------------------------------------------------------------ calibration
    def calibrate(self, warm_up: Callable[[], object], objective: CalibrationObjective = "accepted",
                  path: str | Path | None = None) -> tuple[float, ...]:
        """Fit τ from a warm-up rollout and install it; save it as JSON when `path` is given (load it
        with `DraftConfig(thresholds_path=...)`). warm_up(): runs a rollout through this proposer, e.g.
        `lambda: engine.generate(prompts, params)`; each of its steps verifies the union of every
        stage's tree (so it may exceed the budget), its outputs are still exact target samples.
        objective: see `pruning`'s module docstring."""
        if objective not in get_args(CalibrationObjective):
            raise ValueError(f"unknown calibration objective {objective!r}; choose 'accepted' or 'separation'")
        self._calibration_log = []
        try:
            warm_up()
            best = torch.cat([b for b, _ in self._calibration_log])  # [N, C]
            accepted = torch.cat([a for _, a in self._calibration_log])  # [N, C + 1]
        finally:
            self._calibration_log = None
        self.thresholds = calibrated_thresholds(best, accepted, objective, self.cfg.checkpoints, self.thresholds)
        if path is not None:
            save_thresholds(path, self.cfg.checkpoints, self.thresholds, objective=objective,
                            **calibration_summary(best, accepted, self.thresholds))
        return self.thresholds

    # ------------------------------------------------------------------ step
    def _stop(self, checkpoint: int, best: torch.Tensor) -> torch.Tensor:
        return best < self.thresholds[checkpoint]

    def propose(self, ctx: StepContext) -> Draft:
        t0 = time.perf_counter()
        calibrating = self._calibration_log is not None
        stop = self._stop if self.cfg.prune and not calibrating else None
        expansion = self.drafter.expand(ctx, stop)
        nodes = expansion.nodes.to(ctx.last_token.device)
        self.seconds["draft"] += time.perf_counter() - t0
        t1 = time.perf_counter()
        # the step's suffix chain, matched once for every retrieval tree size and stage below
        history = self.retrieval is not None and self.retrieval.history is not None
        self._chain = self.retrieval.suffix_chain() if history else None
        if calibrating:  # warm-up: verify the union of every stage's tree (see `calibrate`)
            self._best, self._stage_trees = expansion.best, self._stage_trees_of(ctx, nodes)
            draft = self._stage_trees[0]
            for tree in self._stage_trees[1:]:
                draft = merge_trees(draft, tree)
        else:
            stage = expansion.stage.to(ctx.last_token.device)
            draft = self._finish(ctx, nodes, self._quota(stage, ctx.budget))
        self.seconds["graft"] += time.perf_counter() - t1
        return draft

    def _quota(self, stage: torch.Tensor, budget: int) -> torch.Tensor:
        """Draft nodes per row: by pruning stage, fixed, or the whole budget (dense draft)."""
        if self.cfg.prune or not self.cfg.adaptive_split:
            return draft_quota(stage, self.cfg, budget)
        return torch.full_like(stage, budget)

    def _finish(self, ctx: StepContext, nodes: Draft, quota: torch.Tensor) -> Draft:
        """The row's `quota` best draft nodes, grafted with a retrieval tree in the other slots.

        Slots the retrieval tree cannot use (unknown successors, paths the draft already has) go
        back to the next-best draft nodes, so the tree never exceeds the budget and ⊇ the pruned one.
        """
        kept = keep_best(nodes, quota)
        if self.retrieval is None:
            return kept
        retrieved = self._retrieve(ctx, ctx.budget - quota)
        merged = merge_trees(kept, retrieved)
        spare = ctx.budget - merged.valid.sum(1)  # [rows]
        if bool((spare > 0).any()) and nodes.tokens.shape[1] > kept.tokens.shape[1]:
            merged = merge_trees(keep_best(nodes, quota + spare), retrieved)
        return merged

    def _stage_trees_of(self, ctx: StepContext, nodes: Draft) -> list[Draft]:
        """The tree of each pruning stage (calibration): draft nodes cut at the stage's level."""
        trees = []
        for stage, level in enumerate((*self.cfg.checkpoints, None)):
            cut = nodes if level is None else replace(nodes, valid=nodes.valid & (nodes.depth <= level + 1))
            quota = self._quota(torch.full_like(ctx.last_token, stage), ctx.budget)
            trees.append(self._finish(ctx, cut, quota))
        return trees

    def _retrieve(self, ctx: StepContext, slots: torch.Tensor) -> Draft:
        """A retrieval tree of `slots[row]` nodes per row: one lookup per distinct slot count
        (the best-first template's shape depends on its size: the pruning stage)."""
        sizes = [n for n in torch.unique(slots).tolist() if n > 0]
        if not sizes:
            return Draft.empty(slots.shape[0], slots.device)
        trees = [self.retrieval.propose(replace(ctx, budget=n), self._chain) for n in sizes]
        width = max(t.tokens.shape[1] for t in trees)
        out = _select_rows(trees[0], slots == sizes[0], width)
        for n, tree in zip(sizes[1:], trees[1:]):
            part = _select_rows(tree, slots == n, width)
            use = (slots == n).view(-1, 1)
            out = Draft(**{f: torch.where(use, getattr(part, f), getattr(out, f)) for f in Draft.__slots__})
        return out
