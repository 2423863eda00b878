"""Budget policies for chain drafts (vLLM's speculative decoding): a draft depth per request.

vLLM verifies one chain per request and packs every scheduled token of the batch into one
forward, so its step time follows the number of scheduled tokens — the setting of the D-cut
paper itself. Each step D-cut takes every request's chain with the score of each draft token
(the prefix product of confidences, calibrated against observed acceptance by the same
`ScoreCalibration` as the engine's D-cut), keeps the batch's global top-K tokens, and picks K to
maximise expected emitted tokens per predicted step time:

    E[emitted | K] = rows + Σ_{top-K tokens} score        (one bonus/recovered token per row)
    time(K)        = a + b_rows · rows + b_draft · K      (fitted online to vLLM's measured steps)

K = 0 (plain decoding) is always a candidate. After n consecutive K = 0 decisions the proposer drafts
nothing for the next min(2^n, 16) − 1 steps without asking (`skip`): drafting and scoring chains
that D-cut then cuts away cost the tiny target 17–20 % of its wall time on our CPU without it
(docs/BENCHMARKS.md, "vLLM backend"). Scores never increase along a chain, so the
global top-K is a prefix of each chain: a depth per request (`selection.global_top_k_depths`). The step
time is measured between consecutive `propose` calls (vLLM's whole step: schedule, forward,
sample, propose) and fitted by exponentially weighted least squares (`StepCost`); every
`explore_every`-th plain decision verifies one draft token per request so the fit keeps seeing
what a draft token costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .budget import ScoreCalibration
from .selection import global_top_k_depths

@dataclass
class StepCost:
    """ms of one vLLM step ≈ a + b_rows·rows + b_draft·draft_tokens, exponentially weighted least
    squares with a weak prior that a draft token costs what a row costs (pessimistic: speculation
    has to show it pays). `samples` counts the steps measured."""

    forget: float = 0.97
    prior_weight: float = 1e-3
    gram: np.ndarray = field(default_factory=lambda: np.zeros((3, 3)))
    moment: np.ndarray = field(default_factory=lambda: np.zeros(3))
    samples: int = 0

    def observe(self, rows: int, draft_tokens: int, ms: float) -> None:
        x = np.array([1.0, rows, draft_tokens])
        self.gram = self.forget * self.gram + np.outer(x, x)
        self.moment = self.forget * self.moment + ms * x
        self.samples += 1

    @property
    def coef(self) -> np.ndarray:
        """[a, b_rows, b_draft] (ms), none negative (a coefficient the fit drives below 0 is fixed at 0
        and the others refitted). A constant batch size leaves a and b_rows confounded; predictions at
        the measured batch sizes are right either way."""
        if self.samples == 0:
            return np.array([0.0, 1.0, 1.0])
        scale = self.gram[0, 0] * self.prior_weight
        # the prior: a draft token costs what a row costs (penalise b_draft - b_rows), plus a tiny ridge
        penalty = scale * np.array([[0.0, 0.0, 0.0], [0.0, 1.0, -1.0], [0.0, -1.0, 1.0]]) + 1e-9 * np.eye(3)
        free = [0, 1, 2]
        coef = np.zeros(3)
        while free:
            sub = np.ix_(free, free)
            coef = np.zeros(3)
            coef[free] = np.linalg.solve(self.gram[sub] + penalty[sub], self.moment[free])
            if coef.min() >= 0:
                break
            free.remove(int(np.argmin(coef)))
        return np.maximum(coef, 0.0)

    def predict(self, rows: int, draft_tokens: np.ndarray | int) -> np.ndarray:
        a, b_rows, b_draft = self.coef
        return a + b_rows * rows + b_draft * np.asarray(draft_tokens, dtype=np.float64)


@dataclass(slots=True)
class ChainDecision:
    depths: np.ndarray  # [rows] draft tokens kept per row
    proposed: int  # draft tokens proposed (whole batch)
    kept: int  # draft tokens kept
    expected: float  # predicted emitted tokens of the step


class FixedChains:
    """Every request verifies its whole chain (up to `num_speculative_tokens`)."""

    def decide(self, scores: np.ndarray) -> ChainDecision:
        depths = (scores > 0).sum(1)
        return ChainDecision(depths, int(depths.sum()), int(depths.sum()), float(len(depths) + scores.sum()))

    def observe_acceptance(self, scores: np.ndarray, depths: np.ndarray, accepted: np.ndarray) -> None:
        pass

    def observe_step(self, rows: int, draft_tokens: int, ms: float, emitted: int) -> None:
        pass

    def skip(self) -> bool:
        """Whether this step drafts nothing without asking (never: a fixed budget always drafts)."""
        return False

    def explain(self) -> str:
        return "fixed budget: every request verifies its whole draft chain"


class ChainDCut:
    """D-cut for chains (see the module docstring). explore_every: every n-th decision for K = 0
    verifies one draft token per request; warmup: steps measured before the fit decides (they
    alternate full drafts and plain steps, so the fit sees both)."""

    def __init__(self, explore_every: int = 16, warmup: int = 8, longest_skip: int = 16):
        self.calibration = ScoreCalibration()
        self.cost = StepCost()
        self.explore_every = explore_every
        self.warmup = warmup
        self.longest_skip = longest_skip  # steps between decisions at most while decoding plainly (`skip`)
        self.decisions = 0
        self.plain = 0  # K = 0 decisions so far
        self.rows = 0  # rows of the last decision (for `explain`)
        self.idle = 0  # consecutive K = 0 decisions (explorations excluded)
        self.wait = 0  # steps left to skip drafting
        self.measured: dict[tuple[int, bool], float] = {}  # (rows class, drafted) → tokens per ms, moving average

    def calibrated(self, scores: np.ndarray) -> np.ndarray:
        cal = self.calibration(torch.from_numpy(scores.astype(np.float32))).numpy()
        return np.where(scores > 0, np.minimum.accumulate(cal, axis=1), 0.0)  # stays non-increasing

    def decide(self, scores: np.ndarray) -> ChainDecision:
        rows = self.rows = scores.shape[0]
        self.decisions += 1
        proposed = int((scores > 0).sum())
        cal = self.calibrated(scores)
        gains = np.concatenate([[0.0], np.cumsum(np.sort(cal[cal > 0])[::-1])])  # [proposed + 1]
        if self.cost.samples < self.warmup:  # alternate full drafts and plain steps: the fit sees both
            k = proposed if self.decisions % 2 else 0
            depths = global_top_k_depths(cal, k)
            return ChainDecision(depths, proposed, int(depths.sum()), float(rows + gains[int(depths.sum())]))
        rates = (rows + gains) / np.maximum(self.cost.predict(rows, np.arange(proposed + 1)), 1e-6)
        k = int(np.argmax(rates))
        if k > 0 and not self.pays(rows):  # the fit says draft, the measured steps say plain was faster
            k = 0
        if k == 0 and proposed:
            self.plain += 1
            self.idle += 1
            self.wait = min(2**self.idle, self.longest_skip) - 1
            if self.explore_every and self.plain % self.explore_every == 0:
                k = min(rows, proposed)
        elif k > 0:
            self.idle = 0
        depths = global_top_k_depths(cal, k)
        return ChainDecision(depths, proposed, int(depths.sum()), float(rows + gains[int(depths.sum())]))

    def skip(self) -> bool:
        """Whether this step drafts nothing without asking (backing off after K = 0 decisions)."""
        if self.wait > 0:
            self.wait -= 1
            return True
        return False

    def observe_acceptance(self, scores: np.ndarray, depths: np.ndarray, accepted: np.ndarray) -> None:
        """scores: [n, depth] raw scores of verified chains; depths: [n] tokens verified; accepted:
        [n] tokens accepted."""
        pos = np.arange(scores.shape[1]).reshape(1, -1)
        verified = torch.from_numpy(pos < depths.reshape(-1, 1))
        acc = torch.from_numpy(pos < accepted.reshape(-1, 1))
        self.calibration.observe(torch.from_numpy(scores.astype(np.float32)), verified, acc)

    def observe_step(self, rows: int, draft_tokens: int, ms: float, emitted: int) -> None:
        """A step of `rows` requests that verified `draft_tokens` took `ms` (our proposer's time
        included) and emitted `emitted` tokens."""
        self.cost.observe(rows, draft_tokens, ms)
        key = (max(rows, 1).bit_length(), draft_tokens > 0)
        rate = emitted / max(ms, 1e-6)
        self.measured[key] = rate if key not in self.measured else 0.8 * self.measured[key] + 0.2 * rate

    def pays(self, rows: int) -> bool:
        """Whether steps that drafted emitted more tokens per ms than plain steps did, at this batch
        size class (rows rounded down to a power of two); True until both were measured. It guards the
        fit, whose costs can be confounded (in a rollout, draft tokens grow with the rows)."""
        cls = max(rows, 1).bit_length()
        spec, plain = self.measured.get((cls, True)), self.measured.get((cls, False))
        return spec is None or plain is None or spec >= plain

    def explain(self) -> str:
        """Why D-cut verifies what it verifies: a draft token with acceptance p adds p tokens for
        b_draft ms; a plain step gives one token per row for (a + b_rows·rows) / rows ms; so it pays
        iff p > b_draft · rows / (a + b_rows·rows)."""
        a, b_rows, b_draft = self.cost.coef
        rows = max(self.rows, 1)
        per_token = (a + b_rows * rows) / rows
        seen = float(self.calibration.seen.sum())
        rate = float(self.calibration.accepted.sum()) / seen if seen else float("nan")
        return (f"at {rows} requests a plain step costs {per_token:.2f} ms per token; a verified draft token costs "
                f"{b_draft:.2f} ms, so it pays when accepted with probability > {b_draft / per_token:.0%}; "
                f"draft tokens were accepted at {rate:.0%} ({int(seen)} verified, fit over {self.cost.samples} steps)")
