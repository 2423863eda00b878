"""The chain D-cut's mechanisms, each switched off: proposers for an A/A-controlled ablation.

    python scripts/bench.py --backend vllm --methods plain plain-twin ours+dcut@8 ours+dcut@8~no-explore ...

`ours+dcut@K~NAME` runs `RLDraftProposer` with D-cut and one mechanism of `dcut.chains.ChainDCut`
or of the proposer taken out (`VARIANTS`), beside the unchanged `ours+dcut@K` in the same run; a
mechanism stays only where taking it out loses beyond the run's A/A noise (`plain-twin`).
"""

from __future__ import annotations

from rollout_graft.dcut.core import ProbeCredit
from rollout_graft.vllm.proposer import RLDraftProposer


class _Variant(RLDraftProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        self.ablate(self.policy)

    def ablate(self, policy) -> None:
        raise NotImplementedError


class NoExplore(_Variant):
    """No forced plain step every `explore_every` drafting decisions."""

    def ablate(self, policy):
        policy.explore_every = 0


class NoGuard(_Variant):
    """No measured guard: the fit alone decides."""

    def ablate(self, policy):
        policy.pays = lambda rows: True


class NoClasses(_Variant):
    """One step-cost fit and one probe credit for every batch size."""

    def ablate(self, policy):
        policy.cost.least = 10**9  # the classes' fits are never used: the overall one is
        one = ProbeCredit(policy.probe_share)
        policy.credit = lambda rows: one


class NoWarmup(_Variant):
    """No warm-up cycle of full / plain / token-per-row decisions before the fit decides."""

    def ablate(self, policy):
        policy.warmup = 0


class NoSpecTerm(_Variant):
    """No speculative-path term: b_spec is held at 0 by a prior of overwhelming weight."""

    def ablate(self, policy):
        policy.cost.spec_prior = 1e12
        policy.cost.classes.clear()
        policy.cost.__post_init__()


class TimedFirstCounts(_Variant):
    """A token count's first step is timed like any other."""

    untimed_first_counts = False

    def ablate(self, policy):
        pass


class NoShadows(_Variant):
    """Chains D-cut cut away teach nothing."""

    def ablate(self, policy):
        pass

    def _shadow(self, req, chain, scores):
        pass


class NoAging(_Variant):
    """The calibration never forgets."""

    def ablate(self, policy):
        policy.forget = 1.0


VARIANTS = {"no-explore": NoExplore, "no-guard": NoGuard, "no-classes": NoClasses, "no-warmup": NoWarmup,
            "no-spec-term": NoSpecTerm, "timed-first-counts": TimedFirstCounts, "no-shadows": NoShadows,
            "no-aging": NoAging}
