"""Rollout statistics (standard terms: MAT = mean accepted tokens per target forward per sequence,
counting the bonus/recovered token, so plain decoding has MAT = 1)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(slots=True)
class RolloutStats:
    target_forwards: int = 0  # verify forwards of the target (prefill excluded)
    row_steps: int = 0  # Σ over forwards of the rows taking part
    emitted_tokens: int = 0  # completion tokens returned (after truncation at stop/length)
    verified_tokens: int = 0  # Σ tree nodes (root included) sent through the target
    seconds: dict[str, float] = field(default_factory=dict)  # per phase: prefill, propose, verify, accept, ...
    # per step: rows, ratio, kept, candidates, expected, actual, break_even_mat, expected_mat (`BudgetDecision`)
    budget_trace: list[dict] = field(default_factory=list)
    accept_hist: list[int] = field(default_factory=list)  # [a]: row-steps that emitted a accepted + 1 bonus token

    def count_emitted(self, emitted: int) -> None:
        """One row-step emitted `emitted` tokens (accepted + bonus, after cutting at a stop token)."""
        if emitted <= 0:
            return
        self.accept_hist.extend([0] * (emitted - len(self.accept_hist)))
        self.accept_hist[emitted - 1] += 1

    @property
    def budget_ratio(self) -> float | None:
        """Mean ρ the budget policy chose (verified width / budget; 1.0 for a fixed budget), None before a step."""
        if not self.budget_trace:
            return None
        return sum(t["ratio"] for t in self.budget_trace) / len(self.budget_trace)

    @property
    def drafted_share(self) -> float | None:
        """Share of the steps that verified a draft (ρ > 0), None before a step."""
        if not self.budget_trace:
            return None
        return sum(t["ratio"] > 0 for t in self.budget_trace) / len(self.budget_trace)

    def verdict(self) -> tuple[float, float] | None:
        """Why the budget policy verified what it verified, averaged over the steps it weighed a
        draft: (tokens per row a step at its best drafting width had to emit to match plain decoding's
        rate, tokens per row it expected such a step to emit). D-cut decodes plainly where the first
        exceeds the second. None where no step weighed a draft (a fixed budget, or D-cut waiting)."""
        weighed = [t for t in self.budget_trace if t.get("break_even_mat") is not None]
        if not weighed:
            return None
        return (sum(t["break_even_mat"] for t in weighed) / len(weighed),
                sum(t["expected_mat"] for t in weighed) / len(weighed))

    @property
    def weighed_share(self) -> float | None:
        """Share of the steps where the budget policy weighed a draft (the others decoded plainly without a
        decision: D-cut waiting for its next probe), None before a step or without such a policy."""
        if not self.budget_trace or self.verdict() is None:
            return None
        return sum(t.get("break_even_mat") is not None for t in self.budget_trace) / len(self.budget_trace)

    @property
    def draft_won_share(self) -> float | None:
        """Among the steps that weighed a draft, the share where drafting was expected to pay (break-even below
        expected: D-cut drafted); at the others plain won and the step verified its draft as a probe only."""
        weighed = [t for t in self.budget_trace if t.get("break_even_mat") is not None]
        if not weighed:
            return None
        return sum(t["break_even_mat"] < t["expected_mat"] for t in weighed) / len(weighed)

    @property
    def mean_accepted_tokens(self) -> float:
        return self.emitted_tokens / max(self.row_steps, 1)

    @property
    def verify_tokens_per_step(self) -> float:
        return self.verified_tokens / max(self.target_forwards, 1)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def tokens_per_second(self) -> float:
        return self.emitted_tokens / max(self.total_seconds, 1e-9)

    @contextmanager
    def timed(self, phase: str, sync: Callable[[], None] | None = None):
        """Add the block's wall seconds to `seconds[phase]`; sync (e.g. a GPU synchronize) is called
        at its end, so device work is counted where it runs."""
        start = time.perf_counter()
        try:
            yield
        finally:
            if sync is not None:
                sync()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def as_dict(self) -> dict[str, float]:
        return {
            "target_forwards": self.target_forwards,
            "row_steps": self.row_steps,
            "emitted_tokens": self.emitted_tokens,
            "verified_tokens": self.verified_tokens,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "verify_tokens_per_step": self.verify_tokens_per_step,
            "tokens_per_second": self.tokens_per_second,
            "budget_ratio": self.budget_ratio,
            "accept_hist": list(self.accept_hist),
            "seconds": dict(self.seconds),
        }


@dataclass(slots=True)
class StepTiming:
    """Wall milliseconds of one engine step, by what the budget policy prices separately."""

    propose_ms: float = 0.0  # proposing and cutting the draft, building the tree
    forward_ms: float = 0.0  # the target's verify forward
    rest_ms: float = 0.0  # accepting, learning, bookkeeping

    @property
    def total_ms(self) -> float:
        return self.propose_ms + self.forward_ms + self.rest_ms


PHASE_PART = {"propose": "propose_ms", "verify": "forward_ms", "accept": "rest_ms", "learn": "rest_ms",
              "bookkeeping": "rest_ms"}
"""Which `StepTiming` field each engine phase adds to."""


class StepTimer:
    """The one clock of an engine step: each phase's seconds go to the rollout's `RolloutStats` and
    into this step's `StepTiming`. sync: called at the end of every phase (a GPU synchronize, so
    device work is counted where it runs), or None."""

    def __init__(self, stats: RolloutStats, sync: Callable[[], None] | None = None):
        self.stats, self.sync, self.timing = stats, sync, StepTiming()

    @contextmanager
    def phase(self, name: str):
        before = self.stats.seconds.get(name, 0.0)
        with self.stats.timed(name, self.sync):
            yield
        part = PHASE_PART[name]
        setattr(self.timing, part, getattr(self.timing, part) + 1000.0 * (self.stats.seconds[name] - before))
