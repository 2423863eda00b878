"""Typed, validated configuration: one dataclass per concern.

`SamplingParams` says *what* distribution to sample (it must never change the output
distribution of the engine, whatever method verifies it); `EngineConfig` says *how* the
engine proposes and verifies candidate tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from .templates import TemplateConfig

Method = Literal["ar", "retrieval", "graft"]
BudgetPolicy = Literal["fixed", "dcut"]
"""'fixed': every row verifies its proposer's tree (≤ budget nodes). 'dcut': a batch-wide top-K
of all candidate nodes, K chosen per step by the profiled cost model."""

DEFAULT_DCUT_RATIOS = (0.0, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.0)
"""Draft source. "ar": plain autoregressive decoding (the baseline, one token per forward).
"retrieval": group-shared adjacency retrieval trees (model-free).
"graft": drafter trees pruned by calibrated confidence, freed slots grafted with retrieval."""

METHODS: tuple[str, ...] = ("ar", "retrieval", "graft")


@dataclass(slots=True)
class SamplingParams:
    """How to sample from the target (TRL / vLLM field names).

    Args:
        temperature: softmax temperature; 0 means greedy (argmax).
        top_k: keep the k most likely tokens; 0 disables.
        top_p: nucleus sampling mass in (0, 1]; 1 disables.
        min_p: drop tokens whose probability is below min_p × the top probability; 0 disables.
        max_new_tokens: completion length limit (tokens, EOS included).
        stop_token_ids: extra ids that end a completion (the model's EOS ids always do unless
            `ignore_eos`).
        ignore_eos: keep generating past EOS (benchmarks with a fixed length).
        seed: seed of the engine's `torch.Generator` for this call; None draws a fresh one.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 128
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables top-k), got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 disables nucleus sampling), got {self.top_p!r}")
        if not (0.0 <= self.min_p < 1.0):
            raise ValueError(f"min_p must be in [0, 1) (0 disables it), got {self.min_p!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if self.stop_token_ids is not None:
            self.stop_token_ids = [int(t) for t in self.stop_token_ids]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(slots=True)
class RetrievalConfig:
    """Adjacency-index retrieval (DESIGN.md §2 steps 3 and 8).

    Args:
        top_k: successors stored per token row of the adjacency index (k in `[V, k]`).
        share_in_group: rows with the same prompt share one index (else one index per row).
        use_prior: start every group's index from the global prior (else from empty).
        update_prior: the global prior learns from every verification too, so it persists
            and improves across rollouts (GRPO steps).
        prior_path: a saved prior (`.safetensors`) to start from; None starts empty.
        template: shape of the retrieval trees.
    """

    top_k: int = 8
    share_in_group: bool = True
    use_prior: bool = True
    update_prior: bool = True
    prior_path: str | None = None
    template: TemplateConfig = field(default_factory=TemplateConfig)

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"retrieval top_k must be >= 1, got {self.top_k}")
        if self.template.width > self.top_k:
            raise ValueError(f"template width {self.template.width} exceeds the index's top_k {self.top_k}")


@dataclass(slots=True)
class EngineConfig:
    """How the engine drafts and verifies.

    Args:
        method: draft source, see `Method`.
        budget: candidate nodes per sequence and step (the tree's size without its root).
        max_depth: deepest candidate node (tokens accepted per step ≤ max_depth + 1).
        retrieval: adjacency-index settings (method "retrieval").
        budget_policy: see `BudgetPolicy`.
        dcut_ratios: the ρ values D-cut chooses from (ρ = 0, plain decoding, is always added).
        cost_profile_refresh: re-profile the cost model instead of reading the on-disk cache.
        compact_slack: compact the KV cache when garbage slots exceed this fraction.
    """

    method: Method = "ar"
    budget: int = 60
    max_depth: int = 8
    retrieval: RetrievalConfig | None = None
    budget_policy: BudgetPolicy = "fixed"
    dcut_ratios: tuple[float, ...] = DEFAULT_DCUT_RATIOS
    cost_profile_refresh: bool = False
    compact_slack: float = 0.5

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {METHODS}")
        if self.budget_policy not in ("fixed", "dcut"):
            raise ValueError(f"unknown budget_policy {self.budget_policy!r}; choose 'fixed' or 'dcut'")
        if not self.dcut_ratios or any(not 0.0 <= r <= 1.0 for r in self.dcut_ratios):
            raise ValueError(f"dcut_ratios must be fractions in [0, 1], got {self.dcut_ratios}")
        if self.budget < 0:
            raise ValueError(f"budget must be >= 0 candidate nodes per sequence, got {self.budget}")
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")
        if not (0.0 < self.compact_slack <= 4.0):
            raise ValueError(f"compact_slack must be in (0, 4], got {self.compact_slack}")
        if self.retrieval is None:
            self.retrieval = RetrievalConfig()
