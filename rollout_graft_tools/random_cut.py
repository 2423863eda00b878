"""A chain proposer whose budget policy cuts at random (`lab/vllm_step_cost.py`): vLLM's step time
measured against the draft tokens it verifies. vLLM imports the proposer by its dotted name
(`rollout_graft_tools.random_cut.RandomCutProposer`), so it lives in the library."""

from __future__ import annotations

import random

import numpy as np

from rollout_graft.dcut.core import BudgetDecision
from rollout_graft.vllm.proposer import RLDraftProposer

STEPS: list[tuple[int, int, float, int, int]] = []  # rows, draft tokens, ms, rows that drafted, deepest chain


class RandomCut:
    """Cuts each step's chains to a random depth for a random share of the rows; records the steps."""

    learns = False  # `ChainPolicy.learns`

    def __init__(self, depth: int):
        self.depth, self.rng, self.cut_to, self.share = depth, random.Random(0), 0, 1.0

    def plan(self, rows: int) -> int:
        self.cut_to = self.rng.choice([0, 0, 1, 2, 4, 8])
        self.share = self.rng.choice([0.25, 0.5, 1.0])
        return min(self.cut_to, self.depth)

    def cut(self, tokens, scores):
        depths = np.minimum((scores > 0).sum(1), self.cut_to)
        depths[max(1, round(self.share * len(depths))):] = 0
        return depths, BudgetDecision(1.0)

    def observe(self, step) -> None:
        if step.ms is not None:
            drafted = step.verified[1] if step.verified is not None else np.zeros(0, dtype=int)
            STEPS.append((step.rows, step.drafted, step.ms, len(drafted), int(drafted.max(initial=0))))

    def explain(self) -> str:
        return "random cuts (lab/vllm_step_cost.py)"


class RandomCutProposer(RLDraftProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        self.policy = RandomCut(self.k)


def steps_of(worker) -> list:
    """The steps recorded in a vLLM worker's process (`llm.collective_rpc(steps_of)`)."""
    return list(STEPS)
