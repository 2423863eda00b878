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
"""

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
