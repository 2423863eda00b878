"""TRL integration: `GraftGRPOTrainer` (a `GRPOTrainer` whose rollouts come from rollout_graft's
engine) and `GraftConfig` (its engine settings, parsed next to `GRPOConfig`)."""

from .config import GraftConfig
from .grpo import GraftGRPOTrainer

__all__ = ["GraftConfig", "GraftGRPOTrainer"]
