"""Verify-forward latency, profiled on the actual device/dtype/threads (DESIGN.md §2 step 4).

`CostModel.profile` times the target's forward over a grid of batch sizes × tokens per row
(at a fixed cached context) and caches the table on disk, keyed by model, device, dtype and
threads; `predict` interpolates it (bilinear; linear extrapolation past the grid's edge). The
rest of a step (tree building, sampling along the walk, learning) depends on the proposer and is
measured online (`dcut.trees.TreeStepCost`), which also replaces the table's forwards by measured
ones: the table is a prior. Each cell is timed as a ratio to a plain (one-token) forward timed right
before it, and a row is its fastest plain forward × each cell's median ratio over the passes: a shared
machine's load slows both forwards of a pair alike, so a profile taken on a busy machine keeps the
table's shape (how much dearer a wider forward is), which is what D-cut's choice depends on.
Profiling is bounded: a cell slower than `cell_limit_ms` ends its row of the grid (the rest is
extrapolated linearly in tokens); cells faster than a quarter of it are timed again in whole passes.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
import warnings
from bisect import bisect_left
from datetime import datetime, timezone
from pathlib import Path

import torch

from .files import atomic_write_json, is_finite_number, is_int, read_json, require_keys
from .runner import ModelRunner

DEFAULT_BATCHES = (1, 4, 16, 64)
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64)


def _cache_dir() -> Path:
    return Path(os.environ.get("ROLLOUT_GRAFT_CACHE", Path.home() / ".cache" / "rollout_graft")) / "cost"


def neighbours(xs: list[float], x: float) -> tuple[int, int, float]:
    """Neighbouring grid indices and weight of the upper one (extrapolates at the ends: a weight
    outside [0, 1])."""
    if len(xs) == 1:
        return 0, 0, 0.0
    j = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    i = j - 1
    return i, j, (x - xs[i]) / (xs[j] - xs[i])


class CostModel:
    """latency_ms[batch][tokens_per_row] of one verify forward."""

    def __init__(self, batches: list[int], tokens: list[int], latency_ms: list[list[float]], key: str = "",
                 meta: dict | None = None):
        self.batches, self.tokens, self.latency_ms, self.key = list(batches), list(tokens), latency_ms, key
        self.meta = dict(meta or {})  # when and under what load it was profiled (`profile`; {} for an old cache)
        self._memo: dict[tuple[int, float], float] = {}  # predictions made (the table does not change once built)

    def predict(self, batch: int, tokens_per_row: float) -> float:
        """Predicted milliseconds for `batch` rows verifying `tokens_per_row` nodes each.

        Between two profiled batch sizes, at the same tokens in all: each neighbouring row of the
        table is read where it computes batch · tokens_per_row tokens (interpolated along its token
        counts), then the two are interpolated by batch size. A forward's cost follows the tokens
        it computes and the rows whose caches it reads; on an accelerator it is flat while the
        weights' reads dominate, up to a knee in total tokens: read at equal tokens per row, a
        batch between two grid rows would be priced on a line across that knee (8 rows of 31
        tokens on the H800 roofline, between rows 4 and 16: `tests/test_budget.py`). Exact for a
        cost linear in rows and tokens, as a reading at equal tokens per row is too."""
        ms = self._memo.get((batch, tokens_per_row))
        if ms is None:  # D-cut prices a few (rows, width) pairs every step: interpolate each once
            bi, bj, bw = neighbours(self.batches, batch)
            total = batch * tokens_per_row

            def row(b: int) -> float:
                ti, tj, tw = neighbours(self.tokens, total / self.batches[b])
                return (1 - tw) * self.latency_ms[b][ti] + tw * self.latency_ms[b][tj]
            ms = self._memo[batch, tokens_per_row] = max((1 - bw) * row(bi) + bw * row(bj), 1e-3)
        return ms

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict:
        return {"batches": self.batches, "tokens": self.tokens, "latency_ms": self.latency_ms, "key": self.key,
                **self.meta}

    @staticmethod
    def from_json(d: dict, source: str = "cost table") -> "CostModel":
        """The table `to_json` wrote; ValueError naming `source` when it is malformed (missing keys,
        grids that are not increasing positive ints, a latency table of the wrong shape or with
        negative or non-finite values). Keys of `META_KEYS` missing (an older cache) leave them unset."""
        require_keys(d, ("batches", "tokens", "latency_ms"), source, "the cost table")
        for name in ("batches", "tokens"):
            grid = d[name]
            if (not isinstance(grid, list) or not grid or not all(is_int(x) and x > 0 for x in grid)
                    or grid != sorted(set(grid))):
                raise ValueError(f"the cost table {source}: {name} must be a non-empty increasing list of positive "
                                 f"ints, got {grid!r}")
        table = d["latency_ms"]
        shape = (len(d["batches"]), len(d["tokens"]))
        if (not isinstance(table, list) or len(table) != shape[0]
                or not all(isinstance(r, list) and len(r) == shape[1] for r in table)):
            raise ValueError(f"the cost table {source}: latency_ms must be {shape[0]} rows of {shape[1]} numbers "
                             "(batches × tokens)")
        if not all(is_finite_number(x) and x >= 0 for r in table for x in r):
            raise ValueError(f"the cost table {source}: latency_ms holds a negative, non-finite or non-numeric value")
        key = d.get("key", "")
        if not isinstance(key, str):
            raise ValueError(f"the cost table {source}: key must be a string, got {key!r}")
        return CostModel(d["batches"], d["tokens"], [[float(x) for x in r] for r in table], key,
                         {k: d[k] for k in META_KEYS if k in d})

    # ------------------------------------------------------------------ profiling
    @staticmethod
    def key_for(model) -> str:
        p = next(model.parameters())
        cfg = model.config
        ident = f"{getattr(cfg, 'name_or_path', '')}|{cfg.model_type}|{sum(x.numel() for x in model.parameters())}"
        ident += f"|{p.device}|{p.dtype}|threads={torch.get_num_threads()}|forward-only|paired|steady"
        ident += f"|attention={getattr(cfg, '_attn_implementation', None)}"  # folded or not (`EngineConfig.fold_gqa`)
        return hashlib.sha1(ident.encode()).hexdigest()[:16]

    @staticmethod
    def profile(model, batches=DEFAULT_BATCHES, tokens=DEFAULT_TOKENS, context: int = 128, repeats: int = 3,
                max_tokens_per_forward: int = 4096, cell_limit_ms: float = 400.0, use_cache: bool = True,
                refresh: bool = False) -> "CostModel":
        """Time verify forwards on this hardware; cached on disk unless `refresh`."""
        key = CostModel.key_for(model)
        path = _cache_dir() / f"{key}.json"
        if use_cache and not refresh and path.exists():
            cached = _read_cache(path)
            if cached is not None and cached.batches == list(batches) and cached.tokens == list(tokens):
                return cached
        meta = {"profiled_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "loadavg": {"before": _loadavg()}, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
        runner = ModelRunner(model)
        time_forward(runner, 1, 1, context, runner.vocab_size, 1)  # first-call allocations
        passes = [_grid(runner, batches, tokens, context, max_tokens_per_forward, cell_limit_ms)]
        for _ in range(repeats - 1):  # cheap cells again, in whole passes: a busy spell distorts one pass
            passes.append(_grid(runner, batches, tokens, context, max_tokens_per_forward, cell_limit_ms / 4, passes[0]))
        # each row: its fastest plain forward × each cell's median ratio to the plain forward timed beside it
        # (a shared machine's load slows both of a pair alike: the table's shape survives a busy profile)
        table = [[min(p[b][0] for p in passes) * statistics.median(p[b][1][i] for p in passes)
                  for i in range(len(tokens))] for b in range(len(batches))]
        meta["loadavg"]["after"] = _loadavg()
        cost = CostModel(list(batches), list(tokens), _monotone(table), key, meta)
        if use_cache:
            atomic_write_json(path, cost.to_json())
        return cost


META_KEYS = ("profiled_at", "loadavg", "cpu_count", "torch_threads")
"""What `CostModel.meta` records of a profile: when (`profiled_at`, ISO-8601 UTC), the machine's
1/5/15-minute load averages before and after it (`loadavg`: {"before": [...], "after": [...]}, None
where `os.getloadavg` is unavailable), `os.cpu_count()` and torch's threads."""


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # Windows; a system without load averages
        return None


def _read_cache(path: Path) -> CostModel | None:
    """The cached table at `path`, or None (with a warning naming the file) when it is corrupt:
    the caller profiles again and overwrites it."""
    try:
        return CostModel.from_json(read_json(path, "the cost cache"), str(path))
    except ValueError as e:
        warnings.warn(f"{e}; profiling again (the cache is rewritten)", RuntimeWarning, stacklevel=3)
        return None


def _grid(runner: ModelRunner, batches, tokens, context: int, max_tokens_per_forward: int, cell_limit_ms: float,
          known: list | None = None) -> list[tuple[float, list[float]]]:
    """One pass over the grid: per batch size, (a plain forward's ms, each token count's ms over the
    plain forward timed right before it). A cell over `max_tokens_per_forward` tokens, or past a cell
    slower than `cell_limit_ms` in its row, is extrapolated linearly in tokens (or, with `known`, an
    earlier pass, taken from it)."""
    out = []
    for b, batch in enumerate(batches):
        plain = time_forward(runner, batch, 1, context, runner.vocab_size, 1)
        ratios: list[float] = []
        for q in tokens:
            slow = ratios and ratios[-1] * plain > cell_limit_ms
            too_big = batch * q > max_tokens_per_forward or slow
            if q == tokens[0] and q == 1:
                ratios.append(1.0)
            elif too_big and known is not None:
                ratios.append(known[b][1][len(ratios)])
            elif too_big and ratios:
                ratios.append(ratios[-1] * q / tokens[len(ratios) - 1])
            else:
                base = time_forward(runner, batch, 1, context, runner.vocab_size, 1)
                ratios.append(time_forward(runner, batch, q, context, runner.vocab_size, 1) / base)
        out.append((plain, ratios))
    return out


@torch.inference_mode()
def time_forward(runner: ModelRunner, batch: int, q: int, context: int, vocab: int, repeats: int) -> float:
    """Best of `repeats` verify forwards of `batch` rows × `q` tree tokens over a cached context, in the
    steady state of a rollout's steps (after one untimed forward that reserves the cache's room)."""
    dev = runner.device
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (batch, context), generator=gen).tolist()
    runner.prefill([prompt[0]], torch.zeros(batch, dtype=torch.long))
    tokens = torch.randint(0, vocab, (batch, q), generator=gen).to(dev)
    positions = (context + torch.arange(q)).expand(batch, q).to(dev)
    mask = torch.ones(q, q, dtype=torch.bool).tril().expand(batch, q, q).to(dev)
    times = []
    for i in range(repeats + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        runner.verify(tokens, positions, mask)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i:  # the first forward after a prefill also copies every row's prompt KV into a cache with spare
            times.append((time.perf_counter() - start) * 1000)  # room (`SlotLayer._reserve`): a rollout's steps do not
        runner.truncate(context)
    runner.release()
    return min(times)  # best-of: the intrinsic cost, robust to a noisy shared machine


def _monotone(table: list[list[float]]) -> list[list[float]]:
    """Latency never decreases with more rows or more tokens (removes timing noise)."""
    out = [list(row) for row in table]
    for b, row in enumerate(out):
        for q in range(len(row)):
            row[q] = max(row[q], row[q - 1] if q else 0.0, out[b - 1][q] if b else 0.0)
    return out
