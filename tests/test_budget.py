"""D-cut: global top-K selection, ancestor closure, ρ choice from a hand-made cost table."""

import pytest
import torch
from conftest import random_model

from rollout_graft import EngineConfig, RolloutEngine, SamplingParams
from rollout_graft.budget import DCut, ScoreCalibration, keep_top
from rollout_graft.cost import CostModel
from rollout_graft.tree import Draft


def draft_with_scores(trees):
    """trees: per row, list of (parent, score); tokens are 10 + node index."""
    d = Draft.from_lists([[(10 + i, p) for i, (p, _) in enumerate(t)] for t in trees])
    for r, t in enumerate(trees):
        for i, (_, s) in enumerate(t):
            d.score[r, i] = s
    return d


# row 0: a confident chain; row 1: a poor bushy tree
TREES = [
    [(-1, 0.9), (0, 0.8), (1, 0.7), (2, 0.5)],
    [(-1, 0.3), (-1, 0.2), (0, 0.1), (1, 0.05)],
]


def test_global_top_k_moves_budget_to_the_good_row():
    kept = keep_top(draft_with_scores(TREES), keep=5)
    # top-5 scores: .9 .8 .7 .5 (row 0, whole chain) and .3 (row 1, node 0)
    assert kept.valid.tolist() == [[True, True, True, True], [True, False, False, False]]


def test_cut_is_ancestor_closed_even_with_ties():
    # the child ties with its parent; the parent's sibling would be picked first by index
    trees = [[(-1, 0.5), (-1, 0.5), (1, 0.5)]]
    kept = keep_top(draft_with_scores(trees), keep=2)
    v = kept.valid[0].tolist()
    assert v[2] is False or v[1] is True  # never a child without its parent
    kept.compacted().validate()


def test_rho_choice_follows_the_cost_table():
    d = draft_with_scores(TREES)  # 8 candidates, calibrated scores ≈ raw
    flat = CostModel([1, 2, 64], [1, 2, 4, 8], [[1.0] * 4, [1.0] * 4, [1.0] * 4])  # verification is free
    steep = CostModel([1, 2, 64], [1, 2, 4, 8], [[1.0, 2.0, 4.0, 8.0]] * 3)  # cost ∝ tokens
    free, _ = DCut(flat, (0.25, 0.5, 1.0), explore_every=0).decide(d)
    assert int(free.valid.sum()) == 8  # keep everything: more tokens for the same time
    dcut = DCut(steep, (0.25, 0.5, 1.0), explore_every=0)
    dcut.calibration.prior_weight = 1e9  # trust the raw scores (no observations)
    cut, decision = dcut.decide(d)
    # rows=2: ρ=0 → 2 / cost(2,1)=2.0 ; ρ=.25 → (2+.9+.8) / cost(2,2)=1.85 ; ρ=.5 → (2+2.9)/cost(2,3)=1.63
    assert decision.ratio == 0.0 and int(cut.valid.sum()) == 0


def test_calibration_learns_acceptance_rates():
    cal = ScoreCalibration(prior_weight=1.0)
    score = torch.full((1, 100), 0.1)
    accepted = torch.zeros(1, 100, dtype=torch.bool)
    accepted[0, :90] = True  # nodes scored 0.1 are accepted 90% of the time
    cal.observe(score, torch.ones_like(accepted), accepted)
    assert cal(torch.tensor([0.1])).item() == pytest.approx(0.9, abs=0.02)
    assert cal(torch.tensor([0.5])).item() >= cal(torch.tensor([0.1])).item()  # monotone


def test_dcut_is_lossless_and_logs_decisions(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLOUT_GRAFT_CACHE", str(tmp_path))
    model = random_model("qwen3")
    prompts = [[5, 6, 7]] * 4 + [[9, 9]] * 4
    params = SamplingParams(temperature=0, max_new_tokens=30)
    ar = RolloutEngine(model).generate(prompts, params)
    engine = RolloutEngine(model, EngineConfig(method="retrieval", budget=20, budget_policy="dcut"))
    out = engine.generate(prompts, params)
    assert out.completion_ids == ar.completion_ids
    assert len(out.stats.budget_trace) == out.stats.target_forwards
    assert out.stats.budget_ratio is not None
    assert list(tmp_path.glob("cost/*.json"))  # the profile is cached on disk
