"""Fitting Graft's pruning thresholds τ from a warm-up rollout (method "graft").

`calibrate` runs the engine, so it lives here, above both the engine and the proposer: the
proposer (`proposers/graft.py`) only fits τ from what a run showed it (`GraftProposer.calibrate`).
"""

from __future__ import annotations

from pathlib import Path

from .config import SamplingParams
from .engine import RolloutEngine
from .proposers.graft import GraftProposer
from .pruning import CalibrationObjective


def calibrate(engine: RolloutEngine, prompts: list[list[int]], params: SamplingParams | None = None, path: str | Path | None = None,
              objective: CalibrationObjective = "accepted") -> tuple[float, ...]:
    """`GraftProposer.calibrate` for a `RolloutEngine` built with method "graft", with a warm-up
    rollout of `engine` over `prompts` (rows, as `generate` takes them); saves τ as JSON at `path`."""
    if not isinstance(engine.proposer, GraftProposer):
        raise ValueError("calibrate() needs an engine built with EngineConfig(method='graft')")
    return engine.proposer.calibrate(lambda: engine.generate(prompts, params or SamplingParams()), objective, path)
