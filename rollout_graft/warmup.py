"""Warm the global adjacency prior: a few rounds of generation over prompts that are not the
evaluation prompts (DESIGN.md §3; Graft warms on ~5 rounds of chat data)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .config import EngineConfig, RetrievalConfig, SamplingParams
from .engine import RolloutEngine


def warm_prior(model, prompts: list[list[int]], path: str | Path, rounds: int = 5, group: int = 8,
               params: SamplingParams | None = None, retrieval: RetrievalConfig | None = None, tokenizer=None,
               budget: int = 60) -> Path:
    """Generate `rounds` × (each prompt × `group`) with method "retrieval" and save the prior it learned.

    budget: retrieval nodes per sequence and step while warming (every verified node teaches the
    prior; on a large model on CPU a small budget keeps the warm-up affordable)."""
    params = params or SamplingParams(temperature=1.0, max_new_tokens=256)
    cfg = EngineConfig(method="retrieval", budget=budget,
                       retrieval=replace(retrieval or RetrievalConfig(), update_prior=True))
    engine = RolloutEngine(model, cfg, tokenizer=tokenizer)
    for r in range(rounds):
        engine.generate([p for p in prompts for _ in range(group)], replace(params, seed=10_000 + r))
    engine.proposer.save_prior(path)
    return Path(path)
