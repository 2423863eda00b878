"""`RooflineDCut`: our proposer with D-cut started from a roofline, as on a GPU with a preset
(`RLDraftProposer.load_model` on CUDA: `profile.start_profile`), here on vLLM's CPU backend, where
`start_profile` gives none. The H200's roofline for Qwen3-8B is memory-bound at these batches, so
D-cut drafts from its first step: the profiled D-cut's whole path (its profile read every step at
the running rows' mean context, its steady and recent calibrations) inside vLLM. Used by
tests/test_vllm.py (through tests/vllm_run.py's "roofline" spec)."""

from rollout_graft.vllm.proposer import RLDraftProposer
from rollout_graft_tools.clocks import ACCELERATORS, MODELS, Roofline


class RooflineDCut(RLDraftProposer):
    def load_model(self, model=None, *args, **kwargs) -> None:
        super().load_model(model, *args, **kwargs)
        self.use_profile(Roofline(ACCELERATORS["H200"], MODELS["Qwen3-8B"]))
        self.profile_note = "the H200's roofline for Qwen3-8B (tests/roofline_proposer.py)"
