"""`GraftConfig(backend="vllm")`: TRL's own vLLM colocate path with our proposer switched on.

TRL 1.16 builds `vllm.LLM(...)` inside `VLLMGeneration._init_vllm` with a fixed set of
arguments. `GraftVLLMGeneration` is that class with two changes and nothing copied:

- `_init_vllm` runs TRL's code with `speculative_config` added to the `LLM(...)` call: our
  `RLDraftProposer` (`rollout_graft.vllm.speculative_config`), vLLM's own suffix or ngram drafter
  (`rollout_graft.vllm.vllm_speculative_config`), or none (`GraftConfig.speculative_config`); on
  vLLM's CPU backend also the policy's own dtype (its "auto" runs a float32 model in bfloat16 on a
  CPU with bf16 units, so the rollouts would sample another model than the one being trained);
- `sync_weights` on vLLM's CPU backend loads the policy's weights with the model runner's
  `reload_weights` (the CPU backend repacks its layers after loading, so TRL's per-parameter
  `model.load_weights` fails there: "'Parameter' object has no attribute 'weight_loader'");
  on GPUs it is TRL's own.

`VLLMRolloutMetrics` turns vLLM's spec-decode counters (and our proposer's summary) into the
per-rollout metrics our engine logs; the weight sync before a rollout is timed apart
(`rollout/sync_seconds`), so `rollout/seconds` and tokens/s are generation alone on both backends.
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
    """TRL's `VLLMGeneration` (colocate) whose engine drafts with `speculative_config`."""

    speculative_config: dict | None = None  # set by `with_speculative_config`; None: plain vLLM
    sync_seconds: float = 0.0  # time spent in `sync_weights` so far (the trainer logs it apart from generation)

    @classmethod
    def with_speculative_config(cls, speculative_config: dict | None) -> type["GraftVLLMGeneration"]:
        return type(cls.__name__, (cls,), {"speculative_config": speculative_config})

    def _init_vllm(self):
        if self.mode != "colocate":
            raise ValueError("GraftConfig(backend='vllm') runs TRL's colocate mode (vllm_mode='colocate'); with "
                             "`trl vllm-serve`, pass our proposer as --speculative_config instead (README)")
        from vllm.platforms import current_platform

        extra = {}
        if current_platform.is_cpu():
            # vLLM's "auto" dtype runs a float32 policy in bfloat16 on a CPU with bf16 units: the rollouts
            # would sample another model than the one trained. On a CPU, rollouts run the policy's own dtype.
            extra["dtype"] = next(self.model.parameters()).dtype
        original = trl_vllm.LLM
        trl_vllm.LLM = functools.partial(original, speculative_config=self.speculative_config, disable_log_stats=False,
                                         **extra)
        try:
            super()._init_vllm()
        finally:
            trl_vllm.LLM = original

    def sync_weights(self):
        start = time.perf_counter()
        try:
            self._sync_weights()
        finally:
            self.sync_seconds += time.perf_counter() - start

    def _sync_weights(self):
        from vllm.platforms import current_platform

        if self.mode != "colocate" or not current_platform.is_cpu():
            return super().sync_weights()
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner  # as TRL reaches it
        runner.reload_weights(weights_iterator=self._iter_named_params(), is_checkpoint_format=True)
        self.llm.reset_prefix_cache()


@dataclass
class VLLMRolloutMetrics:
    """Per-rollout metrics (our engine's names) from differences of vLLM's spec-decode counters, for
    every draft method, and of our proposer's summary (method "retrieval" only) between two rollouts.

    A request-step emits its accepted draft tokens plus one sampled token, so a rollout of E emitted
    tokens with A accepted took E − A request-steps and MAT = E / (E − A) (1.0 for plain vLLM)."""

    llm: object
    method: str = "retrieval"  # `GraftConfig.method` (backend "vllm")
    last: dict | None = None

    @property
    def ours(self) -> bool:
        return self.method == "retrieval"

    def snapshot(self) -> dict:
        counters = {m.name: m.value for m in self.llm.get_metrics() if m.name in SPEC_COUNTERS}
        summary = proposer_summary(self.llm) if self.ours else {}
        return {**counters, **{k: v for k, v in summary.items() if isinstance(v, (int, float))},
                "time": time.perf_counter()}

    def rollout(self, emitted_tokens: int, seconds: float, sync_seconds: float = 0.0) -> dict[str, float]:
        """Metrics of the rollout that ended now: `seconds` of generation (tokens/s over them, as our
        engine's rollouts are timed) and, apart, the `sync_seconds` TRL's weight sync to vLLM took."""
        now = self.snapshot()
        last = self.last or {k: 0 for k in now}
        self.last = now
        d = {k: now[k] - last.get(k, 0) for k in now}
        accepted = d.get("vllm:spec_decode_num_accepted_tokens", 0)
        drafted = d.get("vllm:spec_decode_num_draft_tokens", 0)
        drafts = d.get("vllm:spec_decode_num_drafts", 0)
        # request-steps: vLLM counts tokens it accepted past max_tokens, which the returned completions
        # cut off, so emitted - accepted may fall short; a request-step verifies at most one draft
        steps = max(emitted_tokens - accepted, drafts, 1)
        metrics = {
            "rollout/tokens_per_s": emitted_tokens / max(seconds, 1e-9),
            "rollout/mean_accepted_tokens": emitted_tokens / steps,
            "rollout/draft_tokens_per_step": drafted / steps,
            "rollout/accept_rate": accepted / drafted if drafted else 0.0,
            "rollout/drafted_share": drafts / steps,  # request-steps that verified a draft
            "rollout/seconds": seconds,
            "rollout/sync_seconds": sync_seconds,
        }
        if self.ours:  # the share of found draft tokens that D-cut kept (1.0 for a fixed budget)
            metrics["rollout/budget_ratio"] = d["kept_tokens"] / d["proposed_tokens"] if d.get("proposed_tokens") else 0.0
            metrics["rollout/proposer_tables_mb"] = now.get("tables_mb", 0.0)  # its host memory now (the prior's included)
        return metrics

    def policy(self) -> str:
        """Why the budget policy verifies what it verifies (the recipe's summary prints it)."""
        if self.ours:
            return proposer_summary(self.llm)["policy"]
        return "plain vLLM (method 'ar')" if self.method == "ar" else f"vLLM's {self.method} drafts, no budget policy"
