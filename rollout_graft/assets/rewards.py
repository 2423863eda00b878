"""Rewards of the tiny-math task (`TINY_PROMPTS`): what the recipe trains on and the lab's held-out
evaluation scores with (TRL reward-function signature: completions in, one float per completion).

Completions end with a line ``"#### <integer>"``; a completion is a string, or chat messages whose
last message's ``content`` is the answer.
"""

from __future__ import annotations

import re

from . import TINY_ANSWER_PATTERN

FINAL_ANSWER = re.compile(r"####\s*(-?\d+)\s*$")  # the completion's last line


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def correctness_reward(completions, answer, **kwargs) -> list[float]:
    """1 when the final `#### N` line equals the gold answer, else 0."""
    found = [re.findall(TINY_ANSWER_PATTERN, _text(c)) for c in completions]
    return [float(bool(f) and _integer(f[-1]) == _integer(a)) for f, a in zip(found, answer)]


def _integer(text) -> str:
    """An integer's canonical digits ("-0042" -> "-42"), of any length: int() refuses more than 4300 digits."""
    text = str(text).strip()
    digits = text.lstrip("+-").lstrip("0") or "0"
    return "-" + digits if text.startswith("-") and digits != "0" else digits


def format_reward(completions, **kwargs) -> list[float]:
    """1 when the completion ends with a `#### <integer>` line, else 0."""
    return [float(FINAL_ANSWER.search(_text(c).strip()) is not None) for c in completions]
