"""Budget policies: how much of each step's draft the target verifies (DESIGN.md §2 step 4).

`FixedBudget` verifies every row's whole draft. `DCut` chooses, each step, one verified width W
for the batch — every row verifies its W best nodes (`selection.keep_best`) — maximising

    E[emitted | W] = Σ_rows (1 + Σ_{row's top-W nodes} score)       (bonus/recovered token + accepted)
    time(W)        = forward(rows, 1 + W) + outside(rows, W)         (profiled table + measured rest)

over W ∈ ratios · budget, W = 0 (plain decoding) included, so a step is never predicted slower than
"ar". A node's score is the estimated probability that verification reaches and accepts it: the
prefix product of its path's confidences, calibrated online against observed acceptance.

Three rules around the choice, each measured to matter (a D-cut ablation; see git history):
- the proposal follows the choice: the next step proposes the width chosen, twice its proposal when
  all of it was chosen (from the smallest width up): a wider tree costs more to build and learn from;
- after a plain decision nothing is proposed until the next proposal (a probe: the tree is built, and
  may again be cut to W = 0) is affordable: probes may cost `DCutConfig.probe_share` of the
  decoding time, plus what speculation saved;
- the profiled forward table is corrected by what the rollout's forwards measure (`cost.TreeStepCost`).
The other controllers an earlier D-cut had (switch margin, back-off, advantage average,
exploration, per-batch-size state) were removed after the same comparison.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from .config import DCutConfig
from .cost import CostModel, TreeStepCost
from .selection import keep_best
from .stats import StepTiming
from .tree import SOURCES, Draft


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


@dataclass(slots=True)
class StepRecord:
    """What a budget policy learns from after a step."""

    rows: int
    planned: int  # nodes per row the proposer was asked for (`plan`; 0: nothing proposed)
    draft: Draft  # the verified (cut) draft
    accepted: torch.Tensor  # [rows, m] bool: which of its nodes were accepted
    forward_tokens: int  # tokens per row of the verify forward (1 + the widest row's nodes)
    emitted: int  # tokens the step emitted (all rows)
    decision: BudgetDecision
    timing: StepTiming


class BudgetPolicy(ABC):
    """How much of each step's draft the target verifies. The engine calls, every step:

        nodes = policy.plan(rows)             # how many candidate nodes per row to propose (0: none)
        draft, decision = policy.cut(draft)   # the part of the draft to verify, and why
        ... verify, accept, commit, learn ...
        policy.observe(StepRecord(...))       # what the step verified, accepted and took
    """

    timed: bool = False
    """Whether `observe` reads the step's wall times (the engine then synchronises a GPU per phase)."""

    @abstractmethod
    def plan(self, rows: int) -> int:
        """Candidate nodes per row to propose this step, for `rows` active rows (0: decode plainly)."""

    @abstractmethod
    def cut(self, draft: Draft) -> tuple[Draft, BudgetDecision]:
        """The part of `draft` the target verifies this step."""

    def observe(self, step: StepRecord) -> None:
        """Learn from the step just made."""

    def explain(self) -> str:
        """Why the policy verifies what it verifies (for logs and `proposer_summary`)."""
        return " ".join((type(self).__doc__ or type(self).__name__).split("\n\n")[0].split())


class FixedBudget(BudgetPolicy):
    """Fixed budget: every row verifies its proposer's whole draft (at most `budget` nodes per row
    for a tree, `budget` tokens for a chain)."""

    def __init__(self, budget: int):
        self.budget = budget

    def plan(self, rows: int) -> int:
        return self.budget

    def cut(self, draft):
        return draft, BudgetDecision(1.0)


class ScoreCalibration:
    """Maps a proposer's raw score to the acceptance rate observed for such scores.

    Raw scores are prefix products of confidences; greedy decoding or a drifting policy makes them
    biased. Verified nodes are binned by log-score; each bin's acceptance rate (with a prior that
    pulls an empty bin back to the raw score) is the calibrated estimate. Bins are made
    non-increasing towards lower scores so the calibrated score stays monotone along paths.
    `age` scales the counts (the chain D-cut forgets so, its evidence coming every step; the
    engine's D-cut never forgets).
    """

    def __init__(self, bins: int = 24, floor: float = 1e-6, prior_weight: float = 4.0):
        # host float32 arrays: both D-cuts count and map on the host, the vLLM proposer every step
        # (numpy's per-call cost, not torch's: D-cut's own time is part of a small model's step)
        self.edges = torch.logspace(torch.log10(torch.tensor(floor)).item(), 0.0, bins + 1).numpy()
        self.mid = np.sqrt(self.edges[:-1] * self.edges[1:])
        self.seen = np.zeros(bins, dtype=np.float32)
        self.accepted = np.zeros(bins, dtype=np.float32)
        self.prior_weight = prior_weight

    def _bin(self, score: torch.Tensor) -> torch.Tensor:
        edges = torch.from_numpy(self.edges).to(score.device)
        return (torch.bucketize(score.float().clamp(min=edges[0], max=1.0), edges) - 1).clamp(0, len(self.seen) - 1)

    def observe(self, score: torch.Tensor, verified: torch.Tensor, accepted: torch.Tensor) -> None:
        """score, verified, accepted: [rows, m] (candidate nodes of one step; counted on the host,
        after one transfer)."""
        host = torch.stack([score.float(), verified.float(), accepted.float()]).cpu().numpy()
        self.observe_host(host[0], host[1] > 0, host[2] > 0)

    def __call__(self, score: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self._rates()).to(score.device)[self._bin(score)]

    def rate_of(self, score: np.ndarray) -> np.ndarray:
        """`self(score)` for host numpy scores (the vLLM proposer's)."""
        return self._rates()[self._bin_of(score)]

    def observe_host(self, score: np.ndarray, verified: np.ndarray, accepted: np.ndarray) -> None:
        """`observe` for host numpy arrays (the vLLM proposer's)."""
        b = self._bin_of(score[verified])
        self.seen += np.bincount(b, minlength=len(self.seen)).astype(np.float32)
        self.accepted += np.bincount(b, weights=accepted[verified].astype(np.float64), minlength=len(self.seen)).astype(np.float32)

    def age(self, factor: float) -> None:
        """Scale the counts by `factor` (< 1: older evidence weighs less)."""
        self.seen *= np.float32(factor)
        self.accepted *= np.float32(factor)

    def _rates(self) -> np.ndarray:
        """Each bin's calibrated acceptance rate (float32)."""
        pw = np.float32(self.prior_weight)
        return np.maximum.accumulate((self.accepted + pw * self.mid) / (self.seen + pw))  # monotone in the raw score

    def _bin_of(self, score: np.ndarray) -> np.ndarray:
        """`_bin` in numpy (torch.bucketize's left side is numpy.searchsorted's)."""
        clipped = np.minimum(np.maximum(score.astype(np.float32), self.edges[0]), np.float32(1.0))
        return np.minimum(np.maximum(np.searchsorted(self.edges, clipped, side="left") - 1, 0), len(self.edges) - 2)

    def expected_vs_actual(self) -> tuple[float, float]:
        return float((self.mid * self.seen).sum()), float(self.accepted.sum())


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


class DCut(BudgetPolicy):
    """Chooses the verified width W per step (module docstring). budget: the per-row budget the
    ratios refer to, and the widest proposal.

    The verify forward is a padded [rows, 1 + W] batch: its cost is set by its widest row. A global
    top-K (the D-cut paper's selection, made for token-packed engines such as vLLM: see
    `selection.global_top_k_depths`) would pay for its widest row anyway, and the padding can be
    filled with every row's next-best nodes for free — so keeping the global top-K and filling the
    padding *is* keeping each row's top-W. Which W is worth it is a batch-wide decision."""

    timed = True

    def __init__(self, cost: CostModel, budget: int, config: DCutConfig | None = None):
        self.config = config = config or DCutConfig()
        self.budget = budget
        self.widths = sorted({round(r * budget) for r in set(config.ratios) | {0.0}})
        # one calibration per node source: a drafter's confidence, a target probability stored in the index
        # and a suffix chain's fixed confidence mean different acceptance rates (tree.SOURCES)
        self.calibrations = [ScoreCalibration(prior_weight=config.calibration_prior) for _ in SOURCES]
        self.cost = TreeStepCost(cost)
        self.proposal = next((w for w in self.widths if w > 0), 0)  # nodes per row a speculative step proposes
        self.planned = self.proposal  # what this step's `plan` asked the proposer for
        self.plain = False  # the last decision was plain decoding: the next proposal is a probe
        self.widest = budget  # nodes of the widest row in the last draft (what a probe is expected to verify at most)
        self.probes = ProbeCredit(config.probe_share)
        self.reference_every = round(1.0 / config.probe_share)  # drafting steps between plain reference steps
        self.since_plain = 0  # steps since the last plain forward

    def plan(self, rows: int) -> int:
        """The proposal width (`_next_proposal`), or 0: after a plain decision until a probe at this
        batch size is affordable (as rows finish, a probe gets cheaper: a drained batch's tail probes
        sooner); while drafting, one step in `reference_every` (1 / probe_share), so the plain step
        every decision is weighed against stays measured (at most probe_share of the steps)."""
        if self.plain:
            self.planned = self.proposal if self.probes.affords(self.probe_ms(rows)) else 0
        else:
            self.planned = 0 if self.since_plain >= self.reference_every else self.proposal
        return self.planned

    def probe_ms(self, rows: int) -> float:
        """Predicted cost of a probe at `rows` rows beyond a plain step: its tree and its wider forward."""
        verified = min(self.proposal, self.widest)
        return max(self.cost.step_ms(rows, verified, self.proposal) - self.cost.step_ms(rows, 0, 0), 0.0)

    def cut(self, draft: Draft) -> tuple[Draft, BudgetDecision]:
        rows, m = draft.tokens.shape
        if not self.planned:  # waiting for the probe: a plain step, not a decision
            return draft, BudgetDecision(0.0, 0, 0, float(rows))
        if m == 0:  # proposed, found nothing: a probe that decodes plainly
            self.plain = True
            return draft, BudgetDecision(0.0, 0, 0, float(rows), probe=True)
        width, decision = self._decide(draft)
        self._next_proposal(0 if decision.probe else width, m)
        return (keep_best(draft, width) if decision.kept < decision.candidates else draft), decision

    def _decide(self, draft: Draft) -> tuple[int, BudgetDecision]:
        """The width with the most expected tokens per predicted ms (ties: the narrower). A width W > 0
        is priced as the steady state it leads to: trees proposed at W (`_next_proposal`).

        A draft that was built is never cut to nothing: where plain decoding wins, the step still
        verifies the best width W > 0 (a probe), so the forward at W and the acceptance of such nodes
        are measured — a cost table profiled under load, or a calibration from an earlier epoch, is
        a prior the probes correct, not a verdict that stands for good. The probe credit pays for it."""
        rows, m = draft.tokens.shape
        # each row's calibrated scores, best first: expected accepted tokens of its top W = prefix sum
        score = self.calibrated(draft).masked_fill(~draft.valid, 0.0)
        cum = torch.sort(score, dim=1, descending=True).values.cumsum(1)  # [rows, m]
        counts = draft.valid.sum(1)
        widths = sorted({min(m, w) for w in self.widths})
        cols = torch.tensor([max(w - 1, 0) for w in widths], device=cum.device)
        gains = cum[:, cols].sum(0)  # [len(widths)] Σ_rows expected accepted candidates
        kept = torch.minimum(counts.view(-1, 1), torch.tensor(widths, device=counts.device).view(1, -1)).sum(0)
        host = torch.cat([gains.float(), kept.float(), counts.max().view(1).float()]).tolist()  # one host transfer
        n = len(widths)
        gains, kept, widest = host[:n], [int(k) for k in host[n : 2 * n]], int(host[-1])
        expected = [rows + (gains[i] if w else 0.0) for i, w in enumerate(widths)]
        step_ms = [self.cost.step_ms(rows, min(w, widest), w) for w in widths]
        rates = [e / t for e, t in zip(expected, step_ms)]
        best = max(range(n), key=lambda j: (rates[j], -j))
        drafting = max((j for j in range(n) if widths[j]), key=lambda j: (rates[j], -j))  # the best W > 0
        self.plain = widths[best] == 0
        self.widest = widest
        i = drafting if self.plain else best
        decision = BudgetDecision(widths[i] / self.budget, kept[i], kept[-1], expected[i], probe=self.plain,
                                  break_even_mat=step_ms[drafting] / step_ms[0], expected_mat=expected[drafting] / rows)
        return widths[i], decision

    def calibrated(self, draft: Draft) -> torch.Tensor:
        """[rows, m] each node's score mapped to the acceptance observed for such scores of its source:
        one gather from the sources' rate tables (they share their bins), no host round trip."""
        rates = torch.from_numpy(np.stack([c._rates() for c in self.calibrations])).to(draft.score.device)
        return rates[draft.source.long(), self.calibrations[0]._bin(draft.score)]

    def _next_proposal(self, width: int, m: int) -> None:
        """How wide the next proposal is, after this step chose `width` from a draft of width m: the
        width chosen, or twice the proposal when the choice took all of it (the decision may want
        more: a slow start from the smallest width); unchanged after a plain decision (the probe
        proposes what was chosen last) or when the proposer found fewer nodes than it was asked for
        and all were chosen. A wider tree costs more to build, cut and learn from (a drafter expands
        a level per node, up to its depth), so a proposal as wide as the budget where a narrow width
        is chosen would cost speculation its gain (measured in a D-cut ablation; see git history)."""
        if width >= self.planned:
            self.proposal = min(self.budget, 2 * self.planned)
        elif 0 < width < m:
            self.proposal = max(width, self.widths[1])

    def observe(self, step: StepRecord) -> None:
        """Calibrate the scores on what was verified, time the step, and keep the probe credit
        (`ProbeCredit`: a probe spends what it cost beyond a plain step)."""
        if step.draft.tokens.shape[1]:  # one host transfer, then each source's nodes counted on the host
            d = step.draft
            score, valid, accepted, source = torch.stack([d.score.float(), d.valid.float(), step.accepted.float(),
                                                          d.source.float()]).cpu().numpy()
            for s, calibration in enumerate(self.calibrations):
                calibration.observe_host(score, (valid > 0) & (source == s), accepted > 0)
        self.cost.observe(step.rows, step.forward_tokens, step.planned, step.timing)
        self.since_plain = 0 if step.forward_tokens == 1 else self.since_plain + 1
        ms, plain = step.timing.total_ms, self.cost.step_ms(step.rows, 0, 0)
        self.probes.settle(ms, plain, step.rows, step.emitted, step.decision.probe)
        self.probes.bank_at_most(2.0 * self.probe_ms(step.rows))
