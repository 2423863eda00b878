"""rollout_graft: lossless speculative rollouts for GRPO training."""

from .config import DCutConfig, DraftConfig, EngineConfig, RetrievalConfig, SamplingParams
from .engine import RolloutEngine, RolloutOutput
from .proposers.graft import calibrate
from .stats import RolloutStats

__all__ = ["DCutConfig", "DraftConfig", "EngineConfig", "RetrievalConfig", "RolloutEngine", "RolloutOutput", "RolloutStats",
           "SamplingParams", "calibrate"]
__version__ = "0.1.0"
