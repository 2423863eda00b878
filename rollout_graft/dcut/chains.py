"""Budget policies for chain drafts (vLLM's speculative decoding): a draft depth per request.

The vLLM proposer calls a `ChainPolicy` (plan → cut → observe) over chains: a token list per
request and the raw score of each token ([rows, depth], prefix products, 0 past a chain's end).
`FixedDepth` verifies every chain whole. `ChainDCut` calibrates the scores against observed
acceptance (`core.ScoreCalibration`), keeps the batch's global top-K draft tokens (a prefix of
each chain: `selection.global_top_k_depths`) and picks K to maximise

    (rows + Σ_{top-K} calibrated score) / (a + b_rows·rows + b_draft·K + b_spec·[K > 0])

with the step time fitted online to vLLM's measured steps (`step_cost_fit`) — or, given a step-cost
profile (what a profile at start measured: an accelerator's step is flat while memory-bound, then
linear, a shape no line through the first draft token has), the profile corrected online by that
same fit of what the measured steps took beyond it, and then (`spread`) the rows' gains credited
against the step's fixed part below their mean, a batch that drains ending with its slowest rows; K = 0 is always a
candidate, and after it the next draft is a probe paid from `core.ProbeCredit`. The chains, sent or
cut away, teach the calibration as shadows (`ChainStep.shadowed`); with a profile a recent calibration
beside a steady one, read where acceptance has moved (`recent`). Why each mechanism is there, and what
was raced out: docs/DESIGN.md, "The vLLM backend", step 4.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .core import RIDGE, BudgetDecision, CostFit, ProbeCredit, RowCost, ScoreCalibration


def cut(tokens: np.ndarray | list[list[int]], depths: np.ndarray) -> list[list[int]]:
    """Each chain's first `depths[i]` tokens (chains as rows of an array or as lists)."""
    rows = tokens.tolist() if isinstance(tokens, np.ndarray) else tokens
    return [t[:d] for t, d in zip(rows, depths.tolist())]


@dataclass(slots=True)
class ChainStep:
    """What a chain policy learns from, after vLLM verified the chains of the last step."""

    rows: int  # requests in the step
    planned: int  # depth the proposer was asked for (`plan`; 0: nothing drafted)
    drafted: int  # draft tokens returned to vLLM (whole batch; a fixed budget's decision does not count them)
    # the proposer's drafting and cutting time, its counting of the text since the last draft excluded:
    # counting keeps the tables current whatever the policy decides (deferred to a draft only to batch
    # it); charged to a probe, one count of a long spell's text made the probes after it look as dear
    # and held D-cut plain through revisits where drafting paid (docs/DESIGN.md, "Modelled clocks")
    draft_ms: float
    decision: BudgetDecision | None  # None: nothing drafted
    verified: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # raw scores [n, depth], depths [n], accepted [n] of the rows that drafted
    ms: float | None  # the whole step (our own time included); None: not timed (it also prefilled)
    emitted: int  # tokens the step emitted (all requests)
    # as `verified`, for whole chains (sent or cut away) matched against the text emitted since (resolved this step)
    shadowed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


class ChainPolicy(Protocol):
    """How deep each request drafts. The vLLM proposer calls, every step:

        depth = policy.plan(rows)                      # how deep to draft (0: not at all)
        depths, decision = policy.cut(tokens, scores)  # the depth verified per chain, and why
        ... vLLM verifies; at the next call:
        policy.observe(ChainStep(...))                 # what the step verified, accepted and took

    and `explain()` for its summary. An implementation may subclass it for the defaults of
    `observe`, `explain` and `learns`."""

    learns: bool = False
    """`observe` learns from what drafts earned (`ChainStep.verified`, `.shadowed`): the proposer
    builds that evidence, and keeps chains as shadows, only for a policy that does."""

    def plan(self, rows: int) -> int:
        """Draft depth this step, for `rows` requests (0: decode plainly)."""
        ...

    def cut(self, tokens: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, BudgetDecision]:
        """How many tokens of each chain (`tokens` [rows, depth], with the raw score of each token
        `scores` [rows, depth]: > 0 along a chain, 0 past its end, non-increasing) vLLM verifies this
        step: depths [rows]."""
        ...

    def observe(self, step: ChainStep) -> None:
        """Learn from the step vLLM just made (by default: nothing)."""

    def drafts_next(self, rows: int) -> bool:
        """Whether the next step's `plan` may draft, asked after a step that does not (by default:
        yes). A proposer counts the text its plain steps defer beside the forward before such a step."""
        return True

    def explain(self) -> str:
        """Why the policy verifies what it verifies (by default: its docstring's first paragraph)."""
        return " ".join((type(self).__doc__ or type(self).__name__).split("\n\n")[0].split())


class FixedDepth(ChainPolicy):
    """Fixed budget: every request verifies its whole chain (at most `depth` tokens)."""

    def __init__(self, depth: int):
        self.depth = depth

    def plan(self, rows: int) -> int:
        return self.depth

    def cut(self, tokens: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, BudgetDecision]:
        return np.count_nonzero(scores, axis=1).astype(np.int64), BudgetDecision(1.0)


def step_ms(coef: np.ndarray, rows: int, draft_tokens: np.ndarray | int) -> np.ndarray:
    """A vLLM step's ms under the fit `coef` = [a, b_rows, b_draft, b_spec], for each draft token count."""
    if isinstance(draft_tokens, (int, float)):  # one count: Python floats (the same IEEE operations, no numpy call)
        a, b_rows, b_draft, b_spec = coef.tolist()
        k = float(draft_tokens)
        return a + b_rows * rows + b_draft * k + b_spec * (1.0 if k > 0 else 0.0)
    a, b_rows, b_draft, b_spec = coef
    k = np.asarray(draft_tokens, dtype=np.float64)
    return a + b_rows * rows + b_draft * k + b_spec * (k > 0)


def step_cost_fit(forget: float, spec_prior: float = 1.0, draft_prior: float = 1.0) -> CostFit:
    """The fit of a vLLM step's ms ≈ a + b_rows·rows + b_draft·draft_tokens + b_spec·[draft_tokens > 0]
    (`step_ms`; features (1, rows, draft tokens, [draft tokens > 0])): one non-negative `CostFit`
    forgetting by `forget` per step measured.

    b_spec is what a step pays for taking vLLM's speculative path at all (its speculative metadata
    and rejection sampler; a step where no request drafted takes the plain path: `plugin`): on the
    tiny target many draft tokens' worth, and a fit without it priced steps that verified a few
    tokens too cheap, so D-cut drafted at break-even at a loss (docs/DESIGN.md, the vLLM backend,
    step 4; `lab/vllm_step_cost.py`).

    The two costs of drafting have priors of 0, with the weight of one step that took the
    speculative path (`spec_prior`) and of one draft token (`draft_prior`): the drafting steps
    measured outweigh them while they are recent, and as they are forgotten (D-cut decoding
    plainly measures none) the costs shrink until D-cut drafts again and measures them anew, so a
    cost over-estimated once cannot hold D-cut plain for good. Before any step is measured a row
    costs 1 ms and drafting nothing. A constant batch size leaves a and b_rows confounded;
    predictions at the measured batch sizes are right either way."""
    return CostFit((RIDGE, RIDGE, draft_prior + RIDGE, spec_prior + RIDGE), forget, nonnegative=True,
                   unmeasured=(0.0, 1.0, 0.0, 0.0))


DEPARTS = 2.0
"""`ChainDCut`'s default `departs`: its recent calibration is read in a bin where its counts depart
from the steady rate by more than this many binomial standard deviations. On the modelled-clock
replays 1.5 and 2 meet the same cells; 3 follows a revisit too late in one (`lab/replay.py vllm
clocks ... --dcut departs=S`; docs/DESIGN.md, "Modelled clocks")."""


class ChainDCut(ChainPolicy):
    """D-cut for chains (see the module docstring). Its settings are not user options (`ChainConfig`
    holds those); each stayed through the ablation on evidence of its own (docs/DESIGN.md, the vLLM
    backend, step 4).

    Args:
        depth: the deepest chain (vLLM's `num_speculative_tokens`).
        explore_every: a decision to draft decodes plainly instead while plain steps make up less
            than 1 in `explore_every` of the step-cost fit's measured steps (weighted as the fit
            weighs them: `step_forget`; 0: never). A fit that only ever sees drafting steps cannot
            tell the plain step's cost from drafting's (its priors then price drafting at 0): D-cut
            drafted on through 600 steps of a machine whose plain steps had become twice as fast per
            token, where plain steps kept at 1 in 16 bring it to plain decoding within 200
            (`test_dcut_follows_plain_steps_that_became_faster`). Kept as a share of the fit's memory
            rather than every n-th decision, the first plain step is measured at the start, not
            after 15 steps drafted blind (`test_dcut_measures_a_plain_step_before_drafting_on`).
            Default 16; with a `profile` 0 (the profile prices plain steps apart from drafting, and
            on modelled-clock replays of greedy revisits the forced plain steps cost up to 8 % of
            the best fixed arm's throughput: docs/DESIGN.md, "Modelled clocks").
        probe_share: `core.ProbeCredit.share`: after a plain decision, probes that find nothing cost
            at most this share of the time (the engine's `DCutConfig.probe_share`).
        forget: the calibration's memory per step that brought evidence (verified drafts or resolved
            shadows; 1: never forgets). A test shows a forgetting calibration following drafts that
            start to be accepted within 6 steps, one that never forgets not before 9
            (`test_shadows_bring_dcut_back_when_drafts_start_to_be_accepted`). Default 0.98.
        recent: the memory of a second, recent calibration fed the same evidence (0: none). The cut
            reads the steady one's counts (`forget`) except in a bin where the recent counts depart
            from the steady rate by more than `departs` binomial standard deviations
            (`_kernels.following`): a steady estimate where acceptance holds still — at break-even a
            noisy one drafts on its high draws, which earn less than predicted —, the recent one where
            it has moved (a revisit's drafts, accepted far more than the first visit's at the same
            raw scores, were cut for 50 steps under 0.98 alone on the modelled-clock replays).
            Default 0; with a `profile` 0.9 (docs/DESIGN.md, "Modelled clocks"). The profiled
            defaults are chosen on modelled clocks only, not yet raced on the real CPU.
        departs: see `recent` (default `DEPARTS`).
        step_forget: the step-cost fit's memory per step measured (`step_cost_fit`).
        draft_forget: the drafting-time fit's memory per drafting step (what a probe costs).
        spread: how far below the mean the rows' gains count towards the step's fixed part
            (mean − spread·std over rows: `_kernels.top_k_cut`; 0: the rate model, every gain at the mean).
            A GRPO rollout's batch only drains, so a gain on a row that is not the slowest saves that
            row's share of later steps, not the steps themselves: on modelled-clock replays of SmolLM2
            at T = 1 the rate model drafted at break-even and fell to 0.94–0.985× plain (rows
            finished apart, the last ones paying whole steps). Default 0 (the online fit cannot
            tell a step's fixed part from its per-row part at one batch size); with a `profile`
            0.75, the largest of 0.5–1.5 under which no modelled-clock cell that met the bar fell
            below it (some moved down within it; docs/DESIGN.md, "Modelled clocks"); not yet raced
            on the real CPU.
        profile: profile(rows, draft_tokens) → ms of a vLLM step of `rows` rows verifying each total
            of draft tokens (an array), as profiled before the rollout (None: none, the step time is
            the online fit alone). The fit then learns only the profile's error (its priors: none),
            so D-cut verifies by the profile's shape from its first step, and what the rollout
            measures overrides the profile where it is off.
    """

    learns = True

    def __init__(self, depth: int, *, explore_every: int | None = None, probe_share: float = 0.01,
                 forget: float = 0.98, step_forget: float = 0.97, draft_forget: float = 0.9,
                 profile: Callable[[int, np.ndarray], np.ndarray] | None = None, spread: float | None = None,
                 recent: float | None = None, departs: float = DEPARTS):
        if spread is None:
            spread = 0.0 if profile is None else 0.75
        self.spread = float(spread)
        if explore_every is None:
            explore_every = 16 if profile is None else 0
        if recent is None:
            recent = 0.0 if profile is None else 0.9
        if isinstance(recent, bool) or not isinstance(recent, (int, float)) or not 0.0 <= recent <= 1.0:
            raise ValueError(f"recent must be a number in [0, 1] (0: no recent calibration), got {recent!r}")
        if isinstance(departs, bool) or not isinstance(departs, (int, float)) or not departs > 0.0:
            raise ValueError(f"departs must be a number > 0 (binomial standard deviations), got {departs!r}")
        if isinstance(explore_every, bool) or not isinstance(explore_every, int) or explore_every < 0:
            raise ValueError(f"explore_every must be an int >= 0 (0: never), got {explore_every!r}")
        for name, value in (("probe_share", probe_share), ("forget", forget), ("step_forget", step_forget),
                            ("draft_forget", draft_forget)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
        self.depth, self.explore_every, self.forget = depth, explore_every, forget
        self.calibration = ScoreCalibration()  # the steady one (`forget`)
        self.recent, self.departs = float(recent), float(departs)
        self.recent_calibration = ScoreCalibration() if recent else None  # (`recent`)
        self.profile = profile
        # vLLM's step time; with a profile its error, signed (a profile taken on a busy machine is too dear),
        # charged to drafting while only drafting steps are measured (priors of one step at 0 on the plain
        # path's terms): D-cut then drafts less, measures plain steps and so learns the plain path's part
        self.cost = (step_cost_fit(step_forget) if profile is None
                     else CostFit((1.0, 1.0, RIDGE, RIDGE), step_forget))
        self.draft_cost = RowCost(draft_forget)  # the proposer's drafting time per step (what a probe costs)
        self.credit = ProbeCredit(probe_share)
        self.plain = False  # the last decision was K = 0: the next draft is a probe
        self.last_ms = 0.0  # the last step timed (`drafts_next`)
        self.rows = 0  # rows of the last decision (for `explain`)
        from . import _kernels  # numba: imported when a ChainDCut is built, not with this module (see there)

        self._kernels = _kernels
        self._warm()

    def plain_share(self) -> float:
        """The share of plain steps among the steps the step-cost fit measured, weighted as it weighs
        them: its Σw·(1 − [drafted]) over its Σw (0 before any step; `explore_every`)."""
        total = float(self.cost.sums[0, 0])
        return (total - float(self.cost.sums[0, 3])) / total if total > 0 else 0.0

    def plan(self, rows: int) -> int:
        """The whole depth, or — after a plain decision — 0 until a probe is affordable."""
        return 0 if self.plain and not self.credit.affords(self.draft_cost.predict(rows)) else self.depth

    def drafts_next(self, rows: int) -> bool:
        """Unless a plain spell's probe credit, with one more step's earning (the last step timed
        stands for it), still affords no probe."""
        return not self.plain or self.credit.affords(self.draft_cost.predict(rows) - self.credit.share * self.last_ms)

    def cut(self, tokens: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, BudgetDecision]:
        rows = self.rows = scores.shape[0]
        probe = self.plain  # proposed after a plain decision
        proposed = int(np.count_nonzero(scores))  # the tokens with a score > 0
        profile = (np.zeros(0) if self.profile is None
                   else np.asarray(self.profile(rows, np.arange(proposed + 1)), dtype=np.float64))
        drains = self.spread and rows > 1 and proposed
        less = float(self.predict_ms(rows - 1, 0)) if drains else 0.0  # a plain step of one row fewer
        # the calibrated acceptances (non-increasing along a chain), the best K tokens by them and K's rate
        # (the rate model, or with `spread` the drained batch's), in one compiled pass
        c, r = self.calibration, self.recent_calibration
        seen, accepted = ((c.seen, c.accepted) if r is None else
                          self._kernels.following(c.seen, c.accepted, r.seen, r.accepted, c.mid, c.prior_weight, self.departs))
        depths, k, gain = self._kernels.top_k_cut(scores, c.edges, accepted, seen, c.mid, c.prior_weight,
                                                  self.cost.coef, profile, self.spread, less)
        self.plain = k == 0
        if not self.plain and self.explore_every and self.plain_share() * self.explore_every <= 1.0:
            k, depths = 0, np.zeros(rows, np.int64)  # a plain step (not a plain decision): the fit keeps measuring plain steps
            gain = 0.0
        decision = BudgetDecision(k / max(rows * self.depth, 1), k, proposed, float(rows + gain), probe=probe and self.plain)
        return depths, decision

    def _warm(self) -> None:
        """Compile (or load from numba's cache) the kernels now, not in the first step vLLM times
        (its step-cost fit would take the compile for a step; `ngrams.NgramStore._warm` alike)."""
        one = np.zeros((1, 1))
        c = self.calibration
        self._kernels.top_k_cut(one, c.edges, c.accepted, c.seen, c.mid, c.prior_weight, self.cost.coef, np.zeros(0), 0.0, 0.0)
        none = (np.zeros((0, 1)), np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._kernels.calibrate(c.seen.copy(), c.accepted.copy(), c.edges, 1.0, *none, *none)
        self._kernels.following(c.seen, c.accepted, c.seen, c.accepted, c.mid, c.prior_weight, DEPARTS)
        if self.profile is not None:  # a roofline's profile is a compiled pass too (`roofline.Roofline.profile_ms`)
            self.profile(1, np.arange(2))

    def predict_ms(self, rows: int, draft_tokens: np.ndarray | int) -> np.ndarray:
        """A vLLM step's predicted ms at `rows` rows, for each draft token count: the online fit,
        plus the profile where there is one."""
        ms = step_ms(self.cost.coef, rows, draft_tokens)
        if self.profile is not None:
            ms = ms + self.profile(rows, np.asarray(draft_tokens))
        return ms

    def observe(self, step: ChainStep) -> None:
        """Calibrate on what vLLM accepted and what the shadows matched, fit the step time, price the
        drafting, keep the probe credit."""
        if step.verified is not None or step.shadowed is not None:  # aged per step with evidence, not per source;
            # each source counted as calibration.observe(scores, pos < depths, pos < accepted) would, compiled
            pieces = [(np.zeros((0, 1)), np.zeros(0), np.zeros(0)) if e is None else e for e in (step.verified, step.shadowed)]
            evidence = [np.ascontiguousarray(x, t) for e in pieces for x, t in zip(e, (np.float64, np.int64, np.int64))]
            for c, forget in ((self.calibration, self.forget), (self.recent_calibration, self.recent)):
                if c is not None:
                    self._kernels.calibrate(c.seen, c.accepted, c.edges, forget, *evidence)
        if step.planned:
            self.draft_cost.observe(step.rows, step.draft_ms)
        probe = step.decision is not None and step.decision.probe  # cut to nothing: it cost our drafting
        if step.ms is None:  # not timed
            self.credit.spend(step.draft_ms if probe else 0.0)
        else:  # the probe's cost is our drafting, not the step's noise beside plain steps
            plain_ms = float(self.predict_ms(step.rows, 0))
            self.credit.settle(step.ms, plain_ms, step.rows, step.emitted, probe, cost=step.draft_ms)
            self.last_ms = step.ms
            beyond = float(self.profile(step.rows, np.asarray(step.drafted))) if self.profile is not None else 0.0
            self.cost.observe((1.0, step.rows, step.drafted, float(step.drafted > 0)), step.ms - beyond)
        self.credit.bank_at_most(2.0 * self.draft_cost.predict(step.rows))

    def explain(self) -> str:
        """Why D-cut verifies what it verifies: a draft token with acceptance p adds p tokens for
        b_draft ms, and a step that verifies any draft pays b_spec once; a plain step gives one token
        per row for (a + b_rows·rows) / rows ms; so K draft tokens pay iff their Σ p exceeds
        (b_spec + b_draft·K) · rows / (a + b_rows·rows)."""
        rows = max(self.rows, 1)
        a, b_rows, b_draft, b_spec = self.cost.coef
        per_token = (a + b_rows * rows) / rows
        if self.profile is not None:  # the profile's shape: the marginal costs at one draft token per row
            plain, one, full = self.predict_ms(rows, np.array([0, 1, rows])).tolist()
            per_token, b_draft = plain / rows, (full - one) / max(rows - 1, 1)
            b_spec = one - plain - b_draft
        seen = float(self.calibration.seen.sum())
        rate = float(self.calibration.accepted.sum()) / seen if seen else float("nan")
        return (f"at {rows} requests a plain step costs {per_token:.2f} ms per token; a step that drafts costs "
                f"{b_spec:.2f} ms more and each verified draft token {b_draft:.2f} ms, so a draft token pays when "
                f"accepted with probability > {b_draft / per_token:.0%} (and the step's drafts together pay "
                f"its {b_spec / per_token:.2f} tokens' worth of speculative path); draft tokens were accepted at "
                f"{rate:.0%} ({int(seen)} verified, fit over {self.cost.samples} steps)")
