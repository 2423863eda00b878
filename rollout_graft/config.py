"""Typed, validated configuration: one dataclass per concern.

`SamplingParams` says *what* distribution to sample (it must never change the output
distribution of the engine, whatever method verifies it); `EngineConfig` says *how* the
engine proposes and verifies candidate tokens.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Literal

from .templates import TemplateConfig

Method = Literal["ar", "retrieval", "graft"]
BudgetPolicy = Literal["fixed", "dcut"]
"""'fixed': every row verifies its proposer's tree (≤ budget nodes). 'dcut': every row verifies
its W best nodes, one W for the batch chosen per step by the profiled cost model (dcut.trees.DCut)."""

DEFAULT_RECALL = 4
"""Completions remembered per prompt by default (RetrievalConfig.recall): a GRPO epoch revisits every prompt."""

DEFAULT_SUFFIX_DEPTH = 8
"""Suffix chain nodes by default (RetrievalConfig.suffix_depth); where an engine's retrieval leaves them
unset they are cut at its `max_depth` (`default_suffix_depth`)."""


def default_suffix_depth(max_depth: int) -> int:
    """The suffix chain nodes of an engine whose retrieval does not set them: `DEFAULT_SUFFIX_DEPTH`,
    at most `max_depth` (deeper nodes could never be accepted; a `max_depth` below 1 is `EngineConfig`'s
    to refuse). `EngineConfig`'s default retrieval and `GraftConfig.engine_config` both use it."""
    return min(DEFAULT_SUFFIX_DEPTH, max(max_depth, 0))

DEFAULT_DCUT_RATIOS = (0.0, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.0)
"""Draft source. "ar": plain autoregressive decoding (the baseline, one token per forward).
"retrieval": group-shared adjacency retrieval trees (model-free).
"graft": drafter trees pruned by calibrated confidence, freed slots grafted with retrieval."""

METHODS: tuple[str, ...] = ("ar", "retrieval", "graft")

MAX_BUDGET = 1024
"""The most candidate nodes a row may verify per step (`EngineConfig.budget`). A tree of N nodes
costs every row an N × N ancestor mask and N query tokens in each forward, yet a step emits at most
max_depth + 1 tokens a row; at 100,000 nodes the drafter's tree asks the allocator for tens of GB.
The default, 60, is the Graft paper's budget."""


MIN_TEMPERATURE = 1e-5
"""The smallest positive temperature: float32 logits divided by a much smaller one overflow to inf
(about 1e-38 and below every method then emits the last vocabulary id); vLLM samples greedily below
this value (its `_SAMPLING_EPS`). Use 0 for greedy."""

MIN_REPETITION_PENALTY = 1e-5
"""The smallest repetition penalty: it divides the positive logits of the tokens a row has seen, and
float32 logits divided by a much smaller one overflow to inf (about 1e-37 and below every method
then emits the last vocabulary id)."""


@dataclass(slots=True)
class SamplingParams:
    """How to sample from the target (TRL / vLLM field names).

    Args:
        temperature: softmax temperature; 0 means greedy (argmax); else at least `MIN_TEMPERATURE`.
        top_k: keep the k most likely tokens; 0 disables.
        top_p: nucleus sampling mass in (0, 1]; 1 disables.
        min_p: drop tokens whose probability is below min_p × the top probability; 0 disables.
        max_new_tokens: completion length limit (tokens, EOS included).
        stop_token_ids: extra ids that end a completion (the model's EOS ids always do unless
            `ignore_eos`).
        ignore_eos: keep generating past EOS (benchmarks with a fixed length).
        repetition_penalty: at least `MIN_REPETITION_PENALTY`; 1 disables it. Before the temperature,
            the logit of every token the row's prompt or completion so far holds (a draft's own
            earlier tokens included) is divided by it where positive, multiplied where not (HF's
            `RepetitionPenaltyLogitsProcessor` and vLLM's rule). The logprobs returned stay the
            unpenalized ones TRL recomputes.
        seed: an int in [0, 2^64): the uniform behind the token at completion position t of row r
            (its index in the `generate` call) is hash(seed, r, t) (`sampling.uniforms`), so every
            method emits the tokens plain "ar" decoding emits with this seed; None draws a fresh
            seed (reported as `RolloutOutput.seed`).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 128
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        self.temperature = _real("temperature", self.temperature, "e.g. 1.0; 0 = greedy")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature={self.temperature!r} is below {MIN_TEMPERATURE}, the smallest the engine divides "
                             f"float32 logits by: use 0 for greedy (what vLLM does below {MIN_TEMPERATURE}) or a "
                             f"temperature >= {MIN_TEMPERATURE}")
        self.top_k = _integer("top_k", self.top_k, "e.g. 50; 0 disables top-k")
        if self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables top-k), got {self.top_k!r}")
        self.top_p = _real("top_p", self.top_p, "e.g. 0.9; 1.0 disables nucleus sampling")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 disables nucleus sampling), got {self.top_p!r}")
        self.min_p = _real("min_p", self.min_p, "e.g. 0.05; 0.0 disables it")
        if not (0.0 <= self.min_p < 1.0):
            raise ValueError(f"min_p must be in [0, 1) (0 disables it), got {self.min_p!r}")
        self.repetition_penalty = _real("repetition_penalty", self.repetition_penalty, "e.g. 1.1; 1.0 disables it")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1.0 disables it), got {self.repetition_penalty!r}")
        if self.repetition_penalty < MIN_REPETITION_PENALTY:
            raise ValueError(f"repetition_penalty={self.repetition_penalty!r} is below {MIN_REPETITION_PENALTY}, the smallest "
                             "the engine divides float32 logits by (a much smaller one overflows them to inf): pass a "
                             f"penalty >= {MIN_REPETITION_PENALTY} (values < 1 favour repetition, 1.0 disables it)")
        self.max_new_tokens = _integer("max_new_tokens", self.max_new_tokens, "e.g. 128")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if self.stop_token_ids is not None:
            self.stop_token_ids = _token_ids("stop_token_ids", self.stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be True or False, got {type(self.ignore_eos).__name__} {self.ignore_eos!r}")
        if self.seed is not None:
            self.seed = _integer("seed", self.seed, "e.g. 0; None draws a fresh seed")
            if not 0 <= self.seed < 2**64:
                raise ValueError(f"seed must be an int in [0, 2**64) (or None for a fresh one), got {self.seed!r}: "
                                 "reduce it, e.g. seed % 2**64")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _real(name: str, value, example: str) -> float:
    """`value` as a float; TypeError for bools, strings and other non-numbers."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number ({example}), got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int beyond float's range (about 1.8e308)
        raise ValueError(f"{name} must be a number ({example}), got an int of {len(str(abs(int(value))))} digits, "
                         "beyond float's range") from None


def _integer(name: str, value, example: str) -> int:
    """`value` as an int; TypeError for bools, floats (3.0 included) and strings."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy's bool_ is no Integral
        raise TypeError(f"{name} must be an int ({example}), got {type(value).__name__} {value!r}")
    return int(value)


def check_types(obj, ints: tuple[str, ...] = (), reals: tuple[str, ...] = (), bools: tuple[str, ...] = (),
                paths: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> None:
    """TypeError naming the first field of `obj` whose value has the wrong type (ints: int, not bool
    or float; reals: a number; bools: True/False; paths: str or os.PathLike); `optional` fields may
    also be None. Ints and reals are normalised to Python int / float (frozen dataclasses too)."""
    where = type(obj).__name__
    for names, kind in ((ints, "int"), (reals, "real"), (bools, "bool"), (paths, "path")):
        for name in names:
            value = getattr(obj, name)
            if value is None and name in optional:
                continue
            if kind == "int":
                value = _integer(f"{where}.{name}", value, "a whole number such as 8")
            elif kind == "real":
                value = _real(f"{where}.{name}", value, "e.g. 0.5")
            elif kind == "bool" and not isinstance(value, bool):
                raise TypeError(f"{where}.{name} must be True or False, got {type(value).__name__} {value!r}")
            elif kind == "path" and not isinstance(value, (str, os.PathLike)):
                raise TypeError(f"{where}.{name} must be a local path (str), got {type(value).__name__} {value!r}")
            object.__setattr__(obj, name, value)


def _token_ids(name: str, ids) -> list[int]:
    """A list/tuple of token ids (ints >= 0) as list[int]; TypeError for a single id, a string, floats, bools."""
    if not isinstance(ids, (list, tuple)):
        hint = f"[{ids}]" if isinstance(ids, numbers.Integral) and not isinstance(ids, bool) else "[2, 7]"
        raise TypeError(f"{name} must be a list of token ids, e.g. {hint}; got {type(ids).__name__} {ids!r}")
    out = [_integer(f"every id in {name}", t, "a token id such as 2") for t in ids]
    if any(t < 0 for t in out):
        raise ValueError(f"{name} holds a negative token id: {out}; pass ids from the model's tokenizer")
    return out


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
        merge_decay: 0 overwrites an index row on every write; > 0 keeps older successors (e.g. a
            sibling's) as alternatives with their probability × merge_decay.
        context_order: 1 = successors keyed by the token alone (`[V, k]`); 2 = also keyed by
            (previous token, token) in a hashed table, used when it holds the exact context.
        context_rows: rows of the second-order table per group (None: min(4·V, 65536)).
        suffix_depth: length of the draft chain copied from text already written (0: off): the
            continuation after the longest match of the row's last tokens in its group's rows
            (prompt and siblings' completions; only its own row without `share_in_group`),
            merged into the retrieval tree in front of it (`history.TokenHistory`). 0 turns it
            (and `recall`) off. At most `EngineConfig.max_depth` (refused above it); `EngineConfig`'s
            default retrieval uses `default_suffix_depth(max_depth)`.
        suffix_match: most trailing tokens compared when matching (the longest match wins).
        suffix_min_match: fewest matching tokens that count as a match.
        recall: earlier completions remembered per prompt across rollouts (`generate` calls) and
            read by the suffix chains of a row with the same prompt (GRPO epochs revisit prompts);
            0 = off; None (the default) = `DEFAULT_RECALL` where suffix chains are on, else 0. A
            recall > 0 needs `suffix_depth` > 0.
        recall_prompts: prompts remembered at most (the least recently seen are forgotten).
        suffix_rows: rows whose text one row searches, itself included (bounds the work for large
            groups; the group's first rows, i.e. the leaders of `EngineConfig.group_lead`, first).
        suffix_confidence: score factor per chain node (its estimated acceptance), for D-cut and
            graft's pruning.
    """

    top_k: int = 8
    share_in_group: bool = True
    use_prior: bool = True
    update_prior: bool = True
    prior_path: str | None = None
    template: TemplateConfig = field(default_factory=TemplateConfig)
    merge_decay: float = 0.5
    context_order: Literal[1, 2] = 1
    context_rows: int | None = None
    # suffix_depth on: GRPO's siblings and epochs repeat text (docs/RESULTS.md, "Engine, tiny target: suffix
    # chains and recall across GRPO epochs (CPU)")
    suffix_depth: int = DEFAULT_SUFFIX_DEPTH
    suffix_match: int = 4
    suffix_min_match: int = 1
    suffix_rows: int = 16
    recall: int | None = None  # None: DEFAULT_RECALL with suffix chains on (a GRPO epoch revisits every prompt)
    recall_prompts: int = 4096
    suffix_confidence: float = 0.6

    def __post_init__(self) -> None:
        check_types(self, ints=("top_k", "context_order", "context_rows", "suffix_depth", "suffix_match", "suffix_min_match",
                                "suffix_rows", "recall", "recall_prompts"),
                    reals=("merge_decay", "suffix_confidence"), bools=("share_in_group", "use_prior", "update_prior"),
                    paths=("prior_path",), optional=("context_rows", "prior_path", "recall"))
        if not isinstance(self.template, TemplateConfig):
            raise TypeError(f"RetrievalConfig.template must be a TemplateConfig, got {type(self.template).__name__}")
        if self.prior_path is not None and not os.path.isfile(self.prior_path):
            raise ValueError(f"prior_path {self.prior_path} does not exist (or is not a file): pass a prior saved by "
                             "`save_prior` (a checkpoint's graft_prior.safetensors, scripts/warm_prior.py), or None")
        if self.suffix_depth < 0:
            raise ValueError(f"suffix_depth must be >= 0 chain nodes (0 = off), got {self.suffix_depth}")
        if self.recall is None:
            self.recall = DEFAULT_RECALL if self.suffix_depth else 0
        if self.recall < 0 or self.recall_prompts < 1:
            raise ValueError(f"recall must be >= 0 completions per prompt and recall_prompts >= 1, got {self.recall}, "
                             f"{self.recall_prompts}")
        if self.recall and not self.suffix_depth:
            raise ValueError("recall feeds the suffix chains: set suffix_depth > 0 (e.g. 8) or recall=0")
        if self.suffix_rows < 1:
            raise ValueError(f"suffix_rows must be >= 1 (the row itself), got {self.suffix_rows}")
        if not 1 <= self.suffix_min_match <= self.suffix_match:
            raise ValueError(f"need 1 <= suffix_min_match <= suffix_match, got {self.suffix_min_match}, {self.suffix_match}")
        if not 0.0 < self.suffix_confidence <= 1.0:
            raise ValueError(f"suffix_confidence must be in (0, 1], got {self.suffix_confidence}")
        if self.top_k < 1:
            raise ValueError(f"retrieval top_k must be >= 1, got {self.top_k}")
        if self.context_order not in (1, 2):
            raise ValueError(f"context_order must be 1 or 2, got {self.context_order}")
        if self.context_rows is not None and self.context_rows < 1:
            raise ValueError(f"context_rows must be a positive number of rows, got {self.context_rows}")
        if not 0.0 <= self.merge_decay < 1.0:
            raise ValueError(f"merge_decay must be in [0, 1) (0 = overwrite), got {self.merge_decay}")
        if self.template.width > self.top_k:
            raise ValueError(f"template width {self.template.width} exceeds the index's top_k {self.top_k}")


@dataclass(slots=True)
class DraftConfig:
    """Drafter trees, calibrated pruning and grafting (method "graft", DESIGN.md §2 steps 1–3).

    Tree levels are counted from 0: level d holds the draft nodes at depth d + 1 below the root
    (level 0 = the root's children). A checkpoint at level d compares the best cumulative
    confidence (drafter prefix product) among the level-d nodes with τ_d; below it, that row's
    tree stops growing and keeps `split[d]` draft nodes, the rest of the budget goes to retrieval.

    Args:
        draft_model: local directory of the draft model (same tokenizer as the target); or pass
            `draft_model=` to `RolloutEngine`.
        top_k: children per expanded node (top-k of the drafter's distribution).
        beam: nodes per level that are expanded further (the highest cumulative confidences).
        depth: deepest draft level + 1 (drafter forwards per step, counting the root's).
        checkpoints: levels at which a row's tree may be pruned.
        thresholds: τ per checkpoint (defaults; `calibrate` fits them from a warm-up run).
        thresholds_path: JSON written by `calibrate`; overrides `thresholds` when given.
        split: (checkpoint level, draft nodes kept) per checkpoint, for a budget of `split_budget`;
            a row never pruned keeps the whole budget for draft nodes.
        split_budget: the budget N the split table is written for; other budgets scale it.
        fixed_draft_nodes: draft nodes per row when `adaptive_split` is False (of `split_budget`).
        prune: stop growing a tree at a checkpoint when its confidence is below τ.
        graft: fill the slots not used by draft nodes with a retrieval tree (else leave them empty).
        adaptive_split: the draft/retrieval split follows the pruning stage (else it is fixed).
    """

    draft_model: str | None = None
    top_k: int = 8
    beam: int = 8
    depth: int = 7
    checkpoints: tuple[int, ...] = (0, 1, 5)
    thresholds: tuple[float, ...] = (0.3, 0.15, 0.05)
    thresholds_path: str | None = None
    split: tuple[tuple[int, int], ...] = ((0, 8), (1, 24), (5, 40))
    split_budget: int = 60
    fixed_draft_nodes: int = 24
    prune: bool = True
    graft: bool = True
    adaptive_split: bool = True

    def __post_init__(self) -> None:
        check_types(self, ints=("top_k", "beam", "depth", "split_budget", "fixed_draft_nodes"),
                    bools=("prune", "graft", "adaptive_split"), paths=("draft_model", "thresholds_path"),
                    optional=("draft_model", "thresholds_path"))
        if self.thresholds_path is not None and not os.path.isfile(self.thresholds_path):
            raise ValueError(f"thresholds_path {self.thresholds_path} does not exist (or is not a file): pass the JSON "
                             "that `rollout_graft.calibrate` wrote, or None for the default thresholds")
        for name in ("checkpoints", "thresholds", "split"):
            if not isinstance(getattr(self, name), (list, tuple)):
                raise TypeError(f"DraftConfig.{name} must be a tuple, got {type(getattr(self, name)).__name__} "
                                f"{getattr(self, name)!r}")
        if self.top_k < 1 or self.beam < 1 or self.depth < 1:
            raise ValueError(f"draft top_k, beam and depth must be >= 1, got {self.top_k}, {self.beam}, {self.depth}")
        self.checkpoints = tuple(_integer("every DraftConfig.checkpoints level", c, "a tree level such as 1")
                                 for c in self.checkpoints)
        self.thresholds = tuple(_real("every DraftConfig.thresholds value", t, "a confidence such as 0.15")
                                for t in self.thresholds)
        if any(not isinstance(pair, (list, tuple)) or len(pair) != 2 for pair in self.split):
            raise TypeError(f"DraftConfig.split must hold (checkpoint level, draft nodes kept) pairs, e.g. "
                            f"((0, 8), (1, 24), (5, 40)); got {self.split!r}")
        self.split = tuple((_integer("every DraftConfig.split level", d, "a checkpoint level such as 1"),
                            _integer("every DraftConfig.split node count", n, "draft nodes kept such as 24"))
                           for d, n in self.split)
        if list(self.checkpoints) != sorted(set(self.checkpoints)) or any(not 0 <= c < self.depth for c in self.checkpoints):
            raise ValueError(f"checkpoints must be distinct increasing levels in [0, depth={self.depth}), "
                             f"got {self.checkpoints}")
        if len(self.thresholds) != len(self.checkpoints) or any(not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ValueError(f"give one threshold in [0, 1] per checkpoint {self.checkpoints}, got {self.thresholds}")
        if tuple(d for d, _ in self.split) != self.checkpoints:
            raise ValueError(f"split must list the checkpoints {self.checkpoints} in order, got {self.split}")
        nodes = [n for _, n in self.split]
        if any(not 0 <= n <= self.split_budget for n in nodes + [self.fixed_draft_nodes]):
            raise ValueError(f"split and fixed_draft_nodes must be in [0, split_budget={self.split_budget}]")
        if nodes != sorted(nodes):
            raise ValueError(f"a later checkpoint must keep at least as many draft nodes: {self.split}")
        if self.graft and self.adaptive_split and not self.prune:
            raise ValueError("an adaptive split without pruning leaves nothing to graft: set prune=True, "
                             "or adaptive_split=False for a fixed draft/retrieval split")


@dataclass(slots=True)
class DCutConfig:
    """D-cut's settings (`dcut.trees.DCut`). Knobs that an ablation showed do not matter beyond the
    benchmark's noise were removed (the ablation: see git history; DESIGN.md states the rule).

    Args:
        ratios: the ρ values D-cut chooses from: verified width W = ρ · budget nodes per row
            (ρ = 0, plain decoding, is always added).
        probe_share: after a plain decision, the next proposal (a probe) waits until probes that
            find nothing would have cost at most this share of the decoding time, plus what
            speculation saved. Switched off (every step proposing), `graft` spent 12-17 % more of
            `ar`'s time per token on its own work at batch 8-64.
        calibration_prior: how many verified nodes a raw score counts as in its calibration bin
            before acceptance is observed (large: trust the proposer's raw scores).
    """

    ratios: tuple[float, ...] = DEFAULT_DCUT_RATIOS
    probe_share: float = 0.01
    calibration_prior: float = 4.0

    def __post_init__(self) -> None:
        check_types(self, reals=("probe_share", "calibration_prior"))
        if not isinstance(self.ratios, (list, tuple)):
            raise TypeError(f"DCutConfig.ratios must be a tuple of fractions, e.g. (0.5, 1.0); got "
                            f"{type(self.ratios).__name__} {self.ratios!r}")
        self.ratios = tuple(_real("every DCutConfig.ratios value", r, "a fraction such as 0.5") for r in self.ratios)
        if not self.ratios or any(not 0.0 <= r <= 1.0 for r in self.ratios):
            raise ValueError(f"DCutConfig.ratios must be fractions in [0, 1], got {self.ratios}")
        if not 0.0 < self.probe_share <= 1.0:
            raise ValueError(f"DCutConfig.probe_share must be in (0, 1], got {self.probe_share}")
        if not (math.isfinite(self.calibration_prior) and self.calibration_prior > 0):  # inf/NaN: NaN acceptance rates
            raise ValueError(f"DCutConfig.calibration_prior must be a finite number > 0 of verified nodes (larger trusts "
                             f"the raw scores longer, e.g. 1000), got {self.calibration_prior}")


@dataclass(slots=True)
class EngineConfig:
    """How the engine drafts and verifies.

    Args:
        method: draft source, see `Method`.
        budget: candidate nodes per sequence and step (the tree's size without its root).
        max_depth: deepest candidate node (tokens accepted per step ≤ max_depth + 1).
        retrieval: adjacency-index settings (methods "retrieval" and "graft"); None: the defaults, with
            suffix chains cut at `max_depth` (an explicit `suffix_depth` above `max_depth` is refused).
        draft: drafter, pruning and grafting settings (method "graft").
        budget_policy: see `BudgetPolicy`.
        dcut: D-cut's settings (`DCutConfig`; used with budget_policy "dcut").
        cost_profile_refresh: re-profile the cost model instead of reading the on-disk cache.
        compact_slack: compact the KV cache when garbage slots exceed this fraction.
        group_lead: rows per group that generate first; the group's other rows start when they are
            done and can draft from the leaders' whole completions (`retrieval.suffix_depth`).
            0 = every row at once. Trades more target forwards (latency) for fewer verified
            tokens per completion token; method "retrieval" only. A rollout runs in waves only
            when the engine's previous rollout (if any) verified trees in at least half of its
            steps: where D-cut decodes plainly, staggering would only add forwards.
        fold_gqa: run the target's forwards with grouped-query attention folded into the query axis
            (`rollout_graft.attention`): the same attention without transformers' KV head copies
            under the engine's masks, 1.2–7.8× faster verify forwards at 32–64 rows on a 2-core CPU
            (docs/RESULTS.md). Off: the rollout's attention runs the kernels the training forward
            runs (transformers' SDPA path), whose rounding the folded one does not share. Applies
            to targets whose attention is `sdpa` and whose KV heads are shared; others run as they are.
    """

    method: Method = "ar"
    budget: int = 60
    max_depth: int = 8
    retrieval: RetrievalConfig | None = None
    draft: DraftConfig | None = None
    budget_policy: BudgetPolicy = "fixed"
    dcut: DCutConfig = field(default_factory=DCutConfig)
    cost_profile_refresh: bool = False
    compact_slack: float = 0.5
    group_lead: int = 0
    fold_gqa: bool = False

    def __post_init__(self) -> None:
        check_types(self, ints=("budget", "max_depth", "group_lead"), reals=("compact_slack",),
                    bools=("cost_profile_refresh", "fold_gqa"))
        for name, cls in (("retrieval", RetrievalConfig), ("draft", DraftConfig)):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), cls):
                raise TypeError(f"EngineConfig.{name} must be a {cls.__name__} (or None for its defaults), got "
                                f"{type(getattr(self, name)).__name__}")
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {METHODS}")
        if self.budget_policy not in ("fixed", "dcut"):
            raise ValueError(f"unknown budget_policy {self.budget_policy!r}; choose 'fixed' or 'dcut'")
        if not isinstance(self.dcut, DCutConfig):
            raise TypeError(f"dcut must be a DCutConfig, e.g. DCutConfig(ratios=(0.5, 1.0)); got {type(self.dcut).__name__}")
        if not 0 <= self.budget <= MAX_BUDGET:
            raise ValueError(f"budget must be in [0, {MAX_BUDGET}] candidate nodes per sequence and step (a tree of N "
                             f"nodes costs each row an N x N mask in every forward; the default is 60), got {self.budget}")
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")
        if self.retrieval is not None and self.retrieval.suffix_depth > self.max_depth:
            raise ValueError(f"retrieval.suffix_depth={self.retrieval.suffix_depth} exceeds max_depth={self.max_depth}: "
                             "deeper chain nodes could never be accepted; lower suffix_depth or raise max_depth")
        if self.group_lead < 0:
            raise ValueError(f"group_lead must be >= 0 rows per group (0 = all rows at once), got {self.group_lead}")
        if self.group_lead and self.method != "retrieval":
            raise ValueError(f"group_lead needs method='retrieval' (got {self.method!r}): a drafter's cache "
                             "cannot resume rows; set group_lead=0")
        if not (0.0 < self.compact_slack <= 4.0):
            raise ValueError(f"compact_slack must be in (0, 4], got {self.compact_slack}")
        if self.retrieval is None:  # the default chains stop at max_depth: deeper nodes could never be accepted
            self.retrieval = RetrievalConfig(suffix_depth=default_suffix_depth(self.max_depth))
        if self.draft is None and self.method == "graft":
            self.draft = DraftConfig()
