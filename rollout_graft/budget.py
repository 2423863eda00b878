"""D-cut: a batch-wide verification budget chosen by a cost model (DESIGN.md §2 step 4).

Every candidate node carries a score: the estimated probability that verification reaches and
accepts it (prefix product of confidences). Scores never increase along a path, so keeping the
global top-K nodes of the batch keeps each row's tree ancestor-closed; rows with poor drafts give
their verification budget to rows with good ones. K = ρ·(Σ candidates), with ρ chosen per step to
maximise expected emitted tokens / predicted step time:

    E[emitted | kept set S] = Σ_rows 1 + Σ_{i ∈ S} score_i        (bonus/recovered token + accepted)
    time(S)                 = cost(rows, 1 + |S| / rows)           (profiled latency table)

ρ = 0 (plain decoding) is always a candidate, so a step is never predicted slower than "ar".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cost import CostModel
from .tree import Draft


@dataclass(slots=True)
class BudgetDecision:
    ratio: float  # chosen ρ
    kept: int  # candidate nodes kept (whole batch)
    candidates: int  # candidate nodes proposed (whole batch)
    expected_emitted: float  # predicted Σ emitted tokens of this step


def keep_top(draft: Draft, keep: int) -> Draft:
    """Keep the `keep` highest-scoring valid nodes of the whole batch (ties: shallower first).

    The result is ancestor-closed: a node is dropped whenever its parent is (an explicit pass, so
    exact ties between a parent and a child cannot break a tree).
    """
    rows, m = draft.tokens.shape
    if m == 0:
        return draft
    score = draft.score.masked_fill(~draft.valid, -1.0).flatten()
    depth = draft.depth.flatten().float()
    key = score - depth * 1e-6  # among equal scores prefer shallower nodes
    chosen = torch.zeros(rows * m, dtype=torch.bool, device=score.device)
    if keep > 0:
        chosen[torch.topk(key, min(keep, rows * m)).indices] = True
    valid = chosen.view(rows, m) & draft.valid
    par = draft.parents.clamp(min=0)
    for _ in range(int(draft.depth.max()) if keep > 0 else 0):  # enforce ancestor closure
        valid = valid & torch.where(draft.parents < 0, True, valid.gather(1, par))
    return Draft(draft.tokens, draft.parents, draft.depth, valid, draft.score, draft.source)


class ScoreCalibration:
    """Maps a proposer's raw score to the acceptance rate observed for such scores.

    Raw scores are prefix products of confidences; greedy decoding or a drifting policy makes them
    biased. Verified nodes are binned by log-score; each bin's acceptance rate (with a prior that
    pulls an empty bin back to the raw score) is the calibrated estimate. Bins are made
    non-increasing towards lower scores so the calibrated score stays monotone along paths.
    """

    def __init__(self, bins: int = 24, floor: float = 1e-6, prior_weight: float = 4.0):
        self.edges = torch.logspace(torch.log10(torch.tensor(floor)).item(), 0.0, bins + 1)
        self.seen = torch.zeros(bins)
        self.accepted = torch.zeros(bins)
        self.prior_weight = prior_weight

    def _bin(self, score: torch.Tensor) -> torch.Tensor:
        edges = self.edges.to(score.device)
        return (torch.bucketize(score.float().clamp(min=edges[0], max=1.0), edges) - 1).clamp(0, len(self.seen) - 1)

    def observe(self, score: torch.Tensor, verified: torch.Tensor, accepted: torch.Tensor) -> None:
        """score, verified, accepted: [rows, m] (candidate nodes of one step)."""
        b = self._bin(score[verified]).cpu()
        self.seen += torch.bincount(b, minlength=len(self.seen)).float()
        self.accepted += torch.bincount(b, weights=accepted[verified].float().cpu(), minlength=len(self.seen))

    def __call__(self, score: torch.Tensor) -> torch.Tensor:
        mid = (self.edges[:-1] * self.edges[1:]).sqrt()
        rate = (self.accepted + self.prior_weight * mid) / (self.seen + self.prior_weight)
        rate = torch.cummax(rate, 0).values  # monotone in the raw score
        return rate.to(score.device)[self._bin(score)]

    def expected_vs_actual(self) -> tuple[float, float]:
        mid = (self.edges[:-1] * self.edges[1:]).sqrt()
        return float((mid * self.seen).sum()), float(self.accepted.sum())


class DCut:
    """Chooses ρ per step from `ratios` with a `CostModel`."""

    def __init__(self, cost: CostModel, ratios: tuple[float, ...], explore_every: int = 16):
        self.cost = cost
        self.ratios = tuple(sorted(set(ratios) | {0.0}))
        self.calibration = ScoreCalibration()
        self.explore_every = explore_every  # every n-th step verifies ≥ the smallest ρ > 0 to keep calibrating
        self.steps = 0
        self.idle = 0  # consecutive decisions for ρ = 0
        self.until_probe = 0  # steps left to decode plainly without even proposing

    def skip_proposal(self) -> bool:
        """Back off while speculation does not pay: after n consecutive ρ = 0 decisions, the next
        min(2^n, 64) − 1 steps decode plainly without building a tree at all (then probe again)."""
        if self.until_probe > 0:
            self.until_probe -= 1
            return True
        return False

    def _track(self, ratio: float) -> None:
        if ratio > 0:
            self.idle = 0
            return
        self.idle += 1
        self.until_probe = min(2 ** self.idle, 64) - 1

    def observe(self, draft: Draft, accepted: torch.Tensor) -> None:
        """draft: the verified (cut) draft; accepted: [rows, m] bool accepted candidates."""
        self.calibration.observe(draft.score, draft.valid, accepted)

    def decide(self, draft: Draft) -> tuple[Draft, BudgetDecision]:
        rows = draft.tokens.shape[0]
        candidates = int(draft.valid.sum())
        if candidates == 0:
            self._track(0.0)
            return draft, BudgetDecision(0.0, 0, 0, float(rows))
        # expected emitted tokens when keeping the top-K: prefix sums of the sorted calibrated scores
        scores = torch.sort(self.calibration(draft.score[draft.valid]), descending=True).values
        cum = torch.cat([scores.new_zeros(1), scores.cumsum(0)]).tolist()
        self.steps += 1
        explore = self.explore_every > 0 and self.steps % self.explore_every == 0
        best = None
        for ratio in self.ratios:
            if explore and ratio == 0.0 and len(self.ratios) > 1:
                continue
            kept = int(round(ratio * candidates))
            expected = rows + cum[kept]
            rate = expected / self.cost.predict(rows, 1.0 + kept / rows)
            if best is None or rate > best[0]:
                best = (rate, ratio, kept, expected)
        _, ratio, kept, expected = best
        self._track(ratio)
        if kept < candidates:
            draft = keep_top(draft, kept).compacted()
        return draft, BudgetDecision(ratio, kept, candidates, expected)
