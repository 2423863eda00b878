"""A proposer whose every verified draft is also a shadow (`RLDraftProposer._resolve_shadows`).

vLLM's rejection sampler accepts a draft up to its first rejected token and then emits a token
that differs from the rejected one (the residual distribution excludes a draft token without draft
probabilities; greedy emits the target's argmax), so matching a verified draft against the text
its request emitted next must give exactly vLLM's accepted count: `stats.shadow_accepted ==
stats.accepted_tokens` and `stats.shadow_tokens == stats.draft_tokens`, at any temperature. The
proposer shadows every chain it computes for a policy that learns (`ChainPolicy.learns`) while its
request holds no shadow; with every chain verified whole (a fixed depth that learns) a shadow
resolves the step after it was sent, so every verified draft is one. Used by tests/test_vllm.py (in
vLLM, as `shadow_check.ShadowChecked`) and tests/test_vllm_units.py (replayed).

`QuietChecked`, used by tests/test_vllm.py too: a proposer drafting in spells (2 steps in 7), whose
quiet steps (`RequestTracker.defer`: the step's tokens read from vLLM's `token_ids_cpu`, not from
its lists) are checked against the tokens vLLM handed over in its lists.
"""

import numpy as np

from rollout_graft.dcut.chains import FixedDepth
from rollout_graft.vllm.config import ChainConfig
from rollout_graft.vllm.proposer import RLDraftProposer


class LearningFixedDepth(FixedDepth):
    """Every chain whole, as a policy that learns from what drafts earn (so shadows are kept)."""

    learns = True


class ShadowChecked(RLDraftProposer):
    config = ChainConfig(budget_policy="fixed")

    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        self.policy = LearningFixedDepth(self.k)


class Spells(FixedDepth):
    """Every chain whole 2 steps in 7, none in the others (`drafts_next` says which)."""

    def __init__(self, depth: int):
        super().__init__(depth)
        self.n = 0

    def plan(self, rows: int) -> int:
        self.n += 1
        return self.depth if self.n % 7 < 2 else 0

    def drafts_next(self, rows: int) -> bool:
        return (self.n + 1) % 7 < 2


class QuietChecked(RLDraftProposer):
    """Counts its quiet steps and those whose texts differ from what vLLM sampled (`summary`)."""

    config = ChainConfig(budget_policy="fixed")

    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        self.policy = Spells(self.k)
        self.quiet_steps = self.quiet_mismatches = 0
        defer = self.tracker.defer

        def checked(ids, sampled, num_tokens, token_ids):
            quiet = defer(ids, sampled, num_tokens, token_ids)
            if quiet:
                t = self.tracker
                self.quiet_steps += 1
                for j, (slot, end) in enumerate(zip(t.slots.tolist(), t.num.tolist())):
                    got = t.texts[t.row_of[slot], end - len(sampled[j]) : end]
                    self.quiet_mismatches += int(not np.array_equal(got, sampled[j]))
            return quiet
        self.tracker.defer = checked

    def summary(self) -> dict:
        return {**super().summary(), "quiet_steps": self.quiet_steps, "quiet_mismatches": self.quiet_mismatches}
