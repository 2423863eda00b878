"""rollout_graft: lossless speculative rollouts for GRPO training."""

from .calibration import calibrate
from .config import DCutConfig, DraftConfig, EngineConfig, RetrievalConfig, SamplingParams
from .engine import RolloutEngine, RolloutOutput
from .stats import RolloutStats

__all__ = ["DCutConfig", "DraftConfig", "EngineConfig", "RetrievalConfig", "RolloutEngine", "RolloutOutput", "RolloutStats",
           "SamplingParams", "calibrate"]
__version__ = "0.1.0"
