"""Budget policies for chain drafts (vLLM's speculative decoding): a draft depth per request.

vLLM verifies one chain per request and packs every scheduled token of the batch into one
forward, so its step time follows the number of scheduled tokens — the setting of the D-cut
paper itself. The vLLM proposer calls a `ChainPolicy` (plan → cut → observe) over `Chains`
(`FixedDepth`: every chain whole). Each step `ChainDCut` takes every request's chain with the
score of each draft token (the prefix product of confidences, calibrated against observed
acceptance by the `core.ScoreCalibration` the engine's D-cut uses too), keeps the batch's global
top-K tokens, and picks K to maximise expected emitted tokens per predicted step time:

    E[emitted | K] = rows + Σ_{top-K tokens} score        (one bonus/recovered token per row)
    time(K)        = a + b_rows · rows + b_draft · K + b_spec · [K > 0]
                                                          (fitted online to vLLM's measured steps,
                                                           per batch-size class: `StepCosts`;
                                                           b_spec: the speculative path's own cost)

K = 0 (plain decoding) is always a candidate. Every chain the proposer computed and D-cut did not
send still teaches the calibration: the proposer keeps it as a *shadow* and compares it with the
tokens the request goes on to emit (`ChainStep.shadowed`). A draft token without draft
probabilities is accepted by vLLM's rejection sampler with the target's probability of it, which
is also the probability that plain (or any lossless) decoding emits it there, so a shadow's
matched prefix is distributed as its accepted prefix would have been: evidence of the same kind as
a verified draft's, at the cost of drafting alone. The calibration forgets (`forget` per step that
brought evidence), so when a rollout's drafts start to be accepted — a later epoch whose prompts
recall their completions — D-cut follows within tens of steps, whether it drafted or not.

After a plain decision the proposer drafts nothing until the next draft (a probe) is affordable:
`core.ProbeCredit`, charged with what the probe cost beyond a plain step (the proposer's
drafting time). A probe is an ordinary decision on fresh chains; what it cuts away becomes shadows.
Scores never increase along a chain, so the global top-K is a prefix of each chain: a depth per
request (`selection.global_top_k_depths`). The step time is measured between consecutive `propose`
calls (vLLM's whole step: schedule, forward, sample, propose) and fitted by exponentially weighted
least squares (`core.CostFit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..selection import global_top_k_depths
from .core import RIDGE, BudgetDecision, CostFit, ProbeCredit, RowCost, ScoreCalibration


@dataclass(slots=True)
class Chains:
    """One draft chain per request and the raw score of each of its tokens ([rows, depth], 0 past
    the chain's end; non-increasing along a chain)."""

    tokens: list[list[int]]
    scores: np.ndarray

    @property
    def depths(self) -> np.ndarray:
        return (self.scores > 0).sum(1)

    def cut(self, depths: np.ndarray) -> Chains:
        """Each chain's first `depths[i]` tokens."""
        keep = np.arange(self.scores.shape[1]).reshape(1, -1) < depths.reshape(-1, 1)
        return Chains([t[:d] for t, d in zip(self.tokens, depths.tolist())], np.where(keep, self.scores, 0.0))


@dataclass(slots=True)
class ChainStep:
    """What a chain policy learns from, after vLLM verified the chains of the last step."""

    rows: int  # requests in the step
    planned: int  # depth the proposer was asked for (`plan`; 0: nothing drafted)
    drafted: int  # draft tokens returned to vLLM (whole batch; a fixed budget's decision does not count them)
    draft_ms: float  # the proposer's drafting and cutting time
    decision: BudgetDecision | None  # None: nothing drafted
    verified: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # raw scores [n, depth], depths [n], accepted [n] of the rows that drafted
    ms: float | None  # the whole step (our own time included); None: not timed (it also prefilled)
    emitted: int  # tokens the step emitted (all requests)
    # as `verified`, for chains computed and not sent, matched against the text emitted since (resolved this step)
    shadowed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


class ChainPolicy(Protocol):
    """How deep each request drafts. The vLLM proposer calls, every step:

        depth = policy.plan(rows)              # how deep to draft (0: not at all)
        chains, decision = policy.cut(chains)  # the depths verified, and why
        ... vLLM verifies; at the next call:
        policy.observe(ChainStep(...))         # what the step verified, accepted and took

    and `explain()` for its summary. An implementation may subclass it for the defaults of
    `observe` and `explain`."""

    def plan(self, rows: int) -> int:
        """Draft depth this step, for `rows` requests (0: decode plainly)."""
        ...

    def cut(self, draft: Chains) -> tuple[Chains, BudgetDecision]:
        """The part of each chain vLLM verifies this step."""
        ...

    def observe(self, step: ChainStep) -> None:
        """Learn from the step vLLM just made (by default: nothing)."""

    def explain(self) -> str:
        """Why the policy verifies what it verifies (by default: its docstring's first paragraph)."""
        return " ".join((type(self).__doc__ or type(self).__name__).split("\n\n")[0].split())


class FixedDepth(ChainPolicy):
    """Fixed budget: every request verifies its whole chain (at most `depth` tokens)."""

    def __init__(self, depth: int):
        self.depth = depth

    def plan(self, rows: int) -> int:
        return self.depth

    def cut(self, draft: Chains) -> tuple[Chains, BudgetDecision]:
        return draft, BudgetDecision(1.0)


def size_class(rows: int) -> int:
    """Batch-size class: rows rounded down to a power of two (its bit length)."""
    return max(rows, 1).bit_length()


def step_ms(coef: np.ndarray, rows: int, draft_tokens: np.ndarray | int) -> np.ndarray:
    """A vLLM step's ms under the fit `coef` = [a, b_rows, b_draft, b_spec], for each draft token count."""
    a, b_rows, b_draft, b_spec = coef
    k = np.asarray(draft_tokens, dtype=np.float64)
    return a + b_rows * rows + b_draft * k + b_spec * (k > 0)


@dataclass
class StepCosts:
    """ms of one vLLM step ≈ a + b_rows·rows + b_draft·draft_tokens + b_spec·[draft_tokens > 0]
    (`step_ms`), a non-negative `CostFit` per batch-size class beside one over all sizes.

    b_spec is what a step pays for taking vLLM's speculative path at all (its speculative metadata
    and rejection sampler; a step where no request drafted takes the plain path: `plugin`): on the
    tiny target 1.2 ms at 8 rows and 5.0 ms at 64, 16 % and 28 % of a plain step, where a draft
    token costs 0.04–0.06 ms — a fit without it priced steps that verified at most a token per row
    6–8 % below what they took, so D-cut drafted at break-even at a loss (`lab/vllm_step_cost.py`;
    docs/RESULTS.md, "vLLM step cost against draft tokens (tiny target)").

    The two costs of drafting have priors of 0, with the weight of one step that took the
    speculative path (`spec_prior`) and of one draft token (`draft_prior`): the drafting steps
    measured outweigh them while they are recent, and as they are forgotten (D-cut decoding
    plainly measures none) the costs shrink until D-cut drafts again and measures them anew. A cost
    over-estimated once — vLLM's first speculative steps take twice the others, a busy machine —
    held D-cut plain for good otherwise (at batch 1, from a rollout's first steps on); so did an
    earlier prior that a draft token costs what a row costs, which at batch 1 is a whole step.
    Before any step is measured a row costs 1 ms and drafting nothing.

    A class predicts with its own fit once it has measured `least` plain and `least` drafting
    steps, before that the overall fit does. A verified draft token's cost is not one number across
    batch sizes (at batch 1 a step is overhead and extra tokens ride along; at batch 64 they are
    compute), and a rollout's batch drains from its full size to one row as requests finish, so one
    linear fit with a short memory priced batch 1 from the batch-64 steps just before it (measured
    when introduced; see git history). A constant batch size leaves a and b_rows confounded;
    predictions at the measured batch sizes are right either way."""

    least: int = 4
    forget: float = 0.97
    spec_prior: float = 1.0
    draft_prior: float = 1.0
    overall: CostFit = field(init=False)
    classes: dict[int, CostFit] = field(default_factory=dict)
    seen: dict[int, list[int]] = field(default_factory=dict)  # class → [plain steps, drafting steps]

    def __post_init__(self) -> None:
        self.overall = self._new_fit()

    def _new_fit(self) -> CostFit:
        return CostFit((RIDGE, RIDGE, self.draft_prior + RIDGE, self.spec_prior + RIDGE), self.forget, nonnegative=True,
                       unmeasured=(0.0, 1.0, 0.0, 0.0))

    def fit_for(self, rows: int) -> CostFit:
        cls = size_class(rows)
        plain, drafting = self.seen.get(cls, (0, 0))
        return self.classes[cls] if min(plain, drafting) >= self.least else self.overall

    def observe(self, rows: int, draft_tokens: int, ms: float) -> None:
        cls, x = size_class(rows), (1.0, rows, draft_tokens, float(draft_tokens > 0))
        self.overall.observe(x, ms)
        if cls not in self.classes:
            self.classes[cls] = self._new_fit()
        self.classes[cls].observe(x, ms)
        self.seen.setdefault(cls, [0, 0])[draft_tokens > 0] += 1

    def predict(self, rows: int, draft_tokens: np.ndarray | int) -> np.ndarray:
        return step_ms(self.fit_for(rows).coef, rows, draft_tokens)

    @property
    def samples(self) -> int:
        return self.overall.samples

    @property
    def drafting_steps(self) -> int:
        """Steps measured that verified drafts (all classes)."""
        return sum(drafting for _, drafting in self.seen.values())


class ChainDCut(ChainPolicy):
    """D-cut for chains (see the module docstring). depth: the deepest chain (vLLM's
    `num_speculative_tokens`); explore_every: every n-th decision to draft decodes plainly
    instead, so the measured guard (`pays`) never compares with plain steps measured long ago (on
    a machine whose speed moves, such a reference let D-cut draft at a loss for a whole rollout;
    0: never); warmup: drafting steps measured before the fit decides (until then decisions
    take full drafts, plain steps and drafts of about a token per row in turn, so the fit sees
    all three and tells the speculative path's cost from a draft token's; a cold proposer that has
    nothing to draft yet does not end it); probe_share: `ProbeCredit.share`, kept per batch-size class
    (probes at a full batch cost many times a probe at one row: their debt held D-cut plain at
    batch 1 for hundreds of steps, where drafting paid); forget: the calibration's memory per step
    that brought evidence (verified drafts or resolved shadows; 1: never forgets)."""

    def __init__(self, depth: int, explore_every: int = 16, warmup: int = 8, probe_share: float = 0.01,
                 forget: float = 0.98):
        self.depth = depth
        self.calibration = ScoreCalibration()
        self.forget = forget
        self.cost = StepCosts()
        self.draft_cost = RowCost(0.9)  # the proposer's drafting time per step (what a probe costs)
        self.probe_share = probe_share
        self.probes: dict[int, ProbeCredit] = {}  # per batch-size class: one class's probes do not pay for another's
        self.explore_every = explore_every
        self.warmup = warmup
        self.decisions = 0
        self.draft_decisions = 0  # K > 0 decisions so far (every explore_every-th decodes plainly)
        self.plain = False  # the last decision was K = 0: the next draft is a probe
        self.rows = 0  # rows of the last decision (for `explain`)
        self.measured: dict[tuple[int, bool], tuple[float, float]] = {}  # (rows class, drafted) → EW Σ (tokens, ms) (`pays`)

    def plan(self, rows: int) -> int:
        """The whole depth, or — after a plain decision — 0 until a probe is affordable."""
        return 0 if self.plain and not self.credit(rows).affords(self.draft_cost.predict(rows)) else self.depth

    def credit(self, rows: int) -> ProbeCredit:
        """The probe credit of this batch size's class."""
        cls = size_class(rows)
        if cls not in self.probes:
            self.probes[cls] = ProbeCredit(self.probe_share)
        return self.probes[cls]

    def calibrated(self, scores: np.ndarray) -> np.ndarray:
        cal = self.calibration(scores)
        return np.where(scores > 0, np.minimum.accumulate(cal, axis=1), 0.0)  # stays non-increasing

    def cut(self, draft: Chains) -> tuple[Chains, BudgetDecision]:
        scores = draft.scores
        rows = self.rows = scores.shape[0]
        probe = self.plain  # proposed after a plain decision
        self.decisions += 1
        proposed = int((scores > 0).sum())
        cal = self.calibrated(scores)
        gains = np.concatenate([[0.0], np.cumsum(np.sort(cal[cal > 0])[::-1])])  # [proposed + 1]
        if self.cost.drafting_steps < self.warmup:  # full drafts, plain steps and a token per row in turn:
            k = (proposed, 0, min(rows, proposed), 0)[self.decisions % 4]  # the fit tells b_spec from b_draft
            self.plain = False
        else:
            rates = (rows + gains) / np.maximum(self.cost.predict(rows, np.arange(proposed + 1)), 1e-6)
            k = int(np.argmax(rates))
            if k > 0 and not probe and not self.pays(rows):  # the measured steps say plain was faster:
                k = 0  # plain, until a probe drafts again and measures them anew
            self.plain = k == 0
            if not self.plain:
                self.draft_decisions += 1
                if self.explore_every and self.draft_decisions % self.explore_every == 0:
                    k = 0  # a plain step keeps the guard's plain reference current (not a plain decision)
        # the global top-k of the calibrated scores: Σ of the kept = gains[k]
        decision = BudgetDecision(k / max(rows * self.depth, 1), k, proposed, float(rows + gains[k]), probe=probe and self.plain)
        return draft.cut(global_top_k_depths(cal, k)), decision

    def observe(self, step: ChainStep) -> None:
        """Calibrate on what vLLM accepted and what the shadows matched, fit the step time, price the
        drafting, keep the probe credit."""
        evidence = [e for e in (step.verified, step.shadowed) if e is not None]
        if evidence:
            self.calibration.age(self.forget)  # per step with evidence, not per source
        for scores, depths, accepted in evidence:
            pos = np.arange(scores.shape[1]).reshape(1, -1)
            self.calibration.observe(scores, pos < depths.reshape(-1, 1), pos < accepted.reshape(-1, 1))
        if step.planned:
            self.draft_cost.observe(step.rows, step.draft_ms)
        credit = self.credit(step.rows)
        probe = step.decision is not None and step.decision.probe  # cut to nothing: it cost our drafting
        if step.ms is None:  # not timed
            credit.spend(step.draft_ms if probe else 0.0)
        else:  # the probe's cost is our drafting, not the step's noise beside plain steps
            credit.settle(step.ms, self.plain_step_ms(step.rows), step.rows, step.emitted, probe, cost=step.draft_ms)
            self.cost.observe(step.rows, step.drafted, step.ms)
            key = (size_class(step.rows), step.drafted > 0)
            tokens, ms = self.measured.get(key, (0.0, 0.0))
            self.measured[key] = (0.9 * tokens + step.emitted, 0.9 * ms + step.ms)
        credit.bank_at_most(2.0 * self.draft_cost.predict(step.rows))

    def plain_step_ms(self, rows: int) -> float:
        """A plain step of `rows` rows as the guard measured plain steps at this batch-size class (ms
        per token × rows; one token per row), else as fitted. Every step's credit reads it, and
        while D-cut decodes plainly nothing else needs the fit: refitting it every step was a quarter
        of D-cut's policy time there (`lab/profile_vllm_proposer.py`; measured when introduced, see
        git history)."""
        plain = self.measured.get((size_class(rows), False))
        return rows * plain[1] / plain[0] if plain is not None else float(self.cost.predict(rows, 0))

    def pays(self, rows: int) -> bool:
        """Whether steps that drafted emitted more tokens per ms than plain steps did, at this batch
        size class (rows rounded down to a power of two; tokens per ms as the ratio of exponentially
        weighted sums, so one slow step weighs by its time, not as one rate among few); True until
        both were measured. It guards the fit, whose costs can be confounded (in a rollout, draft
        tokens grow with the rows). A probe is not held by it: while D-cut decodes plainly nothing
        else measures drafting steps, and a guard holding what drafts earned long ago — an earlier
        epoch's sibling drafts, accepted rarely — held D-cut plain through a revisit whose drafts
        were accepted mostly (measured when introduced; see git history)."""
        cls = size_class(rows)
        spec, plain = self.measured.get((cls, True)), self.measured.get((cls, False))
        return spec is None or plain is None or spec[0] / spec[1] >= plain[0] / plain[1]

    def explain(self) -> str:
        """Why D-cut verifies what it verifies: a draft token with acceptance p adds p tokens for
        b_draft ms, and a step that verifies any draft pays b_spec once; a plain step gives one token
        per row for (a + b_rows·rows) / rows ms; so K draft tokens pay iff their Σ p exceeds
        (b_spec + b_draft·K) · rows / (a + b_rows·rows)."""
        rows = max(self.rows, 1)
        a, b_rows, b_draft, b_spec = self.cost.fit_for(rows).coef
        per_token = (a + b_rows * rows) / rows
        seen = float(self.calibration.seen.sum())
        rate = float(self.calibration.accepted.sum()) / seen if seen else float("nan")
        return (f"at {rows} requests a plain step costs {per_token:.2f} ms per token; a step that drafts costs "
                f"{b_spec:.2f} ms more and each verified draft token {b_draft:.2f} ms, so a draft token pays when "
                f"accepted with probability > {b_draft / per_token:.0%} (and the step's drafts together pay "
                f"its {b_spec / per_token:.2f} tokens' worth of speculative path); draft tokens were accepted at "
                f"{rate:.0%} ({int(seen)} verified, fit over {self.cost.samples} steps)")
