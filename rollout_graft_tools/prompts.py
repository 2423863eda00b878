"""Benchmark prompts as token ids: the first `n` rows of a JSON-lines split (text or chat messages)."""

from __future__ import annotations

from pathlib import Path

from rollout_graft.assets import read_prompt_rows


def load_prompts(path: str | Path, tokenizer, split: str, n: int, offset: int = 0) -> list[list[int]]:
    """Token ids of rows `offset .. offset + n` of `split`; chat messages go through the chat template.
    Every row is checked first (ValueError naming its line: no `prompt`, an empty one)."""
    rows = read_prompt_rows(path, answer=False, split=split)[offset : offset + n]
    if len(rows) < n:
        raise SystemExit(f"{path} has only {len(rows)} {split!r} prompts after offset {offset}; need {n}")
    if isinstance(rows[0]["prompt"], list):  # chat messages
        return [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)
                ["input_ids"] for r in rows]
    return [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
