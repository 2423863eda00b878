"""vLLM's own draft methods, the peers our proposer is measured against: their `speculative_config`.

    from rollout_graft.vllm.methods import vllm_speculative_config
    LLM(model, speculative_config=vllm_speculative_config("suffix", num_speculative_tokens=8))

- "ngram": vLLM's prompt lookup (the longest match of the last `prompt_lookup_max`…`min` tokens in
  the request's own prompt and completion), built into vLLM.
- "suffix": vLLM's suffix decoding (a suffix tree per prompt plus a global tree of earlier requests'
  completions); its tree lives in Arctic Inference, a separate package: `pip install -e ".[vllm-suffix]"`
  (pyproject.toml says how it builds).

Importing this module does not import vLLM.
"""

from __future__ import annotations

import importlib.util
import numbers
from typing import Literal

from ..config import MAX_BUDGET

VLLMOwnMethod = Literal["ngram", "suffix"]
VLLM_OWN_METHODS: tuple[str, ...] = ("ngram", "suffix")

PROMPT_LOOKUP_MAX = 4  # "ngram": the longest context matched (vLLM's prompt lookup, its own text only)
PROMPT_LOOKUP_MIN = 1  # "ngram": the shortest, as our proposer's `MIN_MATCH`


def check_vllm_method(method: str) -> None:
    """ValueError naming the fix when `method` is not one of vLLM's draft methods or its package is missing."""
    if method not in VLLM_OWN_METHODS:
        raise ValueError(f"vLLM's own draft methods here are {VLLM_OWN_METHODS}, got {method!r}")
    if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
        raise ValueError("vLLM's suffix decoding needs Arctic Inference, which is not installed: "
                         "`pip install -e \".[vllm-suffix]\"` (builds arctic-inference from its sdist; "
                         "pyproject.toml lists what the build needs), or pick another draft method")


def check_num_speculative_tokens(num_speculative_tokens) -> int:
    """`num_speculative_tokens` (the deepest draft per request and step) as a Python int (a numpy one
    too: the config travels as JSON); TypeError for a non-integer, ValueError outside 1…`MAX_BUDGET`
    (the engine's bound on the draft tokens a row verifies per step: vLLM sets none, and the drafts'
    arrays hold num_speculative_tokens columns for every row)."""
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, numbers.Integral):
        raise TypeError(f"num_speculative_tokens must be an int >= 1 (e.g. 8), got {type(num_speculative_tokens).__name__} "
                        f"{num_speculative_tokens!r}")
    if not 1 <= num_speculative_tokens <= MAX_BUDGET:
        raise ValueError(f"num_speculative_tokens must be an int in [1, {MAX_BUDGET}] draft tokens per request and "
                         f"step (the default is 8), got {num_speculative_tokens!r}")
    return int(num_speculative_tokens)


def vllm_speculative_config(method: VLLMOwnMethod, num_speculative_tokens: int = 8) -> dict:
    """vLLM's `speculative_config` for its own draft `method`, drafting up to `num_speculative_tokens`
    tokens per request and step. ValueError when vLLM lacks the method here (`check_vllm_method`)."""
    num_speculative_tokens = check_num_speculative_tokens(num_speculative_tokens)
    check_vllm_method(method)
    config = {"method": method, "num_speculative_tokens": num_speculative_tokens}
    if method == "ngram":
        config.update(prompt_lookup_max=PROMPT_LOOKUP_MAX, prompt_lookup_min=PROMPT_LOOKUP_MIN)
    return config
