"""Proposers that draft nothing: the floors our proposer is measured against (benchmarks, tests).

vLLM builds a `custom_class` proposer from a class path that must import in its worker process, so
these live in the installed lab library (not in a script or a test module that only one caller can
import).
`EmptyProposer` is vLLM's speculative decoding with every draft empty, as vLLM ships it (it still
builds speculative metadata and runs its rejection sampler each step); `PlainEmptyProposer` adds
our plugin's plain path for steps where no request drafted (`plugin.plain_when_undrafted`, which
`RLDraftProposer` has): the floor of our proposer when D-cut decodes plainly.
"""

from __future__ import annotations


class EmptyProposer:
    """Drafts nothing; `counts` are the spec-decode counters (always 0), as an oracle's are read."""

    def __init__(self, vllm_config):
        self.counts = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's CPU runner hands every drafter the target model; none is needed."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        return [[] for _ in sampled_token_ids]


class PlainEmptyProposer(EmptyProposer):
    """`EmptyProposer` with our plugin's plain path for undrafted steps."""

    plain_when_undrafted = True

    def __init__(self, vllm_config):
        from rollout_graft.vllm import plugin

        super().__init__(vllm_config)
        plugin.apply()
