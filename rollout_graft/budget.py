"""D-cut: a batch-wide verification budget chosen by a cost model (DESIGN.md §2 step 4).

Every candidate node carries a score: the estimated probability that verification reaches and
accepts it (prefix product of confidences, calibrated online against observed acceptance).
Scores never increase along a path, so keeping a row's highest-scoring nodes keeps its tree
ancestor-closed. Each step D-cut picks the verified width W = ρ·m (m: the draft's width) that
maximises expected emitted tokens / predicted step time over the whole batch (m: the per-row
budget; a draft narrower than m caps W at its width):

    E[emitted | W] = Σ_rows (1 + Σ_{row's top-W nodes} score)      (bonus/recovered token + accepted)
    time(W)        = cost(rows, 1 + W) · s + overhead(rows, W)      (profiled forward + measured rest)

(s: measured/profiled ratio of the rollout's own forwards, one for W = 0 and one for W > 0;
overhead: measured per proposal width, W = 0 has its own.)

W = 0 (plain decoding: no tree, one draw per row) is always a candidate, so a step is never predicted slower
than "ar". Why a per-row width rather than the paper's global top-K: see `DCut`.
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


def _close(draft: Draft, valid: torch.Tensor) -> Draft:
    """Drop every node whose parent is dropped (an explicit pass, so exact score ties between a
    parent and a child cannot break a tree)."""
    par = draft.parents.clamp(min=0)
    for _ in range(draft.max_depth):
        valid = valid & torch.where(draft.parents < 0, True, valid.gather(1, par))
    return Draft(draft.tokens, draft.parents, draft.depth, valid, draft.score, draft.source)


def _key(draft: Draft) -> torch.Tensor:
    """Selection key: score, ties broken towards shallower nodes (so a parent beats its child)."""
    return draft.score.masked_fill(~draft.valid, -1.0) - draft.depth.float() * 1e-6


def keep_top_per_row(draft: Draft, width: int) -> Draft:
    """Keep each row's `width` highest-scoring valid nodes (ancestor-closed)."""
    rows, m = draft.tokens.shape
    if m == 0 or width >= m:
        return draft
    chosen = torch.zeros(rows, m, dtype=torch.bool, device=draft.tokens.device)
    if width > 0:
        chosen.scatter_(1, torch.topk(_key(draft), width, dim=1).indices, True)
    return _close(draft, chosen & draft.valid)


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
    """y = a + b·rows, fitted by exponentially weighted least squares."""

    def __init__(self, forget: float):
        self.forget = forget
        self.sums = [0.0] * 5  # Σw, Σw·x, Σw·y, Σw·x², Σw·x·y

    def observe(self, rows: int, ms: float) -> None:
        f = self.forget
        w, sx, sy, sxx, sxy = (v * f for v in self.sums)
        self.sums = [w + 1, sx + rows, sy + ms, sxx + rows * rows, sxy + rows * ms]

    def predict(self, rows: int) -> float:
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


PROBE_SHARE = 0.02
"""While backing off, probes may cost about this share of the plain decoding time (`DCut._update_longest_backoff`)."""


SWITCH_MARGIN = 1.1
"""After a plain step, D-cut returns to speculation only when it predicts ≥ 10 % more tokens per
second: near break-even, flip-flopping pays the switch (a drafter's catch-up, a probe's tree) for
nothing."""


class DCut:
    """Chooses the verified width W = ρ·m per step (m: the per-sequence budget, W capped at the
    draft's width) from `ratios`, with a `CostModel` for the forward and an `OverheadModel` for the rest.

    The verify forward is a padded [rows, 1 + W] batch: its cost is set by its widest row. A global
    top-K (the D-cut paper's selection, made for token-packed engines) would pay for its widest row
    anyway, and the padding can be filled with every row's next-best nodes for free — so keeping
    the global top-K and filling the padding *is* keeping each row's top-W (`keep_top_per_row`).
    Which W is worth it is still a batch-wide decision: Σ over all rows of the expected accepted
    tokens against the predicted step time.
    """

    def __init__(self, cost: CostModel, ratios: tuple[float, ...], explore_every: int = 16,
                 overhead: OverheadModel | None = None):
        self.cost = cost
        self.ratios = tuple(sorted(set(ratios) | {0.0}))
        self.calibration = ScoreCalibration()
        self.overhead = overhead or OverheadModel()  # speculative steps: tree + walk + learning
        self.plain_overhead = OverheadModel()  # plain steps: one draw per row
        self.explore_every = explore_every  # every n-th step verifies ≥ the smallest ρ > 0 to keep calibrating
        self.steps = 0
        self.width_cap: int | None = None  # the widest W the next step may propose (None: the smallest)
        self.grown_from: int | None = None  # the proposal width the last decision grew the cap from
        self.growth_fails: dict[int, int] = {}  # proposal width → growths from it in a row that fell back
        self.growth_wait: dict[int, int] = {}  # proposal width → binding decisions to wait before growing again
        self.idle = 0  # consecutive decisions for ρ = 0
        self.until_probe = 0  # steps left to decode plainly without even proposing
        self.backoff_rows = 0  # batch size when the back-off began
        self.longest_backoff = 64  # steps between probes at most (`_update_longest_backoff`)
        self.forward_scale = [1.0, 1.0]  # measured / profiled verify forward: plain, wider (`observe_forward`)

    def skip_proposal(self, rows: int | None = None) -> bool:
        """Back off while speculation does not pay: after n consecutive ρ = 0 decisions, the next
        min(2^n, longest) − 1 steps decode plainly without building a tree at all, then probe again
        (`longest_backoff`). A batch that halved since the back-off began probes at
        once: fewer rows may make speculation pay."""
        if self.until_probe > 0 and rows is not None and 2 * rows <= self.backoff_rows:
            self.until_probe = 0
        if self.until_probe > 0:
            self.until_probe -= 1
            return True
        return False

    def _track(self, ratio: float, rows: int) -> None:
        if ratio > 0:
            self.idle = 0
            return
        self.idle += 1
        self.backoff_rows = rows
        self.until_probe = min(2 ** self.idle, self.longest_backoff) - 1

    def _update_longest_backoff(self, probe_ms: float, plain_ms: float) -> None:
        """Steps between probes at most: 64, or more when one probe (a tree and a wider forward)
        costs more than PROBE_SHARE of the plain steps it would interrupt — a drafter that is slow
        next to the target is not re-tried every 64 steps (at most 1024)."""
        share = probe_ms / (PROBE_SHARE * plain_ms) if plain_ms > 0 else 0.0
        self.longest_backoff = int(min(1024, max(64, share)))

    def observe(self, draft: Draft, accepted: torch.Tensor) -> None:
        """draft: the verified (cut) draft; accepted: [rows, m] bool accepted candidates."""
        self.calibration.observe(draft.score, draft.valid, accepted)

    def observe_forward(self, rows: int, tokens_per_row: float, ms: float) -> None:
        """A verify forward measured by the engine: the profiled table is the best of a few timings
        on an idle device, a rollout's forwards run in its caches, allocator and neighbours. The
        measured/profiled ratio (moving average, one for plain and one for wider forwards) scales
        the table's predictions."""
        predicted = self.cost.predict(rows, tokens_per_row)
        if predicted > 0 and ms > 0:
            i = int(tokens_per_row > 1)
            self.forward_scale[i] = 0.9 * self.forward_scale[i] + 0.1 * ms / predicted

    def forward_ms(self, rows: int, tokens_per_row: float) -> float:
        """Predicted verify forward: the profiled table × the measured/profiled ratio of such forwards."""
        return self.cost.predict(rows, tokens_per_row) * self.forward_scale[int(tokens_per_row > 1)]

    def observe_overhead(self, rows: int, ms: float, speculative: bool = True, width: int = 0) -> None:
        """Time a step spent outside the verify forward (measured by the engine); width: the
        proposal width of a speculative step (what `proposal_budget` asked the proposer for)."""
        if speculative:
            self.overhead.observe(rows, ms, width)
        else:
            self.plain_overhead.observe(rows, ms)

    def _widths(self, budget: int) -> list[int]:
        return sorted({round(r * budget) for r in self.ratios})

    def _cap(self, widths: list[int]) -> int:
        smallest = next((w for w in widths if w > 0), 0)
        return max(self.width_cap or smallest, smallest)

    def proposal_budget(self, budget: int) -> int:
        """Nodes per row worth proposing this step: no width above the cap can be chosen, so a probe
        after a back-off builds the smallest tree and a step after narrow choices a narrow one (see
        `_move_cap`)."""
        widths = self._widths(budget)
        cap = self._cap(widths)
        return min(budget, max((w for w in widths if w <= cap), default=0))

    def _move_cap(self, width: int, top: int, m: int) -> None:
        """The next step's proposal width, after this step chose `width` from a draft of width m
        proposed at `top` (the widest width the cap allowed):

        - ρ = 0: the smallest (the probe after the back-off builds the cheapest tree);
        - below what was proposed: the chosen width (a wider tree costs more to build: a drafter
          expands one level per node of width, up to its depth);
        - the whole proposal: double (slow start: an uncalibrated guess is costly at a large
          batch, so the cap grows from the smallest width). A growth whose first decision falls
          back waits 2, 4, … 64 binding decisions before it is tried again from that width (its
          cost is known by then: the wider tree was built and measured)."""
        grown_from, self.grown_from = self.grown_from, None
        if width > 0 and width >= min(top, m):  # the proposal binds (or its whole draft was chosen)
            if grown_from is not None:
                self.growth_fails.pop(grown_from, None)
            if width < top:
                return
            wait = self.growth_wait.get(top, 0)
            if wait:
                self.growth_wait[top] = wait - 1
            else:
                self.width_cap, self.grown_from = 2 * top, top
            return
        if grown_from is not None:
            fails = self.growth_fails[grown_from] = self.growth_fails.get(grown_from, 0) + 1
            self.growth_wait[grown_from] = min(2**fails, 64)
        self.width_cap = width or None

    def decide(self, draft: Draft, budget: int | None = None) -> tuple[Draft, BudgetDecision]:
        """Cut `draft` to this step's width. budget: the per-row budget the ratios refer to (default:
        the draft's width); a draft narrower than the budget caps the widths at its width."""
        rows, m = draft.tokens.shape
        if m == 0:
            self._track(0.0, rows)
            return draft, BudgetDecision(0.0, 0, 0, float(rows))
        budget = budget or m
        # each row's calibrated scores, best first: expected accepted tokens of its top-W = prefix sum
        score = self.calibration(draft.score).masked_fill(~draft.valid, 0.0)
        cum = torch.sort(score, dim=1, descending=True).values.cumsum(1)  # [rows, m]
        counts = draft.valid.sum(1)
        all_widths = self._widths(budget)
        # a step verifies at most `cap` nodes per row (the proposal width, `_move_cap`)
        cap = self._cap(all_widths)
        widths = sorted({min(m, w) for w in all_widths})
        cols = torch.tensor([max(w - 1, 0) for w in widths], device=cum.device)
        gains = cum[:, cols].sum(0)  # [len(widths)] Σ_rows expected accepted candidates
        kept = torch.minimum(counts.view(-1, 1), torch.tensor(widths, device=counts.device).view(1, -1)).sum(0)
        host = torch.cat([gains.float(), kept.float(), counts.max().view(1).float(), counts.sum().view(1).float()])
        host = host.tolist()  # the one host transfer of the decision
        n = len(widths)
        gains, kept, widest, candidates = host[:n], [int(k) for k in host[n : 2 * n]], int(host[-2]), int(host[-1])
        self.steps += 1
        explore = self.explore_every > 0 and self.steps % self.explore_every == 0
        plain_ms = self.plain_overhead.predict(rows)
        best = None
        for i, w in enumerate(widths):
            if explore and w == 0 and n > 1:
                continue
            if w == 0:
                expected, ms = float(rows), self.forward_ms(rows, 1.0) + plain_ms
            else:
                # steady state at W: trees proposed at width W (the cap follows the choice)
                expected = rows + gains[i]
                ms = self.forward_ms(rows, 1.0 + min(w, widest)) + self.overhead.predict(rows, w)
            rate = expected / ms
            if w > 0 and self.idle > 0 and not explore:  # leaving plain decoding must pay by a margin
                rate /= SWITCH_MARGIN
            if best is None or rate > best[0]:
                best = (rate, w, kept[i] if w else 0, expected)
        _, width, n_kept, expected = best
        if width > cap > 0:  # verify no wider than the cap (a draft wider than the proposal budget)
            i = max(j for j, w in enumerate(widths) if w <= cap)
            width, n_kept, expected = widths[i], kept[i], rows + gains[i]
        self._move_cap(width, max(w for w in all_widths if w <= cap), m)
        ratio = width / budget
        plain = self.forward_ms(rows, 1.0) + plain_ms
        smallest = next((w for w in widths if w > 0), 0)  # what a probe verifies
        probe = self.forward_ms(rows, 1.0 + min(smallest, widest)) + self.overhead.predict(rows, smallest)
        self._update_longest_backoff(probe - plain, plain)
        self._track(ratio, rows)
        if width < widest:
            draft = keep_top_per_row(draft, width).compacted()
        return draft, BudgetDecision(ratio, n_kept, candidates, expected)
