"""D-cut: a batch-wide verification budget chosen by a cost model (DESIGN.md §2 step 4).

Every candidate node carries a score: the estimated probability that verification reaches and
accepts it (prefix product of confidences, calibrated online against observed acceptance).
Scores never increase along a path, so keeping a row's highest-scoring nodes keeps its tree
ancestor-closed. Each step D-cut picks the verified width W = ρ·m (m: the draft's width) that
maximises expected emitted tokens / predicted step time over the whole batch (m: the per-row
budget; a draft narrower than m caps W at its width):

    E[emitted | W] = Σ_rows (1 + Σ_{row's top-W nodes} score)      (bonus/recovered token + accepted)
    time(W)        = cost(rows, 1 + W) · s + overhead(rows, W)      (profiled forward + measured rest)

(s: measured/profiled ratio of the rollout's own forwards — the machine's load, × a tree factor for
W > 0; overhead: measured per proposal width, W = 0 has its own. The proposal width, the slow
start and the back-off are kept per batch-size class, `RowsClass`.)

W = 0 (plain decoding: no tree, one draw per row) is always a candidate, so a step is never predicted slower
than "ar". Why a per-row width rather than the paper's global top-K: see `DCut`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from .config import DCutConfig
from .cost import CostModel
from .stats import StepTiming
from .selection import keep_best
from .tree import Draft


@dataclass(slots=True)
class BudgetDecision:
    ratio: float  # verified width / budget (a fixed budget verifies its whole draft: 1.0)
    kept: int | None = None  # candidate nodes kept (whole batch; None: not counted)
    candidates: int | None = None  # candidate nodes proposed (whole batch; None: not counted)
    expected_emitted: float | None = None  # predicted Σ emitted tokens of this step (None: no prediction)
    probe: bool = False  # a draft was proposed and D-cut chose ρ = 0 (the proposal only probed)


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


class FixedBudget(BudgetPolicy):
    """Every row verifies its proposer's whole draft of at most `budget` nodes."""

    def __init__(self, budget: int):
        self.budget = budget

    def plan(self, rows: int) -> int:
        return self.budget

    def cut(self, draft: Draft) -> tuple[Draft, BudgetDecision]:
        return draft, BudgetDecision(1.0)


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


class _RowFit:
    """y = a + b·rows, fitted by exponentially weighted least squares. Past the most rows measured
    it predicts no less than proportionally to the rows: a fit made on a drained batch's tail (a
    few rows, noisy) must not price a full batch's tree as cheap."""

    def __init__(self, forget: float):
        self.forget = forget
        self.sums = [0.0] * 5  # Σw, Σw·x, Σw·y, Σw·x², Σw·x·y
        self.most_rows = 0

    def observe(self, rows: int, ms: float) -> None:
        f = self.forget
        w, sx, sy, sxx, sxy = (v * f for v in self.sums)
        self.sums = [w + 1, sx + rows, sy + ms, sxx + rows * rows, sxy + rows * ms]
        self.most_rows = max(self.most_rows, rows)

    def predict(self, rows: int) -> float:
        if rows > self.most_rows > 0:
            return max(self._fit(rows), self._fit(self.most_rows) * rows / self.most_rows)
        return self._fit(rows)

    def _fit(self, rows: int) -> float:
        w, sx, sy, sxx, sxy = self.sums
        var = sxx / w - (sx / w) ** 2
        if var < 1e-6 * max(1.0, (sx / w) ** 2):  # one batch size seen so far: scale with the rows
            return sy / max(sx, 1e-9) * rows
        b = (sxy / w - sx * sy / w**2) / var
        a = sy / w - b * sx / w
        return max(a + b * rows, 0.0)


class OverheadModel:
    """Milliseconds a speculative step spends outside the target forward (building the tree,
    learning from the logits, D-cut itself), per proposal width (the nodes per row the proposer
    was asked for: a drafter expands that many levels at most) as a + b·rows, fitted online by
    exponentially weighted least squares. The profiled cost table only times forwards; on a small
    model or a large batch this overhead decides whether speculation pays.

    A width not seen yet is interpolated between the nearest seen widths; above the widest seen it
    is extrapolated along the slope of the two widest (proportionally when only one was seen) —
    an over-estimate where the cost saturates (a drafter's depth), never an under-estimate of a
    drafter's extra levels; below the narrowest it is taken as the narrowest's."""

    def __init__(self, forget: float = 0.9):
        self.forget = forget
        self.fits: dict[int, _RowFit] = {}

    def observe(self, rows: int, ms: float, width: int = 0) -> None:
        self.fits.setdefault(width, _RowFit(self.forget)).observe(rows, ms)

    def predict(self, rows: int, width: int = 0) -> float:
        if not self.fits:
            return 0.0
        if width in self.fits:
            return self.fits[width].predict(rows)
        below = sorted(w for w in self.fits if w < width)
        above = sorted(w for w in self.fits if w > width)
        if not below:
            return self.fits[above[0]].predict(rows)
        w1, y1 = below[-1], self.fits[below[-1]].predict(rows)
        if above:
            w2, y2 = above[0], self.fits[above[0]].predict(rows)
            return y1 + (y2 - y1) * (width - w1) / (w2 - w1)
        if len(below) == 1:
            return y1 * width / w1 if w1 > 0 else y1  # width 0: measured without a width
        w0, y0 = below[-2], self.fits[below[-2]].predict(rows)
        return y1 + max((y1 - y0) / (w1 - w0), 0.0) * (width - w1)


PROBE_SHARE = 0.01
"""Probes that find speculation does not pay may cost at most this share of the decoding time
(`DCut.probe_credit`)."""


LONGEST_BACKOFF = 64
"""Steps between probes at most, while probes are affordable (`DCut.skip_proposal`)."""


CHEAP_TREE = 1.25
"""A tree predicted to cost at most this × the smallest width's counts as cheap (`DCut._cheap_width`)."""


SWITCH_MARGIN = 1.1
"""After a plain step, D-cut returns to speculation only when it predicts ≥ 10 % more tokens per
second: near break-even, flip-flopping pays the switch (a drafter's catch-up, a probe's tree) for
nothing."""


@dataclass(slots=True)
class RowsClass:
    """What D-cut learned about one batch-size class (rows rounded down to a power of two): how
    wide to propose (`DCut._move_cap`) and how long to back off (`DCut.skip_proposal`). A rollout's
    batch drains through the classes as rows finish; the next rollout starts in the full batch's
    class again and finds this state there."""

    cap: int | None = None  # the widest W the next step may propose (None: the smallest)
    last_width: int = 0  # the last W > 0 chosen (what a probe after a back-off proposes)
    grown_from: int | None = None  # the proposal width the last decision grew the cap from
    growth_fails: dict[int, int] = field(default_factory=dict)  # proposal width → growths from it in a row that fell back
    growth_wait: dict[int, int] = field(default_factory=dict)  # proposal width → binding decisions to wait before growing again
    plain: int = 0  # consecutive ρ = 0 decisions
    wait: int = 0  # steps left to decode plainly without proposing
    probe_ms: float = 0.0  # what the next probe is predicted to cost more than a plain step
    advantage: float | None = None  # moving average of the best W > 0's predicted speed over plain's (`DCut._track`)


class DCut(BudgetPolicy):
    """Chooses the verified width W = ρ·m per step (m: the per-sequence budget, W capped at the
    draft's width) from `ratios`, with a `CostModel` for the forward and an `OverheadModel` for the rest.

    The verify forward is a padded [rows, 1 + W] batch: its cost is set by its widest row. A global
    top-K (the D-cut paper's selection, made for token-packed engines) would pay for its widest row
    anyway, and the padding can be filled with every row's next-best nodes for free — so keeping
    the global top-K and filling the padding *is* keeping each row's top-W (`selection.keep_best`).
    Which W is worth it is still a batch-wide decision: Σ over all rows of the expected accepted
    tokens against the predicted step time.
    """

    timed = True

    def __init__(self, cost: CostModel, budget: int, config: DCutConfig | None = None,
                 overhead: OverheadModel | None = None):
        self.config = config = config or DCutConfig()
        self.cost = cost
        self.budget = budget  # the per-row budget the ratios refer to
        self.planned = budget  # what the current step's `plan` asked the proposer for
        self.ratios = tuple(sorted(set(config.ratios) | {0.0}))
        self._width_lists: dict[int, list[int]] = {}  # budget → its widths W = ρ·budget
        self.calibration = ScoreCalibration(prior_weight=config.calibration_prior)
        self.overhead = overhead or OverheadModel()  # speculative steps: tree + walk + learning
        self.plain_overhead = OverheadModel()  # plain steps: one draw per row
        self.explore_every = config.explore_every  # every n-th decision for ρ = 0 verifies the smallest W > 0 (calibration)
        self.plain_decisions = 0  # ρ = 0 decisions so far (every explore_every-th explores)
        self.idle = 0  # consecutive decisions for ρ = 0 (any batch size): the switch margin applies
        self.classes: dict[int, RowsClass] = {}  # batch-size class → its proposal width and back-off
        self.load_scale = 1.0  # measured / profiled verify forward, every forward (`observe_forward`)
        self.tree_scale = 1.0  # how much more than that a wider forward takes
        self.probe_credit = 0.0  # ms the probes may still cost (`observe_step`)

    def plan(self, rows: int) -> int:
        """0 while backing off (`skip_proposal`), else the widest width this step may choose."""
        self.planned = 0 if self.skip_proposal(rows) else self.proposal_budget(self.budget, rows)
        return self.planned

    def cut(self, draft: Draft) -> tuple[Draft, BudgetDecision]:
        if not self.planned:  # backing off: a plain step, not a decision
            return draft, BudgetDecision(0.0, 0, 0, float(draft.tokens.shape[0]))
        return self.decide(draft, self.budget)

    def observe(self, step: StepRecord) -> None:
        """Calibrate the scores on what was verified; price the forward, the rest of the step (a step
        that proposed pays for its tree, also when D-cut then verified none of it), and the probes."""
        if step.draft.tokens.shape[1]:
            self.calibration.observe(step.draft.score, step.draft.valid, step.accepted)
        t = step.timing
        self.observe_forward(step.rows, float(step.forward_tokens), t.forward_ms)
        if step.planned:
            self.observe_overhead(step.rows, t.propose_ms + t.rest_ms, speculative=True, width=step.planned)
        else:
            self.observe_overhead(step.rows, t.rest_ms, speculative=False)
        self.observe_step(step.rows, t.total_ms, step.decision.probe, step.emitted)

    def rows_class(self, rows: int) -> RowsClass:
        """The state of this batch size's class (rows rounded down to a power of two)."""
        key = max(rows, 1).bit_length() if self.config.per_class else 0
        if key not in self.classes:
            self.classes[key] = RowsClass()
        return self.classes[key]

    def skip_proposal(self, rows: int) -> bool:
        """Back off while speculation does not pay: after n consecutive ρ = 0 decisions, the next
        min(2^n, LONGEST_BACKOFF) − 1 steps decode plainly without building a tree at all; then
        the class probes again once the probe is affordable: `probe_credit` ≥ its predicted extra
        cost (`RowsClass.probe_ms`). Kept per batch-size class (`RowsClass`): a rollout's batch
        drains through the classes as rows finish (a class entered for the first time probes at
        once: fewer rows may make speculation pay), and the next rollout starts in the full batch's
        class again, with what D-cut learned there — a tail that speculates does not restart the
        full batch's back-off."""
        state = self.rows_class(rows)
        if state.wait > 0:
            state.wait -= 1
            return True
        return state.plain > 0 and self.config.probe_share is not None and state.probe_ms > self.probe_credit

    def observe_step(self, rows: int, ms: float, probe: bool, emitted: int | None = None) -> None:
        """A whole step (propose + forward + walk + learning) of `rows` rows took `ms` and emitted
        `emitted` tokens (default: one per row); probe: it built a tree and then decoded plainly (ρ = 0
        chosen, or an exploration step).

        The probe credit: every step adds PROBE_SHARE of its time, a speculative step also what it
        saved against plain steps for the same tokens; a probe takes what it cost beyond a plain
        step (a drafter's prompt prefill and catch-up included). So probes that find nothing cost
        at most PROBE_SHARE of the decoding time plus what speculation saved — across batch-size
        classes and rollouts, however dear a probe is next to a plain step — and where speculation
        pays (a small batch), probing is not held back."""
        if self.config.probe_share is None:
            return
        plain = self.step_ms(rows, 0)
        self.probe_credit += self.config.probe_share * ms
        if probe:
            self.probe_credit -= max(ms - plain, 0.0)
        elif emitted is not None and emitted > rows:
            self.probe_credit += max(plain * emitted / rows - ms, 0.0)
        # a long spell of paying speculation banks at most two of the dearest probes
        dearest = max((c.probe_ms for c in self.classes.values()), default=0.0)
        self.probe_credit = min(self.probe_credit, 2.0 * dearest)

    def _track(self, ratio: float, rows: int, advantage: float) -> None:
        """Count a decision for the back-off. advantage: the best W > 0's predicted tokens per second
        over plain decoding's this step; its moving average over the class's decisions says whether
        speculation pays here. A step whose draft was poor decodes plainly, but starts a back-off
        only where speculation does not pay on average: at a small batch one row's weak draft
        decides the step, not whether the next steps propose."""
        state = self.rows_class(rows)
        w = self.config.advantage_weight
        state.advantage = advantage if state.advantage is None else (1 - w) * state.advantage + w * advantage
        if ratio > 0 or state.advantage > 1.0:
            self.idle = state.plain = state.wait = 0
            return
        self.idle += 1
        state.plain += 1
        state.wait = min(2**state.plain, self.config.longest_backoff) - 1 if self.config.longest_backoff else 0

    def observe_forward(self, rows: int, tokens_per_row: float, ms: float) -> None:
        """A verify forward measured by the engine: the profiled table is the best of a few timings
        on an idle device, a rollout's forwards run in its caches, allocator and neighbours. Two
        moving averages scale the table's predictions: `load_scale` (measured/profiled, from every
        forward: the machine's load now) and `tree_scale` (how much slower than that a wider
        forward is, from the wider ones). Wider forwards can be rare (D-cut's probes): kept as one
        ratio of their own, a slow spell during a probe would price speculation until the next."""
        predicted = self.cost.predict(rows, tokens_per_row)
        if predicted <= 0 or ms <= 0 or not self.config.scale_forwards:
            return
        ratio = ms / predicted
        if tokens_per_row > 1:
            self.load_scale = 0.9 * self.load_scale + 0.1 * ratio / self.tree_scale
            self.tree_scale = 0.95 * self.tree_scale + 0.05 * ratio / self.load_scale
        else:
            self.load_scale = 0.9 * self.load_scale + 0.1 * ratio

    @property
    def forward_scale(self) -> list[float]:
        """Measured/profiled scale of [plain, wider] verify forwards."""
        return [self.load_scale, self.load_scale * self.tree_scale]

    def forward_ms(self, rows: int, tokens_per_row: float) -> float:
        """Predicted verify forward: the profiled table × the measured/profiled ratio of such forwards."""
        return self.cost.predict(rows, tokens_per_row) * self.forward_scale[int(tokens_per_row > 1)]

    def observe_overhead(self, rows: int, ms: float, speculative: bool = True, width: int = 0) -> None:
        """Time a step spent outside the verify forward (measured by the engine); width: the
        proposal width of a speculative step (what `proposal_budget` asked the proposer for).

        Kept in units of the machine's current speed (÷ `load_scale`, × it when predicted): a slow
        spell slows the host work as much as the forwards, and when it passes, the forwards —
        measured every step — tell at once; an overhead measured in the spell and kept as is would
        price speculation out until the next probes re-measured it."""
        if speculative:
            self.overhead.observe(rows, ms / self.load_scale, width)
        else:
            self.plain_overhead.observe(rows, ms / self.load_scale)

    def step_ms(self, rows: int, width: int, widest: int | None = None) -> float:
        """Predicted step time at width W (0: a plain step): the verify forward of 1 + W nodes per
        row (no more than the draft's widest row) and the overhead outside it."""
        nodes = width if widest is None else min(width, widest)
        return self.forward_ms(rows, 1.0 + nodes) + self.overhead_ms(rows, width)

    def overhead_ms(self, rows: int, width: int) -> float:
        """Predicted time of a step outside the verify forward: a tree of `width` nodes per row
        proposed, cut and learnt from, or (width 0) a plain step's draw."""
        model = self.overhead if width > 0 else self.plain_overhead
        return model.predict(rows, width) * self.load_scale

    def _widths(self, budget: int) -> list[int]:
        if budget not in self._width_lists:  # asked twice a step
            self._width_lists[budget] = sorted({round(r * budget) for r in self.ratios})
        return self._width_lists[budget]

    def _cap(self, widths: list[int], rows: int) -> int:
        smallest = next((w for w in widths if w > 0), 0)
        if not self.config.slow_start:
            return widths[-1]
        return max(self.rows_class(rows).cap or smallest, smallest)

    def proposal_budget(self, budget: int, rows: int) -> int:
        """Nodes per row worth proposing this step (`rows` in the batch): no width above the cap
        can be chosen, so a step after narrow choices builds a narrow tree (see `_move_cap`)."""
        widths = self._widths(budget)
        cap = self._cap(widths, rows)
        return min(budget, max((w for w in widths if w <= cap), default=0))

    def _cheap_width(self, rows: int, widths: list[int]) -> int:
        """The widest width whose tree is predicted to cost at most CHEAP_TREE × the smallest's
        (retrieval's trees cost about the same at any width, a drafter's grow with it); the
        smallest width until two widths were measured."""
        sizes = [w for w in widths if w > 0]
        if not sizes or len(self.overhead.fits) < 2:
            return sizes[0] if sizes else 0
        limit = CHEAP_TREE * self.overhead_ms(rows, sizes[0])
        return max(w for w in sizes if w == sizes[0] or self.overhead_ms(rows, w) <= limit)

    def _move_cap(self, state: RowsClass, width: int, top: int, m: int, best_spec: int, cheap: int = 0) -> None:
        """The next proposal width of this batch-size class, after this step chose `width` from a
        draft of width m proposed at `top` (the widest width the cap allowed); best_spec: the width
        W > 0 that came closest to paying:

        - ρ = 0: the last W > 0 chosen in this class, else best_spec (the probe after the back-off
          proposes what paid last), but no narrower than `cheap` (`_cheap_width`): where a wider
          tree costs no more to build, the probe proposing it lets its decision see whether a wider
          W pays — a class whose probes proposed only the smallest width would never learn that;
        - below what was proposed: the chosen width (a wider tree costs more to build — a drafter
          expands one level per node of width, up to its depth — and a wider draft costs more to
          score and cut, whatever the proposer);
        - the whole proposal: double (slow start: an uncalibrated guess is costly at a large
          batch, so the cap grows from the smallest width). A growth whose first decision falls
          back waits 2, 4, … 64 binding decisions before it is tried again from that width (its
          cost is known by then: the wider tree was built and measured)."""
        grown_from, state.grown_from = state.grown_from, None
        if width > 0:
            state.last_width = width
        if width > 0 and width >= min(top, m):  # the proposal binds (or its whole draft was chosen)
            if grown_from is not None:
                state.growth_fails.pop(grown_from, None)
            if width < top:
                return
            wait = state.growth_wait.get(top, 0)
            if wait:
                state.growth_wait[top] = wait - 1
            else:
                state.cap, state.grown_from = 2 * top, top
            return
        if grown_from is not None:
            fails = state.growth_fails[grown_from] = state.growth_fails.get(grown_from, 0) + 1
            state.growth_wait[grown_from] = min(2**fails, 64)
        state.cap = (width or max(state.last_width or best_spec, cheap)) or None

    def decide(self, draft: Draft, budget: int | None = None) -> tuple[Draft, BudgetDecision]:
        """Cut `draft` to this step's width. budget: the per-row budget the ratios refer to (default:
        the draft's width); a draft narrower than the budget caps the widths at its width."""
        rows, m = draft.tokens.shape
        if m == 0:  # nothing proposed: a plain step that paid for proposing
            self._track(0.0, rows, 0.0)
            return draft, BudgetDecision(0.0, 0, 0, float(rows), probe=True)
        budget = budget or m
        # each row's calibrated scores, best first: expected accepted tokens of its top-W = prefix sum
        score = self.calibration(draft.score).masked_fill(~draft.valid, 0.0)
        cum = torch.sort(score, dim=1, descending=True).values.cumsum(1)  # [rows, m]
        counts = draft.valid.sum(1)
        all_widths = self._widths(budget)
        # a step verifies at most `cap` nodes per row (the proposal width, `_move_cap`)
        cap = self._cap(all_widths, rows)
        widths = sorted({min(m, w) for w in all_widths})
        cols = torch.tensor([max(w - 1, 0) for w in widths], device=cum.device)
        gains = cum[:, cols].sum(0)  # [len(widths)] Σ_rows expected accepted candidates
        kept = torch.minimum(counts.view(-1, 1), torch.tensor(widths, device=counts.device).view(1, -1)).sum(0)
        host = torch.cat([gains.float(), kept.float(), counts.max().view(1).float(), counts.sum().view(1).float()])
        host = host.tolist()  # the one host transfer of the decision
        n = len(widths)
        gains, kept, widest, candidates = host[:n], [int(k) for k in host[n : 2 * n]], int(host[-2]), int(host[-1])
        # steady state at W: trees proposed at width W (the cap follows the choice); W = 0 is plain
        expected = [rows + (gains[i] if w else 0.0) for i, w in enumerate(widths)]
        rates = [e / self.step_ms(rows, w, widest) for e, w in zip(expected, widths)]
        spec = max(range(1, n), key=rates.__getitem__)  # the W > 0 closest to paying (widths[0] = 0, m > 0)
        margin = self.config.switch_margin if self.idle > 0 else 1.0  # leaving plain decoding must pay by a margin
        i = spec if rates[spec] / margin > rates[0] else 0
        if widths[i] > cap > 0:  # verify no wider than the cap (a draft wider than the proposal budget)
            i = max(j for j, w in enumerate(widths) if w <= cap)
        width, n_kept = widths[i], kept[i]
        self._move_cap(self.rows_class(rows), width, max(w for w in all_widths if w <= cap), m, widths[spec],
                       self._cheap_width(rows, all_widths) if width == 0 else 0)  # only a probe uses it
        probe_w = self.proposal_budget(budget, rows)  # what the next probe proposes and at most verifies
        self.rows_class(rows).probe_ms = max(self.step_ms(rows, probe_w, widest) - self.step_ms(rows, 0), 0.0)
        self._track(width / budget, rows, rates[spec] / rates[0])
        verified = width
        if width == 0 and self.explore_every > 0:
            # every n-th plain decision verifies the smallest W > 0 anyway, so the score calibration
            # keeps learning while D-cut decodes plainly; it counts as a plain decision (back-off, cap)
            self.plain_decisions += 1
            if self.plain_decisions % self.explore_every == 0:
                i, verified, n_kept = 1, widths[1], kept[1]
        if verified < widest:
            draft = keep_best(draft, verified)
        return draft, BudgetDecision(verified / budget, n_kept, candidates, expected[i], probe=width == 0)
