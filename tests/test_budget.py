"""D-cut: per-row top-W selection, ancestor closure, width choice from hand-made cost tables and overhead."""

from dataclasses import replace

import pytest
import torch
from conftest import draft_with_scores, random_model

from rollout_graft import DCutConfig, EngineConfig, RetrievalConfig, RolloutEngine, SamplingParams
from rollout_graft.budget import PROBE_SHARE, DCut, OverheadModel, ScoreCalibration
from rollout_graft.cost import CostModel
from rollout_graft.tree import Draft


# row 0: a confident chain; row 1: a poor bushy tree
TREES = [
    [(-1, 0.9), (0, 0.8), (1, 0.7), (2, 0.5)],
    [(-1, 0.3), (-1, 0.2), (0, 0.1), (1, 0.05)],
]


def trusting(cost, ratios=(0.25, 0.5, 1.0), **config) -> DCut:
    """D-cut that trusts the raw scores (no observations yet), past the slow start."""
    config = {"explore_every": 0, "calibration_prior": 1e9, "slow_start": False, **config}
    return DCut(cost, 4, DCutConfig(ratios=ratios, **config))


def test_width_choice_follows_the_cost_table():
    d = draft_with_scores(TREES)  # m = 4 → widths W ∈ {0, 1, 2, 4} for ρ ∈ {0, .25, .5, 1}
    flat = CostModel([1, 2, 64], [1, 2, 4, 8], [[1.0] * 4] * 3)  # verification is free
    free, decision = trusting(flat).decide(d)
    assert int(free.valid.sum()) == 8 and decision.ratio == 1.0  # more tokens for the same time
    steep = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 2.0, 3.0, 5.0]] * 3)  # cost ∝ tokens per row
    cut, decision = trusting(steep).decide(d)
    # rows=2: W=0 → 2/cost(2,1)=2.0 ; W=1 → (2+.9+.3)/cost(2,2)=1.6 ; W=2 → (2+.9+.8+.3+.2)/3=1.4
    assert decision.ratio == 0.0 and int(cut.valid.sum()) == 0
    knee = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 1.2, 2.0, 4.0]] * 3)  # one extra token is cheap
    cut, decision = trusting(knee).decide(d)
    # W=0 → 2.0 ; W=1 → 3.2/1.2 = 2.67 ; W=2 → 4.2/2 = 2.1 ; W=4 → 5.55/4 = 1.39
    assert decision.ratio == 0.25 and decision.kept == 2 and decision.candidates == 8
    assert cut.valid.tolist() == [[True], [True]] and cut.tokens.tolist() == [[10], [10]]


def test_leaving_plain_decoding_needs_a_margin():
    # rows=2, m=4; the scores 0.9 and 0.3 calibrate (no observations yet) to 0.75 and 0.237:
    # W=0 → 2/1 = 2.0 ; W=1 → (2 + 0.987)/cost(2,2) ; wider widths cost 3 and 5 and lose
    slight = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 1.42, 3.0, 5.0]] * 3)  # W=1: 2.10, 5 % better than plain
    clear = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 1.2, 3.0, 5.0]] * 3)  # W=1: 2.49, 24 % better
    assert trusting(slight).decide(draft_with_scores(TREES))[1].ratio == 0.25  # speculating: stays
    poor = draft_with_scores([[(-1, 0.01)] * 4] * 2)
    after_plain = trusting(slight)
    assert after_plain.decide(poor)[1].ratio == 0.0  # the last decision was plain decoding
    assert after_plain.decide(draft_with_scores(TREES))[1].ratio == 0.0  # 5 % does not pay the switch
    after_plain = trusting(clear)
    assert after_plain.decide(poor)[1].ratio == 0.0
    assert after_plain.decide(draft_with_scores(TREES))[1].ratio == 0.25


def test_measured_forwards_correct_the_profiled_table():
    knee = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 1.2, 2.0, 4.0]] * 3)
    dcut = trusting(knee)
    assert dcut.decide(draft_with_scores(TREES))[1].ratio == 0.25  # W=1: 2.99 / 1.2 = 2.49 > 2.0 plain
    for _ in range(200):  # the rollout's own wide forwards take twice the profiled time; plain ones as profiled
        dcut.observe_forward(2, 2.0, 2.4)
        dcut.observe_forward(2, 1.0, 1.0)
    assert dcut.forward_scale == pytest.approx([1.0, 2.0], rel=0.01)
    assert dcut.forward_ms(2, 2.0) == pytest.approx(2.4, rel=0.01)
    assert dcut.decide(draft_with_scores(TREES))[1].ratio == 0.0  # W=1: 2.99 / 2.4 < 2.0
    # a probe during a slow spell of the machine (3× everything), then plain steps at normal speed:
    # the spell passes mostly into the load scale, which the plain steps bring back: wide forwards are
    # priced 2.15× (one scale of their own would keep 0.9·2 + 0.1·6 = 2.4× until the next probe)
    dcut.observe_forward(2, 2.0, 3 * 2.4)
    for _ in range(30):
        dcut.observe_forward(2, 1.0, 1.0)
    assert dcut.forward_scale == pytest.approx([1.0, 2.15], rel=0.01)


def test_an_overhead_measured_in_a_slow_spell_is_priced_at_the_machines_speed_now():
    flat = CostModel([1, 2, 64], [1, 2, 4, 8], [[1.0] * 4] * 3)
    dcut = trusting(flat)
    for _ in range(50):  # a slow spell: forwards take 2× the profiled time, a tree 4 ms
        dcut.observe_forward(2, 1.0, 2.0)
    dcut.observe_overhead(2, 4.0, width=4)
    assert dcut.overhead_ms(2, 4) == pytest.approx(4.0)
    for _ in range(50):  # the spell passes: plain forwards as profiled (no tree measured meanwhile)
        dcut.observe_forward(2, 1.0, 1.0)
    assert dcut.overhead_ms(2, 4) == pytest.approx(2.0, rel=0.02)  # the tree is priced at today's speed


def test_width_follows_the_batch_size_as_it_drains():
    # speculation pays at 2 rows (the forward is latency-bound) but not at 64 (compute-bound)
    cost = CostModel([2, 64], [1, 2, 3, 5], [[1.0, 1.05, 1.1, 1.2], [1.0, 2.0, 3.0, 5.0]])
    dcut = trusting(cost)
    _, small = dcut.decide(draft_with_scores(TREES))
    _, large = dcut.decide(draft_with_scores(TREES * 32))
    assert small.ratio == 1.0 and large.ratio == 0.0


def test_slow_start_doubles_the_width():
    flat = CostModel([1, 2, 64], [1, 2, 4, 8], [[1.0] * 4] * 3)  # the widest tree would win at once
    dcut = DCut(flat, 8, DCutConfig(ratios=(0.25, 0.5, 1.0), explore_every=0))  # m = 4 → W ∈ {1, 2, 4}
    assert [dcut.decide(draft_with_scores(TREES))[1].kept for _ in range(4)] == [2, 4, 8, 8]  # W = 1, 2, 4, 4


def test_proposal_budget_follows_the_slow_start_cap():
    flat = CostModel([1, 2, 64], [1, 2, 4, 8], [[1.0] * 4] * 3)
    dcut = DCut(flat, 8, DCutConfig(ratios=(0.25, 0.5, 1.0), explore_every=0))  # budget 8 → W ∈ {0, 2, 4, 8}
    assert dcut.proposal_budget(8, 2) == 2  # nothing wider than the cap (the smallest width) can be chosen
    assert dcut.decide(draft_with_scores(TREES), 8)[1].kept == 4  # a 4-node draft: W = 2 per row, the cap binds
    assert dcut.proposal_budget(8, 2) == 4  # the cap doubled
    assert dcut.proposal_budget(8, 3) == 4  # 2 and 3 rows: one batch-size class
    assert dcut.proposal_budget(8, 4) == 2  # another class starts from the smallest width
    dcut.rows_class(2).cap = 1 << 20
    assert dcut.proposal_budget(8, 2) == 8  # never above the budget


def test_overhead_is_charged_to_speculation():
    model = OverheadModel()
    for rows, ms in [(1, 3.0), (4, 6.0), (16, 18.0)]:
        model.observe(rows, ms)
    assert model.predict(8) == pytest.approx(10.0, rel=1e-6)  # fits 2 + 1·rows exactly
    tail = OverheadModel()  # measured on a drained batch's tail only, the fit falls with the rows
    for rows, ms in [(1, 4.0), (2, 3.0), (3, 2.0)]:
        tail.observe(rows, ms)
    assert tail.predict(2) == pytest.approx(3.0)
    assert tail.predict(60) == pytest.approx(40.0)  # past 3 rows: at least proportional (2 ms × 60/3)
    flat = CostModel([1, 2, 64], [1, 2, 4, 8], [[1.0] * 4] * 3)
    dcut = trusting(flat)
    dcut.observe_overhead(2, 5.0)  # 5 ms of tree building + learning per step vs a 1 ms forward
    _, decision = dcut.decide(draft_with_scores(TREES))
    # W=0 → 2/1 ; W=4 → (2+3.75)/(1+5) < 2
    assert decision.ratio == 0.0


def test_overhead_is_measured_per_proposal_width():
    model = OverheadModel()
    model.observe(8, 10.0, width=2)
    assert model.predict(8, 8) == pytest.approx(40.0)  # one width seen: proportional (a drafter's levels)
    assert model.predict(8, 1) == pytest.approx(10.0)  # narrower than any seen: as the narrowest
    model.observe(8, 14.0, width=4)
    assert model.predict(8, 3) == pytest.approx(12.0)  # between two seen widths: interpolated
    assert model.predict(8, 8) == pytest.approx(22.0)  # above: the slope of the two widest, 2 ms per node
    model.observe(8, 14.0, width=8)  # saturated (the drafter's depth): flat from there on
    assert model.predict(8, 15) == pytest.approx(14.0)


# a chain of 8 nodes; its scores calibrate (no observations yet) to 0.75, 0.75, 0.42, 0.42, 0.133 × 4
CHAIN = [(-1, 0.9)] + [(i, s) for i, s in enumerate([0.8, 0.5, 0.4, 0.15, 0.14, 0.13, 0.12])]


def test_a_wide_tree_is_not_priced_like_a_narrow_probe():
    # budget 8 → W ∈ {0, 2, 4, 8}; forwards cost 1 ms at any width; a tree of width 2 was measured
    # at 1 ms beyond the forward (a probe), none wider yet
    flat = CostModel([1, 2, 64], [1, 2, 4, 9], [[1.0] * 4] * 3)
    dcut = DCut(flat, 8, DCutConfig(ratios=(0.25, 0.5, 1.0), explore_every=0, calibration_prior=1e9))
    dcut.rows_class(2).cap = 8  # the step proposed the whole budget
    dcut.observe_overhead(2, 1.0, width=2)
    _, decision = dcut.decide(draft_with_scores([CHAIN] * 2), 8)
    # W=0 → 2/1 = 2 ; W=2 → (2 + 2·1.5)/(1+1) = 2.5 ; W=4 → (2 + 2·2.34)/(1+2) = 2.23 ;
    # W=8 → (2 + 2·2.87)/(1+4) = 1.55: W=8's tree (extrapolated to 4 ms) does not pay. Priced like
    # the probe (1 ms), W=8 would win: 7.74/2 = 3.87
    assert decision.ratio == 0.25 and decision.kept == 4
    assert dcut.proposal_budget(8, 2) == 2  # the next step proposes no wider than it chose
    dcut.observe_overhead(2, 1.0, width=8)  # measured: the wide tree costs no more than the probe
    dcut.rows_class(2).cap = 8
    _, decision = dcut.decide(draft_with_scores([CHAIN] * 2), 8)
    assert decision.ratio == 1.0  # W=8 → 3.87 ; W=4 (interpolated: 1 ms) → 3.34
    poor = [[(-1, 1e-4)] + [(i, 1e-4) for i in range(7)]] * 2
    assert dcut.decide(draft_with_scores(poor), 8)[1].ratio == 0.0  # nothing worth verifying here
    assert dcut.proposal_budget(8, 2) == 8  # the probe after the back-off proposes the width that paid last


def test_a_growth_that_falls_back_waits_before_it_is_tried_again():
    flat = CostModel([1, 2, 64], [1, 2, 4, 9], [[1.0] * 4] * 3)
    dcut = DCut(flat, 8, DCutConfig(ratios=(0.25, 0.5, 1.0), explore_every=0, calibration_prior=1e9))  # W ∈ {0, 2, 4, 8}
    dcut.observe_overhead(2, 1.0, width=2)
    dcut.observe_overhead(2, 3.0, width=4)  # the tree of width 4 costs 3 ms
    narrow, wide = [CHAIN[:2]] * 2, [CHAIN[:2] + [(1, 0.3), (2, 0.2)]] * 2
    proposals = []
    for _ in range(9):
        p = dcut.proposal_budget(8, 2)
        proposals.append(p)
        dcut.decide(draft_with_scores(narrow if p == 2 else wide), 8)
    # W=2: (2 + 2·1.5)/(1+1) = 2.5 beats plain (2.0) and W=4: (2 + 2·1.97)/(1+3) = 1.49. Each growth to 4 falls
    # back to 2; the next waits 2, then 4 binding decisions at 2
    assert proposals == [2, 4, 2, 2, 2, 4, 2, 2, 2]
    assert dcut.rows_class(2).growth_wait == {2: 1} and dcut.rows_class(2).growth_fails == {2: 2}  # one more wait, then 4 again


def test_a_probe_proposes_wide_trees_where_they_cost_no_more():
    steep = CostModel([1, 2, 64], [1, 2, 3, 5, 9], [[1.0, 2.0, 3.0, 5.0, 9.0]] * 3)  # nothing pays: ρ = 0
    poor = draft_with_scores([CHAIN[:2]] * 2)

    def probe_width(overheads: dict[int, float]) -> int:
        dcut = DCut(steep, 8, DCutConfig(ratios=(0.25, 0.5, 1.0), explore_every=0))  # budget 8 → W ∈ {0, 2, 4, 8}
        for width, ms in overheads.items():
            dcut.observe_overhead(2, ms, width=width)
        assert dcut.decide(poor, 8)[1].ratio == 0.0
        return dcut.proposal_budget(8, 2)

    assert probe_width({2: 1.0}) == 2  # one width measured: wider trees are priced proportionally
    assert probe_width({2: 1.0, 4: 1.05}) == 8  # retrieval-like: ~flat (8 → 1.15 ms), the probe proposes the whole budget
    assert probe_width({2: 1.0, 4: 2.0}) == 2  # drafter-like: a wider tree costs more, the probe stays narrow


def test_backoff_doubles_and_is_kept_per_batch_size():
    steep = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 2.0, 3.0, 5.0]] * 3)  # a plain step: 1 ms; speculation never pays

    def backoffs(decisions: int = 12, **config) -> tuple[DCut, list[int]]:
        dcut, trace = trusting(steep, **config), []
        for _ in range(decisions):
            assert dcut.decide(draft_with_scores(TREES))[1].ratio == 0.0
            trace.append(dcut.rows_class(2).wait)
        return dcut, trace

    # after n plain decisions: min(2^n, 64) − 1 steps without proposing
    assert backoffs()[1] == [1, 3, 7, 15, 31, 63, 63, 63, 63, 63, 63, 63]
    dcut, _ = backoffs()
    dcut.decide(Draft.empty(2, "cpu"))  # a step with nothing to propose keeps the back-off's length
    assert dcut.rows_class(2).wait == 63
    dcut, _ = backoffs(decisions=5, probe_share=None)  # 2 rows, backing off 31 steps; no probe credit: only the back-off decides here
    assert dcut.skip_proposal(2) and dcut.rows_class(3).wait == 30  # 2 and 3 rows: one class
    assert not dcut.skip_proposal(1)  # 1 row: a class without a back-off probes now
    dcut.decide(draft_with_scores(TREES[:1]))  # … and backs off there for 1 step
    assert dcut.rows_class(1).wait == 1 and dcut.skip_proposal(1) and not dcut.skip_proposal(1)
    assert dcut.rows_class(2).wait == 30  # the 2-row class's back-off goes on where it stopped
    assert dcut.skip_proposal(2) and dcut.rows_class(2).wait == 29


def test_one_poor_draft_decodes_plainly_without_starting_a_backoff():
    knee = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 1.2, 2.0, 4.0]] * 3)
    dcut = trusting(knee)
    good, poor = draft_with_scores(TREES), draft_with_scores([[(-1, 0.01)] * 4] * 2)
    for _ in range(5):
        assert dcut.decide(good)[1].ratio > 0  # W = 1: 2.99 / 1.2 beats plain's 2 / 1
    assert dcut.decide(poor)[1].ratio == 0.0  # this step: not worth verifying …
    assert dcut.rows_class(2).wait == 0 and not dcut.skip_proposal(2)  # … the next step proposes all the same
    for _ in range(4):  # poor drafts step after step: speculation stops paying on average
        dcut.decide(poor)
    assert dcut.rows_class(2).wait > 0 and dcut.skip_proposal(2)  # backing off


def test_probes_that_find_nothing_cost_at_most_their_share_of_the_time():
    # a plain step takes 1 ms; a probe (a 5 ms tree, a W = 4 forward: 5 ms) 9 ms more — e.g. a
    # drafter's tree and catch-up. Speculation never pays.
    steep = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 2.0, 3.0, 5.0]] * 3)
    dcut = trusting(steep)
    dcut.observe_overhead(2, 5.0, width=4)
    plain_ms = probe_ms = probes = 0
    for _ in range(20_000):
        if dcut.skip_proposal(2):
            dcut.observe_step(2, 1.0, probe=False)
            plain_ms += 1.0
            continue
        cut, decision = dcut.decide(draft_with_scores(TREES))
        assert decision.ratio == 0.0 and decision.probe and not bool(cut.valid.any())
        dcut.observe_step(2, 10.0, probe=True)
        probes, probe_ms = probes + 1, probe_ms + 10.0
    assert dcut.rows_class(2).probe_ms == pytest.approx(9.0)  # predicted: the 5 ms tree + 4 ms more forward
    # the back-off alone (every 64 steps) would probe ~300 times, 9 ms extra each: +14 % time
    share = PROBE_SHARE  # 1 %
    waste = 9.0 * probes
    assert waste <= share * (plain_ms + probe_ms) + 2 * 9.0  # ≤ 1 % of the time (+ what the credit may bank)
    assert probes >= share * (plain_ms + probe_ms) / 9.0 - 2  # … and it keeps probing at that rate
    # a probe as dear as a plain step is affordable every 1 / 1 % = 100 steps
    dcut = trusting(steep, slow_start=True)  # the probe proposes the smallest width, W = 1
    assert dcut.decide(draft_with_scores(TREES))[1].probe
    dcut.observe_step(2, 1.0, probe=True)  # the probe cost no more than a plain step
    assert dcut.rows_class(2).probe_ms == pytest.approx(1.0)  # W = 1: a 2 ms forward, no tree cost
    assert dcut.skip_proposal(2)  # the back-off (1 step) …
    waited = 0
    while dcut.skip_proposal(2):  # … then the probe waits for 1 ms of credit: ~100 steps of 1 ms
        dcut.observe_step(2, 1.0, probe=False)
        waited += 1
    assert 0.97 / share <= waited <= 1 / share
    # where speculation pays, what it saved funds the probes: a speculative step of 2 rows that
    # emitted 6 tokens in 2 ms saved 3 plain steps (3 ms) − 2 ms = 1 ms — the probe goes at once
    dcut.observe_step(2, 2.0, probe=True)  # a probe 1 ms dearer than a plain step spends the credit
    assert dcut.skip_proposal(2)
    dcut.observe_step(2, 2.0, probe=False, emitted=6)
    assert dcut.probe_credit >= 1.0 and not dcut.skip_proposal(2)


def test_exploration_verifies_the_smallest_width_and_keeps_backing_off():
    steep = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 2.0, 3.0, 5.0]] * 3)  # speculation never pays
    dcut = trusting(steep, explore_every=2)  # every 2nd plain decision verifies the smallest W > 0
    cut, decision = dcut.decide(draft_with_scores(TREES))  # m = 4: W ∈ {0, 1, 2, 4}
    assert decision.ratio == 0.0 and decision.probe and not bool(cut.valid.any())
    cut, decision = dcut.decide(draft_with_scores(TREES))
    assert decision.ratio == 0.25 and decision.probe  # verified W = 1 …
    assert cut.valid.sum(1).tolist() == [1, 1]  # each row's best node (.9 and .3)
    assert dcut.rows_class(2).plain == 2 and dcut.rows_class(2).wait == 3  # … as a plain decision: the back-off goes on


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
    assert engine.policy.forward_scale != [1.0, 1.0]  # the engine measured its forwards
    assert out.stats.budget_ratio is not None
    assert list(tmp_path.glob("cost/*.json"))  # the profile is cached on disk


def test_dcut_runs_lead_waves_only_after_a_rollout_that_speculated(qwen3_model):
    """group_lead adds target forwards that only speculation repays: a rollout runs in waves only
    when the previous one verified trees in at least half of its steps (the first one does)."""
    cfg = EngineConfig(method="retrieval", budget=8, group_lead=1, budget_policy="dcut",
                       retrieval=RetrievalConfig(suffix_depth=4))
    engine = RolloutEngine(qwen3_model, cfg)
    groups = [0, 0, 0, 1, 1, 1]
    assert len(engine._waves(groups)) == 2  # nothing measured yet
    out = engine.generate([[5, 6, 7]] * 3 + [[8, 9]] * 3, SamplingParams(temperature=1.0, max_new_tokens=12, seed=0))
    share = sum(t["ratio"] > 0 for t in out.stats.budget_trace) / len(out.stats.budget_trace)
    assert engine.speculative_share == pytest.approx(share)
    engine.speculative_share = 0.6
    assert engine._waves(groups) == [[0, 3], [1, 2, 4, 5]]
    engine.speculative_share = 0.4
    assert len(engine._waves(groups)) == 1
    fixed = RolloutEngine(qwen3_model, replace(cfg, budget_policy="fixed"))
    assert len(fixed._waves(groups)) == 2  # a fixed budget always staggers
