"""`GraftConfig(backend="vllm")`: TRL's own vLLM colocate path with our proposer switched on.

TRL 1.16 builds `vllm.LLM(...)` inside `VLLMGeneration._init_vllm` with a fixed set of
arguments. `GraftVLLMGeneration` is that class with two changes and nothing copied:

- `_init_vllm` runs TRL's code with `speculative_config` (our `RLDraftProposer`, built by
  `rollout_graft.vllm.speculative_config`) added to the `LLM(...)` call;
- `sync_weights` on vLLM's CPU backend loads the policy's weights with the model runner's
  `reload_weights` (the CPU backend repacks its layers after loading, so TRL's per-parameter
  `model.load_weights` fails there: "'Parameter' object has no attribute 'weight_loader'");
  on GPUs it is TRL's own.

`VLLMRolloutMetrics` turns vLLM's spec-decode counters and the proposer's summary into the
per-rollout metrics our engine logs.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import trl.generation.vllm_generation as trl_vllm
from trl.generation.vllm_generation import VLLMGeneration

from rollout_graft.vllm import proposer_summary

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


class GraftVLLMGeneration(VLLMGeneration):
    """TRL's `VLLMGeneration` (colocate) whose engine runs our proposer."""

    speculative_config: dict | None = None  # set by `with_speculative_config`

    @classmethod
    def with_speculative_config(cls, speculative_config: dict) -> type["GraftVLLMGeneration"]:
        return type(cls.__name__, (cls,), {"speculative_config": speculative_config})

    def _init_vllm(self):
        if self.mode != "colocate":
            raise ValueError("GraftConfig(backend='vllm') runs TRL's colocate mode (vllm_mode='colocate'); with "
                             "`trl vllm-serve`, pass our proposer as --speculative_config instead (README)")
        original = trl_vllm.LLM
        trl_vllm.LLM = functools.partial(original, speculative_config=self.speculative_config, disable_log_stats=False)
        try:
            super()._init_vllm()
        finally:
            trl_vllm.LLM = original

    def sync_weights(self):
        from vllm.platforms import current_platform

        if self.mode != "colocate" or not current_platform.is_cpu():
            return super().sync_weights()
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner  # as TRL reaches it
        runner.reload_weights(weights_iterator=self._iter_named_params(), is_checkpoint_format=True)
        self.llm.reset_prefix_cache()


@dataclass
class VLLMRolloutMetrics:
    """Differences of vLLM's counters and the proposer's summary between two rollouts."""

    llm: object
    speculative: bool = True  # our proposer runs (method "retrieval"); else plain vLLM
    last: dict | None = None

    def snapshot(self) -> dict:
        counters = {m.name: m.value for m in self.llm.get_metrics() if m.name in SPEC_COUNTERS}
        summary = proposer_summary(self.llm) if self.speculative else {"policy": "plain vLLM (method 'ar')"}
        return {**counters, **{k: v for k, v in summary.items() if isinstance(v, (int, float))},
                "policy": summary["policy"], "time": time.perf_counter()}

    def rollout(self, emitted_tokens: int, seconds: float) -> dict[str, float]:
        """Metrics of the rollout that ended now (our engine's names)."""
        now = self.snapshot()
        last = self.last or {k: 0 for k in now}
        self.last = now
        d = {k: now[k] - last.get(k, 0) for k in now if isinstance(now[k], (int, float))}
        rows = max(d.get("rows", 0), 1)
        drafted = d.get("vllm:spec_decode_num_draft_tokens", 0)
        return {
            "rollout/tokens_per_s": emitted_tokens / max(seconds, 1e-9),
            "rollout/mean_accepted_tokens": 1.0 + d.get("vllm:spec_decode_num_accepted_tokens", 0) / rows,
            "rollout/draft_tokens_per_step": drafted / rows,
            "rollout/accept_rate": d.get("vllm:spec_decode_num_accepted_tokens", 0) / drafted if drafted else 0.0,
            "rollout/budget_ratio": d.get("kept_tokens", 0) / d["proposed_tokens"] if d.get("proposed_tokens") else 0.0,
            "rollout/drafted_share": d.get("drafts", 0) / rows,  # request-steps that verified a draft
            "rollout/seconds": seconds,
        }

    def policy(self) -> str:
        """Why the budget policy verifies what it verifies (the recipe's summary prints it)."""
        return proposer_summary(self.llm)["policy"] if self.speculative else "plain vLLM (method 'ar')"
