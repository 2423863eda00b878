"""Verify-forward latency, profiled on the actual device/dtype/threads (DESIGN.md §2 step 4).

`CostModel.profile` times the target's forward over a grid of batch sizes × tokens per row
(at a fixed cached context) and caches the table on disk, keyed by model, device, dtype and
threads; `predict` interpolates it (bilinear; linear extrapolation past the grid's edge). The
rest of a step (tree building, sampling along the walk, learning) depends on the proposer and is
measured online by `budget.OverheadModel`. Profiling is bounded: a cell slower than
`cell_limit_ms` ends its row of the grid (the rest is extrapolated linearly in tokens); cells
faster than a quarter of it are timed again in whole passes over the grid and the best is kept
(a busy spell distorts one pass, not a region of the table).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from bisect import bisect_left
from pathlib import Path

import torch

from .runner import ModelRunner

DEFAULT_BATCHES = (1, 4, 16, 64)
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64)


def _cache_dir() -> Path:
    return Path(os.environ.get("ROLLOUT_GRAFT_CACHE", Path.home() / ".cache" / "rollout_graft")) / "cost"


def _interp(xs: list[float], x: float) -> tuple[int, int, float]:
    """Neighbouring grid indices and weight of the upper one (extrapolates at the ends)."""
    if len(xs) == 1:
        return 0, 0, 0.0
    j = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    i = j - 1
    return i, j, (x - xs[i]) / (xs[j] - xs[i])


class CostModel:
    """latency_ms[batch][tokens_per_row] of one verify forward."""

    def __init__(self, batches: list[int], tokens: list[int], latency_ms: list[list[float]], key: str = ""):
        self.batches, self.tokens, self.latency_ms, self.key = list(batches), list(tokens), latency_ms, key

    def predict(self, batch: int, tokens_per_row: float) -> float:
        """Predicted milliseconds for `batch` rows verifying `tokens_per_row` nodes each."""
        bi, bj, bw = _interp(self.batches, batch)
        ti, tj, tw = _interp(self.tokens, tokens_per_row)
        row = lambda b: (1 - tw) * self.latency_ms[b][ti] + tw * self.latency_ms[b][tj]  # noqa: E731
        return max((1 - bw) * row(bi) + bw * row(bj), 1e-3)

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict:
        return {"batches": self.batches, "tokens": self.tokens, "latency_ms": self.latency_ms, "key": self.key}

    @staticmethod
    def from_json(d: dict) -> "CostModel":
        return CostModel(d["batches"], d["tokens"], d["latency_ms"], d.get("key", ""))

    # ------------------------------------------------------------------ profiling
    @staticmethod
    def key_for(model) -> str:
        p = next(model.parameters())
        cfg = model.config
        ident = f"{getattr(cfg, 'name_or_path', '')}|{cfg.model_type}|{sum(x.numel() for x in model.parameters())}"
        ident += f"|{p.device}|{p.dtype}|threads={torch.get_num_threads()}|forward-only|passes"
        return hashlib.sha1(ident.encode()).hexdigest()[:16]

    @staticmethod
    def profile(model, batches=DEFAULT_BATCHES, tokens=DEFAULT_TOKENS, context: int = 128, repeats: int = 3,
                max_tokens_per_forward: int = 4096, cell_limit_ms: float = 400.0, use_cache: bool = True,
                refresh: bool = False) -> "CostModel":
        """Time verify forwards on this hardware; cached on disk unless `refresh`."""
        key = CostModel.key_for(model)
        path = _cache_dir() / f"{key}.json"
        if use_cache and not refresh and path.exists():
            cached = CostModel.from_json(json.loads(path.read_text()))
            if cached.batches == list(batches) and cached.tokens == list(tokens):
                return cached
        runner = ModelRunner(model)
        _time_forward(runner, 1, 1, context, runner.vocab_size, 1)  # first-call allocations
        table = _grid(runner, batches, tokens, context, max_tokens_per_forward, cell_limit_ms)
        for _ in range(repeats - 1):  # cheap cells again, in whole passes: a busy spell of a shared
            # machine then distorts one pass, not a region of the table, and the best of the passes is kept
            again = _grid(runner, batches, tokens, context, max_tokens_per_forward, cell_limit_ms / 4, table)
            table = [[min(x, y) for x, y in zip(r1, r2)] for r1, r2 in zip(table, again)]
        cost = CostModel(list(batches), list(tokens), _monotone(table), key)
        if use_cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cost.to_json()))
        return cost


def _grid(runner: ModelRunner, batches, tokens, context: int, max_tokens_per_forward: int, cell_limit_ms: float,
          known: list[list[float]] | None = None) -> list[list[float]]:
    """One timing of every cell, batches × tokens per row. A cell over `max_tokens_per_forward`
    tokens, or past a cell slower than `cell_limit_ms` in its row, is extrapolated linearly in tokens
    (or, with `known`, taken from it)."""
    table: list[list[float]] = []
    for b, batch in enumerate(batches):
        row: list[float] = []
        for q in tokens:
            too_big = batch * q > max_tokens_per_forward or (row and row[-1] > cell_limit_ms)
            if too_big and known is not None:
                row.append(known[b][len(row)])
            elif too_big and row:
                row.append(row[-1] * q / tokens[len(row) - 1])
            else:
                row.append(_time_forward(runner, batch, q, context, runner.vocab_size, 1))
        table.append(row)
    return table


@torch.inference_mode()
def _time_forward(runner: ModelRunner, batch: int, q: int, context: int, vocab: int, repeats: int) -> float:
    """Best of `repeats` verify forwards of `batch` rows × `q` tree tokens over a cached context."""
    dev = runner.device
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (batch, context), generator=gen).tolist()
    times = []
    for _ in range(repeats):
        runner.prefill([prompt[0]], torch.zeros(batch, dtype=torch.long))
        tokens = torch.randint(0, vocab, (batch, q), generator=gen).to(dev)
        positions = (context + torch.arange(q)).expand(batch, q).to(dev)
        mask = torch.ones(q, q, dtype=torch.bool).tril().expand(batch, q, q).to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        runner.verify(tokens, positions, mask)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append((time.perf_counter() - start) * 1000)
    runner.release()
    return min(times)  # best-of: the intrinsic cost, robust to a noisy shared machine


def _monotone(table: list[list[float]]) -> list[list[float]]:
    """Latency never decreases with more rows or more tokens (removes timing noise)."""
    out = [list(row) for row in table]
    for b, row in enumerate(out):
        for q in range(len(row)):
            row[q] = max(row[q], row[q - 1] if q else 0.0, out[b - 1][q] if b else 0.0)
    return out
