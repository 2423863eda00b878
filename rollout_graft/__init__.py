"""rollout_graft: lossless speculative rollouts for GRPO training.

The exports below are imported on first use (module `__getattr__`): `import rollout_graft.vllm...`
in vLLM's worker then loads none of the engine (`engine` → transformers).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "calibrate": "calibration",
    "DCutConfig": "config",
    "DraftConfig": "config",
    "EngineConfig": "config",
    "RetrievalConfig": "config",
    "SamplingParams": "config",
    "RolloutEngine": "engine",
    "RolloutOutput": "engine",
    "RolloutStats": "stats",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
