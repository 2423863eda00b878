"""Embedded tiny models and prompts for tests, examples and CPU benchmarks.

``tiny-math/`` holds a Qwen3-architecture target (~1.7M params) and draft (~0.28M params)
trained from scratch on synthetic step-by-step arithmetic word problems, sharing one
byte-level BPE tokenizer, plus held-out RL prompts. Regenerate with
``python lab/make_tiny_models.py``.

Prompt format: ``"Question: <problem>\\nAnswer:"``; completions end with a line
``"#### <integer>"`` followed by the EOS token ``<|endoftext|>``.

``real-prompts/prompts.jsonl`` holds chat-formatted prompts for real instruct models (written by
the project): 64 grade-school math word problems with integer gold answers and 32 short Python
coding tasks with an assert test each. Load them with :func:`load_real_prompts`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

TINY_MATH = Path(__file__).parent / "tiny-math"
TINY_TARGET = TINY_MATH / "target"
TINY_DRAFT = TINY_MATH / "draft"
TINY_PROMPTS = TINY_MATH / "prompts.jsonl"

TINY_PROMPT_CUE = "\nAnswer:"
TINY_ANSWER_PATTERN = r"####\s*(-?\d+)"

REAL_PROMPTS = Path(__file__).parent / "real-prompts" / "prompts.jsonl"

__all__ = [
    "REAL_PROMPTS",
    "TINY_ANSWER_PATTERN",
    "TINY_DRAFT",
    "TINY_MATH",
    "TINY_PROMPTS",
    "TINY_PROMPT_CUE",
    "TINY_TARGET",
    "load_real_prompts",
    "load_tiny_prompts",
    "read_jsonl",
    "read_prompt_rows",
    "read_prompt_texts",
]


def read_jsonl(path: str | Path, **match: str | None) -> list[dict]:
    """Rows of a JSON-lines prompt file (file order) whose fields equal every non-None `match`
    value; a row without the field matches (a file without `split` is all one split). ValueError
    naming the file and line of a line that is not UTF-8, not JSON or not a JSON object."""
    rows = [row for _, row in _numbered_rows(path)]
    return [r for r in rows if all(v is None or r.get(k, v) == v for k, v in match.items())]


def read_prompt_rows(path: str | Path, integer_answer: bool = True, answer: bool = True,
                     **match: str | None) -> list[dict]:
    """`read_jsonl` for a training dataset, every row of the file checked up front (before any
    training step; ValueError naming the file, line and field): `prompt` is a non-empty string or a
    list of chat messages ({"role": str, "content": str}); with `answer`, `answer` is present and,
    with `integer_answer` (what the tiny-math rewards compare: `assets.rewards`), an int or a string
    that parses as one."""
    numbered = _numbered_rows(path)
    for line, row in numbered:
        _check_prompt_row(row, f"{path} line {line}", answer, answer and integer_answer)
    return [r for _, r in numbered if all(v is None or r.get(k, v) == v for k, v in match.items())]


def _numbered_rows(path: str | Path) -> list[tuple[int, dict]]:
    """(line number from 1, row) of every non-blank line."""
    try:
        lines = Path(path).read_bytes().split(b"\n")
    except FileNotFoundError:
        raise ValueError(f"dataset {path} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"dataset {path} is a folder: pass a JSON-lines file") from None
    out = []
    for n, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path} line {n} is not UTF-8 text: re-encode the file as UTF-8") from None
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {n} is not valid JSON ({e.msg}, column {e.colno}): one JSON object per "
                             "line") from None
        except ValueError as e:  # a number longer than Python parses (sys.get_int_max_str_digits)
            raise ValueError(f"{path} line {n} holds a number Python does not parse ({e}): write it as a string, "
                             'e.g. "answer": "123..."') from None
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {n} holds a JSON {type(row).__name__}, not an object with `prompt` and `answer`")
        out.append((n, row))
    return out


def _check_prompt_row(row: dict, where: str, with_answer: bool, integer_answer: bool) -> None:
    for name in ("prompt", "answer") if with_answer else ("prompt",):
        if name not in row:
            raise ValueError(f"{where} has no `{name}` field (has {sorted(row)})")
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError(f"{where}: `prompt` is empty")
    elif not (isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)):
        raise ValueError(f"{where}: `prompt` must be a string or a non-empty list of chat messages "
                         f'{{"role": str, "content": str}}, got {type(prompt).__name__} {prompt!r:.80}')
    answer = row.get("answer")
    if integer_answer and not _is_integer_answer(answer):
        raise ValueError(f"{where}: `answer` must be an integer (or a string of one, e.g. \"42\"), got "
                         f"{type(answer).__name__} {answer!r:.80}")


def _is_integer_answer(answer) -> bool:
    if isinstance(answer, bool):
        return False
    if isinstance(answer, int):
        return True
    if isinstance(answer, str):  # any length: the rewards compare digits, never int()
        return _INTEGER.fullmatch(answer) is not None
    return False


_INTEGER = re.compile(r"\s*[+-]?\d+\s*")


def read_prompt_texts(path: str | Path, tokenizer, **match: str | None) -> list[str]:
    """The `prompt` of every row of a JSON-lines file (those matching `match`, as `read_jsonl`) as the
    text a generation call takes: a string as it is, chat messages through the tokenizer's chat
    template (as TRL sends them to vLLM). Every row is checked first (`read_prompt_rows` without
    answers: ValueError naming the line)."""
    return [r["prompt"] if isinstance(r["prompt"], str)
            else tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
            for r in read_prompt_rows(path, answer=False, **match)]


def load_tiny_prompts(split: str | None = None) -> list[dict]:
    """Rows of ``prompts.jsonl`` as dicts ``{"prompt", "answer", "split"}``.

    ``split`` is ``"train"``, ``"test"`` or ``None`` (all rows, file order).
    ``answer`` is the gold integer as a string.
    """
    if split not in (None, "train", "test"):
        raise ValueError(f"split must be 'train', 'test' or None, got {split!r}")
    return read_jsonl(TINY_PROMPTS, split=split)


def load_real_prompts(split: str | None = None, kind: str | None = None) -> list[dict]:
    """Rows of ``real-prompts/prompts.jsonl`` as dicts ``{"prompt", "answer", "kind", "split"}``.

    ``prompt`` is a chat message list ``[{"role": "system", ...}, {"role": "user", ...}]`` (apply
    the model's chat template). ``split`` is ``"train"``, ``"test"`` or ``None``; ``kind`` is
    ``"math"``, ``"code"`` or ``None`` (``None``: no filter). Rows keep file order: math before
    code, test before train within each kind. ``answer`` is the gold integer as a string for math
    and a Python ``assert`` statement (run after the function's definition) for code.
    """
    if split not in (None, "train", "test"):
        raise ValueError(f"split must be 'train', 'test' or None, got {split!r}")
    if kind not in (None, "math", "code"):
        raise ValueError(f"kind must be 'math', 'code' or None, got {kind!r}")
    return read_jsonl(REAL_PROMPTS, split=split, kind=kind)
