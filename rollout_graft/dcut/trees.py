"""The engine's budget policies: how much of each step's draft tree the target verifies (DESIGN.md
§2 step 4, "Budget policies").

`FixedBudget` verifies every row's whole draft. `DCut` chooses, each step, one verified width W
for the batch — every row verifies its W best nodes by calibrated score (`selection.keep_best`) —
maximising

    E[emitted | W] = Σ_rows (1 + Σ_{row's top-W nodes} score)       (bonus/recovered token + accepted)
    time(W)        = forward(rows, 1 + W) + outside(rows, P(W))      (profiled table + measured rest)

over W ∈ ratios · budget, W = 0 (plain decoding) included, so a step is never predicted slower than
"ar"; P(W) = `DCut.proposal_after(W)`, the proposal that choosing W leads to. A node's score is the
estimated probability that verification reaches and accepts it: the prefix product of its path's
confidences, calibrated online against observed acceptance.

Four rules around the choice, each measured to matter (a D-cut ablation, see git history; the last:
docs/DESIGN.md):
- the proposal follows the choice: the next step proposes twice the width chosen (from the smallest
  width up), so a cut chooses from twice the nodes it keeps: a wider tree costs more to build and
  learn from;
- after a plain decision nothing is proposed until the next proposal (a probe: the tree is built, and
  may again be cut to W = 0) is affordable: probes may cost `DCutConfig.probe_share` of the
  decoding time, plus what speculation saved;
- the profiled forward table is corrected by what the rollout's forwards measure (`TreeStepCost`);
- the cut keeps the nodes the choice's estimate counts: each row's best by calibrated acceptance.
The other controllers an earlier D-cut had (switch margin, back-off, advantage average,
exploration, per-batch-size state) were removed after the same comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np
import torch

from ..config import DCutConfig
from ..cost import CostModel, neighbours
from ..selection import keep_best
from ..stats import StepTiming
from ..tree import SOURCES, Draft
from .core import BudgetDecision, ProbeCredit, RowCost, ScoreCalibration


@dataclass(slots=True)
class StepRecord:
    """What a tree policy learns from after a step."""

    rows: int
    planned: int  # nodes per row the proposer was asked for (`plan`; 0: nothing proposed)
    draft: Draft  # the verified (cut) draft
    accepted: torch.Tensor  # [rows, m] bool: which of its nodes were accepted
    forward_tokens: int  # tokens per row of the verify forward (1 + the widest row's nodes)
    emitted: int  # tokens the step emitted (all rows)
    decision: BudgetDecision
    timing: StepTiming


class TreePolicy(Protocol):
    """How much of each step's draft tree the target verifies. The engine calls, every step:

        nodes = policy.plan(rows)             # how many candidate nodes per row to propose (0: none)
        draft, decision = policy.cut(draft)   # the part of the draft to verify, and why
        ... verify, accept, commit, learn ...
        policy.observe(StepRecord(...))       # what the step verified, accepted and took

    An implementation may subclass it for the defaults of `timed` and `observe`."""

    timed: bool = False
    """Whether `observe` reads the step's wall times (the engine then synchronises a GPU per phase)."""

    def plan(self, rows: int) -> int:
        """Candidate nodes per row to propose this step, for `rows` active rows (0: decode plainly)."""
        ...

    def cut(self, draft: Draft) -> tuple[Draft, BudgetDecision]:
        """The part of `draft` the target verifies this step."""
        ...

    def observe(self, step: StepRecord) -> None:
        """Learn from the step just made (by default: nothing)."""


class FixedBudget(TreePolicy):
    """Fixed budget: every row verifies its proposer's whole draft (at most `budget` nodes)."""

    def __init__(self, budget: int):
        self.budget = budget

    def plan(self, rows: int) -> int:
        return self.budget

    def cut(self, draft: Draft) -> tuple[Draft, BudgetDecision]:
        return draft, BudgetDecision(1.0)


@dataclass
class TreeStepCost:
    """Predicted milliseconds of one engine step of `rows` rows that proposed trees of P nodes per
    row and verifies W of them: the verify forward of 1 + W tokens per row, plus the time outside it.

    Forward: the profiled table is a prior that the rollout's own forwards replace. The table is a
    best-of, profiled once and cached, possibly on a busier or idler machine than now; a rollout's
    forwards run in its caches, allocator and neighbours. For each of the table's token counts q
    (1: a plain step), `scale(q)` is the mean of measured / profiled over the forwards of about q
    tokens per row, with a prior of `PRIOR_FORWARDS` such forwards at the common scale: measured /
    profiled over every forward the rollout measured, whatever its width (the table itself
    counting as `PRIOR_FORWARDS` forwards at 1.0). Every weight ages by `AGE` per step: evidence
    ages with the steps that pass, not with its own count, so a width measured rarely (D-cut's
    probes while it decodes plainly, its reference steps while it drafts) is priced by its latest
    measurement, and no stale figure — the table's included — stands for good. The common scale is
    there for a table profiled while the machine was busier (or idler) than now: its figures are off
    by about one factor (`cost.CostModel.profile` keeps its shape), and a width the rollout has not
    measured — the plain forward, while D-cut drafts — is priced by the table's shape at the speed
    the rollout measures, not at the table's (docs/RESULTS.md, "Engine, tiny target: D-cut from a
    cost table profiled under load").
    Outside the forward: for steps that proposed, a `RowCost` per proposal width (nodes per row the
    proposer was asked for: building, cutting, walking and learning from the tree; a step that
    proposed pays for its tree also when D-cut then verified none of it; `outside_ms` prices a width
    not measured yet); for plain steps (one draw per row) a `RowCost` of their own."""

    PRIOR_FORWARDS: ClassVar[float] = 1.0  # the table's weight, in measured forwards, before it ages
    AGE: ClassVar[float] = 0.95  # per step: a forward measured 20 steps ago weighs e⁻¹ of one measured now

    table: CostModel
    forget: float = 0.9  # the outside fits' `CostFit.forget`
    trees: dict[int, RowCost] = field(default_factory=dict, init=False)  # proposal width → ms outside the forward
    plain: RowCost = field(init=False)  # ms outside the forward of plain steps
    # per profiled token count q: the measured forwards' Σ aged weight and Σ aged weight · measured / profiled;
    # the prior's aged weight (every q's alike); over every forward (the common scale), the table's counting as
    # PRIOR_FORWARDS at 1.0
    _prior: float = field(init=False, repr=False)
    _weight: list[float] = field(init=False, repr=False)
    _sum: list[float] = field(init=False, repr=False)
    _common: list[float] = field(init=False, repr=False)  # [Σ aged weight, Σ aged weight · ratio]
    _near: dict[float, list[tuple[int, float]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.plain = RowCost(self.forget)
        self._prior = self.PRIOR_FORWARDS
        self._weight = [0.0] * len(self.table.tokens)
        self._sum = [0.0] * len(self.table.tokens)
        self._common = [self.PRIOR_FORWARDS, self.PRIOR_FORWARDS]
        self._near = {}  # `_neighbours` of each width priced

    def observe(self, rows: int, forward_tokens: int, proposed: int, timing: StepTiming) -> None:
        """A step measured by the engine: `proposed` nodes per row asked of the proposer (0: none)."""
        self._observe_forward(rows, forward_tokens, timing.forward_ms)
        if proposed:
            self.trees.setdefault(proposed, RowCost(self.forget)).observe(rows, timing.propose_ms + timing.rest_ms)
        else:
            self.plain.observe(rows, timing.rest_ms)

    def _observe_forward(self, rows: int, tokens_per_row: int, ms: float) -> None:
        # measured evidence aged and floored (a scale keeps its mean however long ago it was measured); the
        # prior aged to nothing, so a width measured once outweighs it for good
        self._prior *= self.AGE
        for k, (weight, total) in enumerate(zip(self._weight, self._sum)):
            if weight > 0:
                self._weight[k] = max(weight * self.AGE, 1e-9)
                self._sum[k] = total / weight * self._weight[k]
        weight, total = self._common
        aged = max(weight * self.AGE, 1e-9)
        self._common = [aged, total / weight * aged]
        if ms <= 0:
            return
        ratio = ms / self.table.predict(rows, tokens_per_row)
        for k, share in self._neighbours(tokens_per_row):  # the profiled token counts around it, by nearness
            self._weight[k] += share
            self._sum[k] += share * ratio
        self._common[0] += 1.0
        self._common[1] += ratio

    def _neighbours(self, tokens_per_row: float) -> list[tuple[int, float]]:
        near = self._near.get(tokens_per_row)
        if near is None:  # a few widths, priced several times a step
            i, j, w = neighbours(self.table.tokens, tokens_per_row)
            w = min(max(w, 0.0), 1.0)  # past the grid's ends: the end's own scale
            near = self._near[tokens_per_row] = [(k, share) for k, share in ((i, 1.0 - w), (j, w)) if share > 0]
        return near

    def scale(self, tokens_per_row: float) -> float:
        """Measured / profiled for forwards of `tokens_per_row` tokens per row (1.0: as profiled)."""
        common = self._common[1] / self._common[0]
        return sum(share * ((self._sum[k] + self._prior * common) / (self._weight[k] + self._prior)
                            if self._weight[k] + self._prior > 0 else common)
                   for k, share in self._neighbours(tokens_per_row))

    def forward_ms(self, rows: int, tokens_per_row: int) -> float:
        """Predicted verify forward: the table × the measured scale of such forwards."""
        return self.table.predict(rows, tokens_per_row) * self.scale(tokens_per_row)

    def outside_ms(self, rows: int, width: int) -> float:
        """Predicted ms outside the forward of a step that proposed `width` nodes per row: a width not
        measured yet is interpolated between the nearest measured ones; above the widest it follows
        the slope of the two widest (proportionally when one was measured: never an under-estimate of
        a drafter's extra levels); below the narrowest it is the narrowest's (0: nothing measured)."""
        if width in self.trees:
            return self.trees[width].predict(rows)
        below = sorted(w for w in self.trees if w < width)
        above = sorted(w for w in self.trees if w > width)
        if not below:
            return self.trees[above[0]].predict(rows) if above else 0.0
        w1, y1 = below[-1], self.trees[below[-1]].predict(rows)
        if above:
            w2, y2 = above[0], self.trees[above[0]].predict(rows)
            return y1 + (y2 - y1) * (width - w1) / (w2 - w1)
        if len(below) == 1:
            return y1 * width / w1
        w0, y0 = below[-2], self.trees[below[-2]].predict(rows)
        return y1 + max((y1 - y0) / (w1 - w0), 0.0) * (width - w1)

    def step_ms(self, rows: int, verified: int, proposed: int) -> float:
        """A step of `rows` rows that proposed `proposed` nodes per row (0: a plain step, no tree)
        and verifies `verified` of them."""
        outside = self.outside_ms(rows, proposed) if proposed else self.plain.predict(rows)
        return self.forward_ms(rows, 1 + verified) + outside


def device_bins(calibration: ScoreCalibration, score: torch.Tensor) -> torch.Tensor:
    """`calibration.bin_of` on `score`'s device (torch.bucketize's default side is numpy.searchsorted's
    left side): the engine maps its scores where they are."""
    edges = torch.from_numpy(calibration.edges).to(score.device)
    return (torch.bucketize(score.float().clamp(min=edges[0], max=1.0), edges) - 1).clamp(0, calibration.bins - 1)


class DCut(TreePolicy):
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
            self.widest = 0  # the next probe is priced by its tree alone (`probe_ms`): this one verified nothing
            return draft, BudgetDecision(0.0, 0, 0, float(rows), probe=True)
        width, decision, score = self._decide(draft)
        self._next_proposal(0 if decision.probe else width, m)
        return (keep_best(draft, width, score) if decision.kept < decision.candidates else draft), decision

    def _decide(self, draft: Draft) -> tuple[int, BudgetDecision, torch.Tensor]:
        """The width with the most expected tokens per predicted ms (ties: the narrower). A width W > 0
        is priced as the steady state it leads to: trees proposed at `proposal_after(W)`.

        A draft that was built is never cut to nothing: where plain decoding wins, the step still
        verifies the best width W > 0 (a probe), so the forward at W and the acceptance of such nodes
        are measured — a cost table profiled under load, or a calibration from an earlier epoch, is
        a prior the probes correct, not a verdict that stands for good. The probe credit pays for it."""
        rows, m = draft.tokens.shape
        # each node's calibrated acceptance capped by its ancestors' (a child is accepted only with its
        # parent), best first: a row's top W are what the cut keeps (ancestor-closed; not its raw best, whose
        # sources' scores do not compare), their prefix sum the accepted tokens expected of them
        score = draft.path_min(self.calibrated(draft).masked_fill(~draft.valid, 0.0))
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
        step_ms = [self.cost.step_ms(rows, min(w, widest), self.proposal_after(w) if w else 0) for w in widths]
        rates = [e / t for e, t in zip(expected, step_ms)]
        best = max(range(n), key=lambda j: (rates[j], -j))
        drafting = max((j for j in range(n) if widths[j]), key=lambda j: (rates[j], -j))  # the best W > 0
        self.plain = widths[best] == 0
        self.widest = widest
        i = drafting if self.plain else best
        decision = BudgetDecision(widths[i] / self.budget, kept[i], kept[-1], expected[i], probe=self.plain,
                                  break_even_mat=step_ms[drafting] / step_ms[0], expected_mat=expected[drafting] / rows)
        return widths[i], decision, score

    def calibrated(self, draft: Draft) -> torch.Tensor:
        """[rows, m] each node's score mapped to the acceptance observed for such scores of its source:
        one gather on the draft's device from the sources' rate tables (they share their bins), no
        host round trip."""
        rates = torch.from_numpy(np.stack([c.rates() for c in self.calibrations])).to(draft.score.device)
        return rates[draft.source.long(), device_bins(self.calibrations[0], draft.score)]

    def _next_proposal(self, width: int, m: int) -> None:
        """How wide the next proposal is, after this step chose `width` from a draft of width m:
        `proposal_after(width)`; unchanged after a plain decision (the probe proposes what was chosen
        last) or when the proposer found fewer nodes than it was asked for and all were chosen."""
        if width and (width < m or m >= self.planned):
            self.proposal = self.proposal_after(width)

    def proposal_after(self, width: int) -> int:
        """The proposal that choosing `width` leads to: twice the width (at most the budget). Choosing
        all of a proposal doubles the next (the decision may want more: a slow start from the
        smallest width); a width chosen below the proposal is cut next time from twice as many nodes
        (the calibrated best W of 2W mostly accept more than the proposer's own W, of 4W as often
        less: docs/RESULTS.md, "Engine, tiny target: which nodes a cut keeps"). A wider tree costs
        more to build, cut and learn from (a drafter expands a level per node, up to its depth):
        `_decide` prices each width with the proposal it leads to."""
        return min(self.budget, max(2 * width, self.widths[1]))

    def observe(self, step: StepRecord) -> None:
        """Calibrate the scores on what was verified, time the step, and keep the probe credit
        (`ProbeCredit`: a probe spends what it cost beyond a plain step)."""
        if step.draft.tokens.shape[1]:  # one host transfer, then each source's nodes counted on the host
            d = step.draft
            score, valid, accepted, source = torch.stack([d.score.float(), d.valid.float(), step.accepted.float(),
                                                          d.source.float()]).cpu().numpy()
            for s, calibration in enumerate(self.calibrations):
                calibration.observe(score, (valid > 0) & (source == s), accepted > 0)
        self.cost.observe(step.rows, step.forward_tokens, step.planned, step.timing)
        self.since_plain = 0 if step.forward_tokens == 1 else self.since_plain + 1
        ms, plain = step.timing.total_ms, self.cost.step_ms(step.rows, 0, 0)
        self.probes.settle(ms, plain, step.rows, step.emitted, step.decision.probe)
        self.probes.bank_at_most(2.0 * self.probe_ms(step.rows))
