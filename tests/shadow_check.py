"""A proposer whose every verified draft is also a shadow (`RLDraftProposer._resolve_shadows`).

vLLM's rejection sampler accepts a draft up to its first rejected token and then emits a token
that differs from the rejected one (the residual distribution excludes a draft token without draft
probabilities; greedy emits the target's argmax), so matching a verified draft against the text
its request emitted next must give exactly vLLM's accepted count: `stats.shadow_accepted ==
stats.accepted_tokens` and `stats.shadow_tokens == stats.draft_tokens`, at any temperature. The
proposer shadows every chain it computes while its request holds no shadow; with every chain
verified whole (the fixed budget) a shadow resolves the step after it was sent, so every verified
draft is one. Used by tests/test_vllm.py (in vLLM, as `shadow_check.ShadowChecked`) and
tests/test_vllm_units.py (replayed).
"""

from rollout_graft.vllm.config import ChainConfig
from rollout_graft.vllm.proposer import RLDraftProposer


class ShadowChecked(RLDraftProposer):
    config = ChainConfig(budget_policy="fixed")
