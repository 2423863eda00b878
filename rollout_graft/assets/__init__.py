"""Embedded tiny models and prompts for tests, examples and CPU benchmarks.

``tiny-math/`` holds a Qwen3-architecture target (~1.7M params) and draft (~0.28M params)
trained from scratch on synthetic step-by-step arithmetic word problems, sharing one
byte-level BPE tokenizer, plus held-out RL prompts. Regenerate with
``python scripts/make_tiny_models.py``.

Prompt format: ``"Question: <problem>\\nAnswer:"``; completions end with a line
``"#### <integer>"`` followed by the EOS token ``<|endoftext|>``.
"""

from __future__ import annotations

import json
from pathlib import Path

TINY_MATH = Path(__file__).parent / "tiny-math"
TINY_TARGET = TINY_MATH / "target"
TINY_DRAFT = TINY_MATH / "draft"
TINY_PROMPTS = TINY_MATH / "prompts.jsonl"

TINY_PROMPT_CUE = "\nAnswer:"
TINY_ANSWER_PATTERN = r"####\s*(-?\d+)"

__all__ = [
    "TINY_MATH",
    "TINY_TARGET",
    "TINY_DRAFT",
    "TINY_PROMPTS",
    "TINY_PROMPT_CUE",
    "TINY_ANSWER_PATTERN",
    "load_tiny_prompts",
]


def load_tiny_prompts(split: str | None = None) -> list[dict]:
    """Rows of ``prompts.jsonl`` as dicts ``{"prompt", "answer", "split"}``.

    ``split`` is ``"train"``, ``"test"`` or ``None`` (all rows, file order).
    ``answer`` is the gold integer as a string.
    """
    if split not in (None, "train", "test"):
        raise ValueError(f"split must be 'train', 'test' or None, got {split!r}")
    rows = []
    with open(TINY_PROMPTS, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if split is None or row["split"] == split:
                    rows.append(row)
    return rows
