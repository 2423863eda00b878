"""rollout_graft: lossless speculative rollouts for GRPO training."""

from .config import EngineConfig, RetrievalConfig, SamplingParams
from .engine import RolloutEngine, RolloutOutput
from .stats import RolloutStats

__all__ = ["EngineConfig", "RetrievalConfig", "RolloutEngine", "RolloutOutput", "RolloutStats", "SamplingParams"]
__version__ = "0.1.0"
