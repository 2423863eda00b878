"""TRL integration: `GraftGRPOTrainer` (a `GRPOTrainer` whose rollouts come from rollout_graft's
engine), `GraftConfig` (its engine settings, parsed next to `GRPOConfig`) and `ResumableGRPOTrainer`
(TRL's `GRPOTrainer` whose resumed runs repeat the uninterrupted run; `GraftGRPOTrainer` is one)."""

from .config import GraftConfig
from .grpo import GraftGRPOTrainer
from .resume import ResumableGRPOTrainer

__all__ = ["GraftConfig", "GraftGRPOTrainer", "ResumableGRPOTrainer"]
