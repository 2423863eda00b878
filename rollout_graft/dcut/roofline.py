"""An accelerator's decode step as a roofline: D-cut's start profile on a GPU it knows.

A step verifying `tokens` tokens (one per row plus its draft tokens) costs
overhead + max(bytes / (BW·η_mem), flops / (peak·η_flop)) (+ `spec_ms` when any row drafted):
bytes = the weights once + every row's KV cache read, flops = 2·params per token + attention over
each row's context. Flat in draft tokens while memory-bound (extra tokens ride on the weight read),
linear once compute-bound: a shape a line through the first draft token cannot fit
(`chains.ChainDCut(profile=...)`). The presets' public sources and what the replays show of a
profile that is off: docs/DESIGN.md, "Modelled clocks".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Accelerator:
    name: str
    tflops: float  # dense bf16 peak, TFLOP/s
    tbps: float  # HBM bandwidth, TB/s


ACCELERATORS = {  # NVIDIA's datasheets, SXM parts: dense bf16 (half the sparsity figure headlined)
    "H20": Accelerator("H20", 148.0, 4.0),
    "H800": Accelerator("H800", 989.0, 3.35),
    "H200": Accelerator("H200", 989.0, 4.8),
    "H100": Accelerator("H100", 989.0, 3.35),
}


def accelerator_named(device_name: str) -> Accelerator | None:
    """The preset of a GPU by the name CUDA gives it ("NVIDIA H200", "NVIDIA H100 80GB HBM3"); None
    for any other part (its PCIe and NVL versions included: other clocks and bandwidths)."""
    words = device_name.upper().replace("-", " ").split()
    if any(w in ("PCIE", "NVL") for w in words):
        return None
    found = [a for key, a in ACCELERATORS.items() if key in words]
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float  # parameters (2 flops each per token)
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    bytes_per_value: int = 2  # the KV cache's (and, without `weight_bytes`, the weights')
    weight_bytes: float | None = None  # bytes of weights read per step (None: params · bytes_per_value)

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_value  # K and V

    @property
    def read_bytes(self) -> float:
        return self.params * self.bytes_per_value if self.weight_bytes is None else self.weight_bytes

    def attention_flops(self, queries: np.ndarray, contexts: np.ndarray) -> float:
        """QKᵀ and AV (2 flops per multiply-add each) of `queries[i]` new tokens over `contexts[i]` keys."""
        return float(4.0 * self.layers * self.q_heads * self.head_dim * np.sum(queries * (contexts + queries)))


@dataclass(frozen=True)
class Roofline:
    """overhead_ms + max(bytes / (BW·eta_mem), flops / (peak·eta_flop)) + spec_ms·[any drafted].

    Defaults (parameters, not measurements): eta_mem 0.85 and eta_flop 0.8 are near what one H200
    was measured at (~4.3 of 4.8 TB/s on a device copy, ~790 of 989 TFLOP/s on a bf16 8192³
    matmul); overhead_ms 1.5 is a decode step's scheduling, sampling and launch time outside the
    forward; spec_ms 0.5 is the speculative path's metadata and rejection sampler."""

    accelerator: Accelerator
    model: ModelShape
    overhead_ms: float = 1.5
    eta_mem: float = 0.85
    eta_flop: float = 0.8
    spec_ms: float = 0.5

    @property
    def name(self) -> str:
        return f"{self.accelerator.name}/{self.model.name}"

    def step_ms(self, drafts, contexts) -> float:
        """ms of a step where running row i verifies drafts[i] draft tokens over contexts[i] tokens."""
        drafts, contexts = np.asarray(drafts, dtype=np.float64), np.asarray(contexts, dtype=np.float64)
        queries = 1.0 + drafts  # each row verifies its drafts and samples one token more
        kv = float(np.sum(contexts + queries))
        return float(self._ms(queries.sum(), kv, self.model.attention_flops(queries, contexts), drafts.sum()))

    def profile_ms(self, rows, draft_tokens, context) -> np.ndarray:
        """ms of a step of `rows` rows at context `context`, for each total of draft tokens (spread
        evenly over the rows): what a profile at server start would measure. D-cut asks it each step
        for one count (Python floats: a plain step's, the step's drafts') and for every count of the
        step's draft tokens (an array: one compiled pass where numba is installed,
        `_kernels.roofline_profile`, the numpy definition's operations in its order: its floats exactly)."""
        if np.ndim(draft_tokens) == 0:
            return self._profile(rows, float(draft_tokens), context)
        k = np.asarray(draft_tokens, dtype=np.float64)
        kernels = _compiled()
        if kernels is not None:
            return kernels.roofline_profile(k, rows, context, rows * context, *self._constants, self.overhead_ms, self.spec_ms)
        return self._profile(rows, k, context)

    @functools.cached_property
    def _constants(self) -> tuple[float, float, float, float, float, float]:
        """The step's constants: 4·layers·q_heads·head_dim, the weights' bytes, KV bytes a token,
        2·params, and the peaks times their η (computed once: D-cut reads the profile every step, a
        quiet one included)."""
        m, a = self.model, self.accelerator
        return (4.0 * m.layers * m.q_heads * m.head_dim, m.read_bytes, m.kv_bytes_per_token, 2.0 * m.params,
                a.tbps * 1e12 * self.eta_mem, a.tflops * 1e12 * self.eta_flop)

    def _profile(self, rows, k, context):
        """`profile_ms` in numpy (or Python floats, `k` one float): its definition."""
        tokens = rows + k
        attention = self._constants[0] * (tokens * context + tokens * tokens / max(rows, 1))
        return self._ms(tokens, rows * context + tokens, attention, k)

    def _ms(self, tokens, kv_tokens, attention_flops, draft_tokens):
        """The roofline of a step verifying `tokens` tokens whose KV reads cover `kv_tokens`."""
        _, read_bytes, kv_bytes, c_flops, mem_per_s, flops_per_s = self._constants
        mem_ms = 1000.0 * (read_bytes + kv_bytes * kv_tokens) / mem_per_s
        flop_ms = 1000.0 * (c_flops * tokens + attention_flops) / flops_per_s
        if isinstance(draft_tokens, float):
            return self.overhead_ms + max(mem_ms, flop_ms) + self.spec_ms * (1.0 if draft_tokens > 0 else 0.0)
        return self.overhead_ms + np.maximum(mem_ms, flop_ms) + self.spec_ms * (np.asarray(draft_tokens) > 0)


@functools.cache
def _compiled():
    """The compiled kernels (`_kernels`), or None where numba is not installed (the vLLM extra and
    the test extra bring it; the engine's install may not)."""
    try:
        from . import _kernels
    except ImportError:
        return None
    return _kernels


@dataclass
class ContextProfile:
    """A `ChainDCut` profile (rows, draft tokens → ms) from a clock's `profile_ms` at the batch's
    mean context now (`contexts()`: each running row's tokens), so its KV reads follow the rollout's
    lengths rather than one profiled at start."""

    clock: Roofline
    contexts: Callable[[], np.ndarray]
    _mean: tuple = (None, 0.0)  # (the contexts array last read, its mean): D-cut asks several times a step

    def __call__(self, rows: int, draft_tokens: np.ndarray) -> np.ndarray:
        now = self.contexts()
        if now is not self._mean[0]:
            # np.mean's float64 sum over the count, without its per-call Python (tens of µs on a cold cache)
            self._mean = (now, float(np.add.reduce(now, dtype=np.float64) / len(now)) if len(now) else 0.0)
        return self.clock.profile_ms(rows, draft_tokens, self._mean[1])
