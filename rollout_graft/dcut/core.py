"""What both backends' D-cut share, in numpy (the vLLM worker imports it; the engine converts at its
boundary: `trees.DCut.calibrated`) — `CostFit` compiled (numba, imported when one is built).

- `BudgetDecision`: what a policy decided for a step, and why;
- `ScoreCalibration`: a draft's raw score → the acceptance rate observed for such scores;
- `ProbeCredit`: when a policy that decided plain decoding proposes again;
- `CostFit`: a step's time fitted to measured steps by exponentially weighted least squares
  (vLLM's whole step over rows and draft tokens: `chains.step_cost_fit`);
- `RowCost`: the same fit of a + b·rows in closed form (the engine's time outside the forward, the
  vLLM proposer's drafting time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

RIDGE = 1e-9
"""A prior at 0 of this weight on a coefficient (`CostFit.ridge`) only splits coefficients the data
cannot tell apart; measured steps outweigh it from the first."""


@dataclass(slots=True)
class BudgetDecision:
    ratio: float  # verified width / budget (a fixed budget verifies its whole draft: 1.0)
    kept: int | None = None  # candidate nodes kept (whole batch; None: not counted)
    candidates: int | None = None  # candidate nodes proposed (whole batch; None: not counted)
    expected_emitted: float | None = None  # predicted Σ emitted tokens of this step (None: no prediction)
    probe: bool = False  # a draft was proposed and D-cut chose ρ = 0 (the proposal only probed)
    # why D-cut verifies what it verifies, at its best width W > 0 (None: no such width was weighed):
    break_even_mat: float | None = None  # tokens per row a step at W must emit to match plain decoding's rate
    expected_mat: float | None = None  # tokens per row a step at W is expected to emit (calibrated acceptance)


@dataclass(eq=False)
class ScoreCalibration:
    """Maps a proposer's raw score to the acceptance rate observed for such scores.

    Raw scores are prefix products of confidences; greedy decoding or a drifting policy makes them
    biased. Verified nodes are binned by log-score (`bins` bins from `floor` to 1); each bin's
    acceptance rate (with a prior of `prior_weight` nodes that pulls an empty bin back to the raw
    score) is the calibrated estimate. Bins are made non-increasing towards lower scores so the
    calibrated score stays monotone along paths. `age` scales the counts (the chain D-cut forgets
    so, its evidence coming every step; the engine's D-cut never forgets). Host float32 arrays:
    both D-cuts count on the host, and the vLLM proposer maps every step (numpy's per-call cost,
    not torch's: D-cut's own time is part of a small model's step).
    """

    bins: int = 24
    floor: float = 1e-6
    prior_weight: float = 4.0
    edges: np.ndarray = field(init=False)  # [bins + 1] bin edges, log-spaced
    mid: np.ndarray = field(init=False)  # [bins] each bin's geometric middle (its prior rate)
    seen: np.ndarray = field(init=False)  # [bins] verified nodes counted
    accepted: np.ndarray = field(init=False)  # [bins] of which accepted

    def __post_init__(self) -> None:
        self.edges = np.logspace(np.log10(self.floor), 0.0, self.bins + 1).astype(np.float32)
        self.mid = np.sqrt(self.edges[:-1] * self.edges[1:])
        self.seen = np.zeros(self.bins, dtype=np.float32)
        self.accepted = np.zeros(self.bins, dtype=np.float32)

    def __call__(self, score: np.ndarray) -> np.ndarray:
        """The calibrated acceptance rate of each score."""
        return self.rates()[self.bin_of(score)]

    def observe(self, score: np.ndarray, verified: np.ndarray, accepted: np.ndarray) -> None:
        """Count the verified nodes of one step (same-shaped arrays: raw score, verified, accepted)."""
        b = self.bin_of(score[verified])
        self.seen += np.bincount(b, minlength=self.bins).astype(np.float32)
        self.accepted += np.bincount(b, weights=accepted[verified].astype(np.float64), minlength=self.bins).astype(np.float32)

    def add(self, seen: np.ndarray, accepted: np.ndarray) -> None:
        """Count per bin what `observe` would ([bins] float64 each: verified nodes, accepted ones)."""
        self.seen += seen.astype(np.float32)
        self.accepted += accepted.astype(np.float32)

    def age(self, factor: float) -> None:
        """Scale the counts by `factor` (< 1: older evidence weighs less)."""
        self.seen *= np.float32(factor)
        self.accepted *= np.float32(factor)

    def rates(self) -> np.ndarray:
        """[bins] each bin's calibrated acceptance rate (float32), monotone in the raw score."""
        pw = np.float32(self.prior_weight)
        return np.maximum.accumulate((self.accepted + pw * self.mid) / (self.seen + pw))

    def bin_of(self, score: np.ndarray) -> np.ndarray:
        """Each score's bin: scores clamped to [floor, 1], a score on an edge in the bin below it
        (numpy.searchsorted's left side, torch.bucketize's default: the engine bins on its device so)."""
        clipped = np.minimum(np.maximum(score.astype(np.float32), self.edges[0]), np.float32(1.0))
        return np.minimum(np.maximum(np.searchsorted(self.edges, clipped, side="left") - 1, 0), self.bins - 1)


@dataclass(slots=True)
class ProbeCredit:
    """How long a budget policy that decided plain decoding waits before proposing again (a probe:
    the draft is built, and may again be cut to nothing). Every step earns `share` of its time, a
    speculative step also what it saved against plain steps for the same tokens; a probe spends
    what it cost beyond a plain step. So probes that find nothing cost at most `share` of the
    decoding time plus what speculation saved — however dear a probe is next to a plain step —
    and where speculation pays (a small batch) probing is not held back. Both backends' D-cut use it."""

    share: float
    ms: float = 0.0  # what the probes may still cost

    def earn(self, step_ms: float, saved_ms: float = 0.0) -> None:
        self.ms += self.share * step_ms + max(saved_ms, 0.0)

    def spend(self, extra_ms: float) -> None:
        self.ms -= max(extra_ms, 0.0)

    def settle(self, ms: float, plain_ms: float, rows: int, emitted: int, probe: bool, cost: float | None = None) -> None:
        """One step's account (`ms`, against `plain_ms` predicted for a plain step of `rows` rows):
        it earns `share` of its time; a probe spends what it cost beyond plain steps for the tokens it
        emitted — `cost` where the caller knows it (a chain draft cut to nothing: vLLM took its plain
        path, so only the drafting), else `ms - plain_ms · emitted / rows` (a probe that verified and
        paid earns); a step whose drafts were accepted also earns what it saved against plain steps."""
        net = ms - plain_ms * emitted / rows  # this step's time beyond plain steps for its tokens
        self.earn(ms, -net if emitted > rows and not probe else 0.0)
        if probe:
            if cost is None:
                self.ms -= net
            else:
                self.spend(cost)

    def bank_at_most(self, ms: float) -> None:
        """A long spell of paying speculation banks no more than `ms` (two probes)."""
        self.ms = min(self.ms, ms)

    def affords(self, probe_ms: float) -> bool:
        return self.ms >= probe_ms


@dataclass(eq=False)
class CostFit:
    """ms ≈ coef · x, x a step's features (the first is 1: the fixed cost), fitted by exponentially
    weighted least squares: each observation multiplies the weight of every earlier one by `forget`,
    so the fit follows a machine whose speed moves and a batch that drains.

    `ridge`, per coefficient, is the weight of a prior at 0 (added to the weighted Gram matrix's
    diagonal): `RIDGE` splits confounded coefficients (a constant batch size leaves the fixed cost
    and the per-row cost confounded; predictions at the batch sizes measured are right either
    way); a larger weight is a prior that recent measurements outweigh and that takes over as they
    are forgotten. `nonnegative`: a coefficient the fit drives below 0 is fixed at 0 and the others
    refitted, the most negative first — a time has no negative parts, and a negative draft-token
    cost would price the longest drafts cheapest. `unmeasured`: the coefficients before the first
    observation (zeros unless given). `coef` is solved when read after an observation.

    Compiled (`_kernels.fit_observe`, `_kernels.fit_solve`: Gaussian elimination with partial
    pivoting; numba, imported when a fit is built): the vLLM proposer observes and reads the fit
    every step, plain steps included, and numpy's per-call cost (an array, an outer product,
    `linalg.solve` and the refits) came to about 50 µs a step inside a vLLM worker, most of
    D-cut's own time while it decodes plainly."""

    ridge: tuple[float, ...]
    forget: float
    nonnegative: bool = False
    unmeasured: tuple[float, ...] | None = None
    sums: np.ndarray = field(init=False)  # Σ w·z·zᵀ, z = (x, ms), over the observations (w: their aged weights)
    samples: int = 0  # observations so far
    _coef: np.ndarray | None = field(default=None, init=False, repr=False)  # `coef` since the last observation
    _ridge: np.ndarray = field(init=False, repr=False)
    _x: np.ndarray = field(init=False, repr=False)  # the features being observed

    def __post_init__(self) -> None:
        from . import _kernels  # numba: see `_kernels` on when it may be imported

        n = len(self.ridge)
        self.sums = np.zeros((n + 1, n + 1))
        self._ridge = np.asarray(self.ridge, dtype=np.float64)
        self._x = np.zeros(n)
        self._kernels = _kernels
        _kernels.fit_observe(np.zeros_like(self.sums), self._x, 0.0, 1.0)  # compiled (or loaded) now, not in a step
        _kernels.fit_solve(self.sums, self._ridge, self.nonnegative)

    def observe(self, x: Sequence[float], ms: float) -> None:
        self._x[:] = x
        self._kernels.fit_observe(self.sums, self._x, float(ms), float(self.forget))
        self.samples += 1
        self._coef = None

    @property
    def coef(self) -> np.ndarray:
        """The fitted coefficients, one per feature (ms per unit of it)."""
        if self._coef is None:
            if self.samples == 0:
                self._coef = np.array(self.unmeasured if self.unmeasured is not None else [0.0] * len(self.ridge),
                                      dtype=np.float64)
            else:
                self._coef = self._kernels.fit_solve(self.sums, self._ridge, self.nonnegative)
        return self._coef


@dataclass
class RowCost:
    """ms ≈ a + b·rows, fitted by exponentially weighted least squares (as `CostFit`, no prior: each
    observation multiplies the weight of every earlier one by `forget`). While the batch sizes
    measured have not varied (their weighted variance under 1e-6 of their mean's square) a and b are
    confounded, and it scales with the rows (a = 0, b = Σw·ms / Σw·rows). Past the most rows measured
    it predicts no less than proportionally to the rows: a fit made on a drained batch's tail (a few
    rows, noisy) must not price a full batch as cheap. Never negative; 0 before the first observation.
    Its sums are Python floats solved in closed form: an engine step and a vLLM step each update one,
    and numpy's per-call cost on a 3×3 system would be most of that."""

    forget: float
    most_rows: int = 0  # the most rows measured
    # Σw, Σw·rows, Σw·ms, Σw·rows², Σw·rows·ms over the observations (w: their aged weights)
    _sums: tuple[float, float, float, float, float] = field(default=(0.0, 0.0, 0.0, 0.0, 0.0), init=False, repr=False)
    _line: tuple[float, float] | None = field(default=None, init=False, repr=False)  # (a, b) since the last observation

    def observe(self, rows: int, ms: float) -> None:
        f, x, y = self.forget, float(rows), float(ms)
        w, sx, sy, sxx, sxy = self._sums
        self._sums = (w * f + 1.0, sx * f + x, sy * f + y, sxx * f + x * x, sxy * f + x * y)
        self.most_rows = max(self.most_rows, rows)
        self._line = None

    def predict(self, rows: int) -> float:
        """Predicted ms at `rows` rows."""
        if self.most_rows == 0:
            return 0.0
        if rows > self.most_rows:
            return max(self._at(rows), self._at(self.most_rows) * rows / self.most_rows)
        return self._at(rows)

    def _at(self, rows: int) -> float:
        if self._line is None:
            self._line = self._solve()
        a, b = self._line
        return max(a + b * rows, 0.0)

    def _solve(self) -> tuple[float, float]:
        w, sx, sy, sxx, sxy = self._sums
        mean = sx / w
        if sxx / w - mean**2 < 1e-6 * max(1.0, mean**2):  # one batch size measured: scale with the rows
            return 0.0, sy / max(sx, 1e-9)
        det = w * sxx - sx * sx  # the 2×2 normal equations
        return (sxx * sy - sx * sxy) / det, (w * sxy - sx * sy) / det
