"""A proposer whose every verified draft is also kept as a shadow (`RLDraftProposer._resolve_shadows`).

vLLM's rejection sampler accepts a draft up to its first rejected token and then emits a token
that differs from the rejected one (the residual distribution excludes a draft token without draft
probabilities; greedy emits the target's argmax), so matching a verified draft against the text
its request emitted next must give exactly vLLM's accepted count: `stats.shadow_accepted ==
stats.accepted_tokens` and `stats.shadow_tokens == stats.draft_tokens`, at any temperature. Used
by tests/test_vllm.py (in vLLM, as `shadow_check.ShadowChecked`) and tests/test_vllm_units.py
(replayed).
"""

from rollout_graft.vllm.config import ChainConfig
from rollout_graft.vllm.proposer import RLDraftProposer


class ShadowChecked(RLDraftProposer):
    config = ChainConfig(budget_policy="fixed")

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        out = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        for req in self.tracker.live.values():  # this step's requests
            if req.draft:  # sent: its shadow resolves as vLLM verifies it
                self._shadow(req, list(req.draft), req.draft_scores)
        return out
