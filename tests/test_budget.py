"""D-cut through its interface (plan → cut → observe), on hand-made cost tables and drafts: the
width choice, what it charges speculation, and the probe credit."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import draft_with_scores, random_model

from rollout_graft import DCutConfig, EngineConfig, RetrievalConfig, RolloutEngine, SamplingParams
from rollout_graft.cost import CostModel
from rollout_graft.dcut.core import RowCost, ScoreCalibration
from rollout_graft.dcut.trees import DCut, FixedBudget, StepRecord, TreeStepCost
from rollout_graft.selection import keep_best
from rollout_graft.stats import StepTiming
from rollout_graft.tree import RETRIEVAL, SUFFIX, Draft

# row 0: a confident chain; row 1: a poor bushy tree
TREES = [
    [(-1, 0.9), (0, 0.8), (1, 0.7), (2, 0.5)],
    [(-1, 0.3), (-1, 0.2), (0, 0.1), (1, 0.05)],
]


def trusting(cost, budget: int = 4, **kw) -> DCut:
    """D-cut that takes the raw scores as acceptance probabilities (budget 4: W ∈ {0, 1, 2, 4})."""
    return DCut(cost, budget, DCutConfig(ratios=(0.25, 0.5, 1.0), calibration_prior=1e9, **kw))


def step(policy, draft: Draft, ms: float = 1.0, emitted: int | None = None, propose_ms: float = 0.0):
    """One engine step through the interface: plan, cut, observe (nothing accepted unless `emitted`
    says more than one token per row). Returns (cut draft, decision); None when nothing was proposed."""
    rows = draft.tokens.shape[0]
    planned = policy.plan(rows)
    proposed = keep_best(draft, planned) if planned else Draft.empty(rows, "cpu")  # a proposer keeps to the plan
    cut, decision = policy.cut(proposed)
    timing = StepTiming(propose_ms=propose_ms, forward_ms=ms - propose_ms)
    policy.observe(StepRecord(rows, planned, cut, torch.zeros_like(cut.valid), 1 + cut.tokens.shape[1],
                              rows if emitted is None else emitted, decision, timing))
    return (cut, decision) if planned else None


def test_fixed_budget_verifies_the_whole_draft():
    policy = FixedBudget(8)
    draft = draft_with_scores(TREES)
    assert policy.plan(2) == 8
    cut, decision = policy.cut(draft)
    assert cut is draft and decision.ratio == 1.0


def test_width_choice_follows_the_cost_table():
    d = draft_with_scores(TREES)  # m = 4 → widths W ∈ {0, 1, 2, 4}
    flat = CostModel([1, 2, 64], [1, 2, 4, 8], [[1.0] * 4] * 3)  # verification is free
    dcut = trusting(flat)
    decisions = [step(dcut, d) for _ in range(3)]  # the proposal starts at the smallest width, doubles
    assert [dec.ratio for _, dec in decisions] == [0.25, 0.5, 1.0]  # … while all of it is chosen
    free, decision = decisions[-1]
    assert int(free.valid.sum()) == 8 and decision.candidates == 8  # more tokens for the same time
    steep = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 2.0, 3.0, 5.0]] * 3)  # cost ∝ tokens per row
    cut, decision = step(trusting(steep), d)
    # rows=2: W=0 → 2/cost(2,1)=2.0 ; W=1 → (2+.9+.3)/cost(2,2)=1.6: plain wins, and the draft built
    # for this step is verified at its best width W=1 all the same (a probe: it measures W=1's forward)
    assert decision.probe and decision.ratio == 0.25 and int(cut.valid.sum()) == 2
    assert decision.break_even_mat == pytest.approx(2.0)  # W=1 costs two plain steps: 2 tokens per row to pay
    assert decision.expected_mat == pytest.approx(1.5, abs=0.05)  # 1 + (0.9 + 0.3) / 2 expected (binned scores)
    knee = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 1.2, 2.0, 4.0]] * 3)  # one extra token is cheap
    dcut = trusting(knee)
    # W=0 → 2.0 ; W=1 → 3.2/1.2 = 2.67 ; W=2 → 4.2/2 = 2.1 (W=4 → 5.55/4 = 1.39)
    for proposal in (1, 2, 2, 2):  # W = 1 took the whole proposal of 1: the next proposes 2, W = 1 of 2 again …
        assert dcut.plan(2) == proposal
        cut, decision = step(dcut, d)
        assert decision.ratio == 0.25 and decision.kept == 2 and decision.candidates == 2 * proposal
    assert cut.valid.tolist() == [[True], [True]] and cut.tokens.tolist() == [[10], [10]]


def test_the_proposal_follows_the_choice():
    """The next step proposes twice the width chosen (so all of a proposal chosen doubles the next),
    at most the budget, and the same after a plain decision (the probe proposes what was chosen last)."""
    cheap = CostModel([1, 2, 64], [1, 2, 4, 8, 16], [[1.0, 1.05, 1.1, 1.2, 1.3]] * 3)
    dcut = DCut(cheap, 16, DCutConfig(ratios=(1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0), calibration_prior=1e9))
    chain = draft_with_scores([[(-1, 0.9)] + [(i, 0.9 ** (i + 2)) for i in range(15)]] * 2)
    proposals = []
    for _ in range(6):
        proposals.append(dcut.plan(2))
        step(dcut, chain)
    assert proposals == [1, 2, 4, 8, 16, 16]  # never above the budget
    narrow = draft_with_scores([[(-1, 0.9), (0, 0.9), (1, 0.9), (2, 0.9)] + [(-1, 1e-4)] * 12] * 2)
    assert step(dcut, narrow)[1].ratio == 0.25  # the draft's 4 good nodes (wider: dearer, no gain)
    assert dcut.plan(2) == 8  # the next proposal: twice what was chosen
    poor = draft_with_scores([[(-1, 1e-4)] * 4] * 2)
    step(dcut, poor, ms=5.0)  # a plain decision (a dear step: the next probe waits for its credit) …
    assert dcut.plan(2) == 0
    while not (planned := dcut.plan(2)):
        step(dcut, Draft.empty(2, "cpu"))
    assert planned == 8  # … and the probe proposes what the last choice led to


def test_width_follows_the_batch_size_as_it_drains():
    # speculation pays at 2 rows (the forward is latency-bound) but not at 64 (compute-bound)
    cost = CostModel([2, 64], [1, 2, 3, 5], [[1.0, 1.05, 1.1, 1.2], [1.0, 2.0, 3.0, 5.0]])
    small = trusting(cost)
    assert [step(small, draft_with_scores(TREES))[1].ratio for _ in range(3)] == [0.25, 0.5, 1.0]
    assert step(trusting(cost), draft_with_scores(TREES * 32))[1].probe  # plain wins at 64 rows


def test_the_time_outside_the_forward_is_fitted_per_row_and_charged_to_speculation():
    model = RowCost(0.9)
    for rows, ms in [(1, 3.0), (4, 6.0), (16, 18.0)]:
        model.observe(rows, ms)
    assert model.predict(8) == pytest.approx(10.0, rel=1e-6)  # fits 2 + 1·rows exactly
    tail = RowCost(0.9)  # measured on a drained batch's tail only, the fit falls with the rows
    for rows, ms in [(1, 4.0), (2, 3.0), (3, 2.0)]:
        tail.observe(rows, ms)
    assert tail.predict(2) == pytest.approx(3.0)
    assert tail.predict(60) == pytest.approx(40.0)  # past 3 rows: at least proportional (2 ms × 60/3)
    flat = CostModel([1, 2, 64], [1, 2, 4, 8], [[1.0] * 4] * 3)
    dcut = trusting(flat)
    step(dcut, draft_with_scores(TREES), ms=6.0, propose_ms=5.0)  # 5 ms of tree building vs a 1 ms forward
    _, decision = step(dcut, draft_with_scores(TREES))
    assert decision.probe  # plain wins: W=0 → 2/1 ; W=4 → (2+3.75)/(1+5) < 2


def test_a_width_is_priced_with_the_proposal_it_leads_to():
    """Choosing W makes the next proposal `proposal_after(W)` (2W), so W is priced with the time outside
    the forward of such trees: here W = 1's forward is cheap, but the 2-node trees it leads to cost
    3 ms to build, so plain decoding wins (W = 1 priced with 1-node trees would win instead)."""
    knee = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 1.2, 2.0, 4.0]] * 3)  # W=1: 3.2 / 1.2 = 2.67 beats 2.0
    dcut = trusting(knee)
    assert [dcut.proposal_after(w) for w in (1, 2, 4)] == [2, 4, 4]
    for proposed, outside_ms in ((1, 0.0), (2, 3.0), (4, 3.0)):
        for rows in (1, 2, 4):
            dcut.cost.observe(rows, 2, proposed, StepTiming(propose_ms=outside_ms, forward_ms=knee.predict(rows, 2)))
    dcut.proposal = 1
    assert dcut.plan(2) == 1
    _, decision = dcut.cut(keep_best(draft_with_scores(TREES), 1))
    assert decision.probe and decision.ratio == 0.25  # W = 1: (2 + 1.2) / (1.2 + 3) < 2 / 1


def test_measured_forwards_correct_the_profiled_table():
    knee = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 1.2, 2.0, 4.0]] * 3)
    cost = TreeStepCost(knee)
    for _ in range(200):  # the rollout's own wide forwards take twice the profiled time; plain ones as profiled
        cost.observe(2, 2, True, StepTiming(forward_ms=2.4))
        cost.observe(2, 1, False, StepTiming(forward_ms=1.0))
    assert (cost.scale(1), cost.scale(2)) == pytest.approx((1.0, 2.0), rel=0.01)
    assert cost.forward_ms(2, 2) == pytest.approx(2.4, rel=0.01)
    # never measured: the table's shape at the common scale, the mean of every forward's measured / profiled
    assert cost.scale(3) == pytest.approx(1.5, rel=0.01)
    # the machine gets twice as busy; D-cut decodes plainly: plain forwards are priced by what they now
    # take within a few steps, wide ones keep their last measurement until a probe measures them again
    for _ in range(60):
        cost.observe(2, 1, False, StepTiming(forward_ms=2.0))
    assert cost.forward_ms(2, 1) == pytest.approx(2.0, rel=0.03) and cost.forward_ms(2, 2) == pytest.approx(2.4, rel=0.01)
    cost.observe(2, 2, True, StepTiming(forward_ms=4.8))  # one probe, after 60 steps, weighs 2.3× the aged ones
    assert cost.forward_ms(2, 2) == pytest.approx(2.4 + 0.7 * 2.4, rel=0.02)
    dcut = trusting(knee)
    for _ in range(200):
        dcut.cost.observe(2, 2, True, StepTiming(forward_ms=2.4))
        dcut.cost.observe(2, 1, False, StepTiming(forward_ms=1.0))
    assert step(dcut, draft_with_scores(TREES))[1].probe  # plain wins: W=1: 3.2 / 2.4 < 2 / 1 (the table said 2.67)


def test_a_table_profiled_under_load_is_corrected_by_the_probes():
    """A table whose wide forwards were profiled during a busy spell (3× a plain step) holds D-cut
    plain only until its probes, which verify, have measured them (1.2×): then it drafts."""
    loaded = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 3.0, 4.0, 6.0]] * 3)
    dcut = trusting(loaded)
    verdicts = []
    for _ in range(200):
        if not dcut.plan(2):
            step(dcut, Draft.empty(2, "cpu"))  # a plain step: 1 ms, as profiled
            continue
        # W = 1 of the confident chain: 1.2 ms, one row's node accepted (3 tokens for 2 rows)
        verdicts.append(step(dcut, draft_with_scores(TREES), ms=1.2, emitted=3)[1])
    assert verdicts[0].probe and verdicts[0].break_even_mat == pytest.approx(3.0)  # the table's verdict: plain
    assert not verdicts[-1].probe and verdicts[-1].ratio > 0  # measured: W = 1 pays (3.2 / 1.2 > 2 / 1)
    assert dcut.cost.forward_ms(2, 2) < 1.5  # the W = 1 forward as measured (1.2 ms), not as profiled (3 ms)


def test_a_drafting_dcut_keeps_measuring_the_plain_step():
    """A table whose plain forward was profiled during a busy spell (3 ms; it takes 1 ms) makes
    drafting look cheap; D-cut's reference steps (one in 1 / probe_share while it drafts) measure
    the plain step, and it stops drafting where drafting does not pay."""
    loaded = CostModel([1, 2, 64], [1, 2, 3, 5], [[3.0, 3.0, 4.0, 6.0]] * 3)
    dcut = trusting(loaded)
    plain_steps, verdicts = 0, []
    for _ in range(300):
        if not dcut.plan(2):
            step(dcut, Draft.empty(2, "cpu"), ms=1.0)
            plain_steps += 1
            continue
        verdicts.append(step(dcut, draft_with_scores(TREES), ms=3.0, emitted=3)[1])  # 1.5 tokens per row in 3 ms
    assert not verdicts[0].probe  # the table's verdict: W = 1 emits 1.6 tokens per row at a plain step's price
    assert dcut.cost.forward_ms(2, 1) == pytest.approx(1.0, rel=0.05)  # measured by the reference steps
    assert verdicts[-1].probe and verdicts[-1].break_even_mat == pytest.approx(3.0, rel=0.05)  # now: plain wins
    assert plain_steps > 150  # decoding plainly since, probing now and then


def test_probes_that_find_nothing_cost_at_most_their_share_of_the_time():
    # a plain step takes 1 ms; a probe 9 ms more (a 5 ms tree, e.g. a drafter's catch-up, and a
    # slow spell; it verifies W = 1 and nothing is accepted). Speculation never pays.
    steep = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 2.0, 3.0, 5.0]] * 3)
    dcut = trusting(steep)
    share = dcut.config.probe_share  # 1 %
    plain_ms = probe_ms = probes = 0
    for _ in range(20_000):
        out = step(dcut, draft_with_scores(TREES), ms=10.0, propose_ms=5.0) if dcut.plan(2) else step(dcut, Draft.empty(2, "cpu"))
        if out is None or not out[0].tokens.shape[1] and not out[1].probe:
            plain_ms += 1.0
            continue
        assert out[1].probe and out[1].ratio == 0.25 and int(out[0].valid.sum()) == 2  # verifies W = 1 to measure it
        probes, probe_ms = probes + 1, probe_ms + 10.0
    assert dcut.plan(2) in (0, 1)  # the proposal never grew: nothing was chosen
    # predicted: the 5 ms tree + the W = 1 forward as the probes measured it (5 ms; the table said 2) - a plain step
    assert dcut.probe_ms(2) == pytest.approx(9.0, rel=0.02)
    waste = 9.0 * probes  # without the credit, every step would probe: +900 % time
    assert waste <= share * (plain_ms + probe_ms) + 2 * 9.0  # ≤ 1 % of the time (+ what the credit may bank)
    assert probes >= share * (plain_ms + probe_ms) / 9.0 - 2  # … and it keeps probing at that rate


def test_where_speculation_pays_what_it_saved_funds_the_probes():
    knee = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 1.2, 2.0, 4.0]] * 3)  # a plain step: 1 ms
    good, poor = draft_with_scores(TREES), draft_with_scores([[(-1, 0.01)] * 4] * 2)
    paid, unpaid = trusting(knee), trusting(knee)
    for _ in range(4):  # speculative steps of 2 rows (W = 1) that emitted 4 tokens in 1.2 ms: 0.8 ms saved each
        assert step(paid, good, ms=1.2, emitted=4)[1].ratio == 0.25
    for policy in (paid, unpaid):  # a poor draft: a probe that decoded plainly, 0.2 ms dearer than a plain step
        assert step(policy, poor, ms=1.2)[1].probe
    # the next probe (a W = 1 forward) costs more than the share of the time banked, less than what was saved
    assert unpaid.probes.ms < unpaid.probe_ms(2) <= paid.probes.ms
    assert paid.plan(2) == 2  # what speculation saved pays for the next probe (the proposal W = 1 led to) at once …
    assert unpaid.plan(2) == 0  # … where nothing was saved, the probe waits for its credit


def test_calibration_learns_acceptance_rates():
    cal = ScoreCalibration(prior_weight=1.0)
    score = np.full((1, 100), 0.1)
    accepted = np.zeros((1, 100), dtype=bool)
    accepted[0, :90] = True  # nodes scored 0.1 are accepted 90% of the time
    cal.observe(score, np.ones_like(accepted), accepted)
    assert cal(np.array([0.1]))[0] == pytest.approx(0.9, abs=0.02)
    assert cal(np.array([0.5]))[0] >= cal(np.array([0.1]))[0]  # monotone
    cal.age(0.5)
    assert cal.seen.sum() == pytest.approx(50.0) and cal(np.array([0.1]))[0] == pytest.approx(0.9, abs=0.02)


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
    cost = engine.policy.cost  # the engine timed its steps: the time outside the forward is measured
    assert cost.step_ms(8, 0, 0) > cost.forward_ms(8, 1)
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


def test_dcut_maps_scores_on_the_device_as_the_calibration_does():
    """The engine's D-cut maps a draft's scores in one gather from its sources' rate tables, binned on
    the draft's device: exactly the numpy calibration's map per source, bin edges and the clamped ends
    included."""
    gen = np.random.default_rng(0)
    flat = CostModel([1, 2, 64], [1, 2, 4, 8], [[1.0] * 4] * 3)
    dcut = DCut(flat, 4)
    edges = dcut.calibrations[0].edges
    for _ in range(5):
        score = np.concatenate([gen.random(40) ** 6, edges[gen.integers(0, len(edges), 8)], [0.0, 1e-9, 1.0]])
        score = score.astype(np.float32).reshape(3, -1)
        source = gen.integers(0, len(dcut.calibrations), score.shape)
        for s, calibration in enumerate(dcut.calibrations):  # each source learns its own rates
            calibration.observe(score, (source == s) & (gen.random(score.shape) < 0.7), gen.random(score.shape) < 0.2 * (s + 1))
        tokens = torch.zeros(score.shape, dtype=torch.long)
        draft = Draft(tokens, tokens - 1, tokens + 1, torch.ones(score.shape, dtype=torch.bool), torch.from_numpy(score),
                      torch.from_numpy(source).to(torch.int8))
        expected = np.choose(source, [c(score) for c in dcut.calibrations])
        assert np.array_equal(dcut.calibrated(draft).numpy(), expected)


def test_a_cost_table_prices_a_batch_between_its_rows_at_the_same_tokens_in_all():
    """`CostModel.predict` reads the neighbouring grid rows where they compute the same tokens in all:
    on an accelerator's step (flat while the weights' reads dominate, then linear in tokens) a batch
    between two profiled rows is priced near the step itself, where reading both rows at the same
    tokens per row put it on a line across the knee; a cost linear in rows and tokens stays exact."""
    from rollout_graft.dcut.roofline import ACCELERATORS, ModelShape, Roofline

    clock = Roofline(ACCELERATORS["H800"], ModelShape("Qwen3-8B", params=8.2e9, layers=36, q_heads=32, kv_heads=8,
                                                      head_dim=128))
    batches, tokens = [1, 4, 16, 64], [1, 2, 4, 8, 16, 32, 64]
    table = CostModel(batches, tokens, [[float(clock.profile_ms(b, float((q - 1) * b), 128)) for q in tokens]
                                        for b in batches])
    for rows, q in ((8, 31), (12, 20), (8, 16), (2, 40), (48, 4)):  # the first two straddle the knee
        step = float(clock.profile_ms(rows, float((q - 1) * rows), 128))
        assert table.predict(rows, q) == pytest.approx(step, rel=0.015), (rows, q)
    linear = CostModel(batches, tokens, [[2.0 + 0.5 * b + 0.1 * b * q for q in tokens] for b in batches])
    for rows, q in ((8, 31), (3, 5), (40, 2.5)):
        assert linear.predict(rows, q) == pytest.approx(2.0 + 0.5 * rows + 0.1 * rows * q)


def test_after_a_probe_that_found_nothing_the_next_is_priced_by_its_tree_alone():
    """A probe whose proposer found no node verified nothing and cost its tree only; the next probe
    is priced so (`DCut.probe_ms` at the last draft's widest row, now none), not as a forward of the
    whole proposal: on an accelerator's clock, where a wide forward costs whole plain steps more, a
    new rollout's first empty draft held D-cut plain while it saved credit for a forward it
    never made (`lab/replay.py engine clocks`, H200 / Qwen3-32B at 8 rows)."""
    steep = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 2.0, 3.0, 5.0]] * 3)
    dcut = trusting(steep)
    step(dcut, draft_with_scores(TREES), ms=2.0, emitted=2)  # a probe that verified W = 1: plain wins
    assert dcut.plain and dcut.probe_ms(2) > 0.9  # the next verifies a row's nodes: ~1 ms more than plain
    dcut.probes.ms = 2.0  # credit for that probe: the next step proposes …
    assert step(dcut, Draft.empty(2, "cpu"))[1].probe  # … and finds nothing
    assert dcut.plain and dcut.probe_ms(2) < 0.1  # the next: its tree alone (free here)


def test_the_cut_keeps_the_best_calibrated_nodes_not_the_best_raw_scores():
    """Raw scores of different sources do not compare (a suffix chain's are a fixed confidence per
    node): D-cut keeps the width it chose by the calibrated acceptance its choice expected, so a
    suffix chain accepted most of the time outranks a retrieval node of higher raw score accepted
    rarely."""
    table = CostModel([1, 2, 64], [1, 2, 3, 5], [[1.0, 1.1, 1.2, 4.0]] * 3)  # W = 2 is cheap, W = 4 is not
    dcut = DCut(table, 4, DCutConfig(ratios=(0.25, 0.5, 1.0)))
    # retrieval depth 1 at 0.5 | a suffix chain 0.6 → 0.36 | retrieval depth 1 at 0.45
    draft = draft_with_scores([[(-1, 0.5), (-1, 0.6), (1, 0.36), (-1, 0.45)]] * 2)
    draft.source[:] = torch.tensor([RETRIEVAL, SUFFIX, SUFFIX, RETRIEVAL], dtype=torch.int8)
    many = np.ones((1, 1000), dtype=bool)
    for source, score, rate in ((SUFFIX, 0.6, 0.9), (SUFFIX, 0.36, 0.8), (RETRIEVAL, 0.5, 0.05), (RETRIEVAL, 0.45, 0.05)):
        dcut.calibrations[source].observe(np.full((1, 1000), score), many, np.arange(1000).reshape(1, -1) < 1000 * rate)
    dcut.proposal = 4
    assert dcut.plan(2) == 4
    cut, decision = dcut.cut(draft)
    assert decision.ratio == 0.5 and decision.expected_emitted == pytest.approx(2 + 2 * (0.9 + 0.8), rel=0.02)
    kept = [[t for t, v in zip(*row) if v] for row in zip(cut.tokens.tolist(), cut.valid.tolist())]
    assert kept == [[11, 12]] * 2  # the chain, not the raw best (0.6 and 0.5)
    assert dcut.plan(2) == 4  # the next proposal: twice the width chosen
