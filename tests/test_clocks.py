"""Modelled clocks (rollout_graft_tools.clocks) and budget policies replayed on them
(rollout_graft_tools.clock_replay): deterministic, no model, no vLLM engine."""

import json
from pathlib import Path

import numpy as np
import pytest

from rollout_graft_tools import clock_replay, clocks
from rollout_graft_tools.chain_replay import VOCAB, completions


def test_presets_follow_the_published_configs():
    """Qwen3-8B: 36 layers, 8 KV heads × 128 (144 KiB of bf16 KV per token); Qwen3-32B: 64 layers,
    8 × 128; H20 / H800 / H200 as their datasheets give them."""
    q8, q32 = clocks.MODELS["Qwen3-8B"], clocks.MODELS["Qwen3-32B"]
    assert (q8.layers, q8.kv_heads, q8.head_dim, q8.q_heads) == (36, 8, 128, 32)
    assert (q32.layers, q32.kv_heads, q32.head_dim, q32.q_heads) == (64, 8, 128, 64)
    assert q8.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    assert {n: (clocks.ACCELERATORS[n].tflops, clocks.ACCELERATORS[n].tbps) for n in clocks.REPLAYED} == {
        "H20": (148.0, 4.0), "H800": (989.0, 3.35), "H200": (989.0, 4.8)}


def test_roofline_is_flat_while_memory_bound_then_linear():
    """A step that verifies a few draft tokens per row costs what a plain one does (plus the
    speculative path) while the weight read dominates; past the ridge each token costs
    2·params / (peak·η_flop). The compute-poor H20 reaches its ridge at fewer tokens than the H800."""
    h800 = clocks.Roofline(clocks.ACCELERATORS["H800"], clocks.MODELS["Qwen3-8B"])
    h20 = clocks.Roofline(clocks.ACCELERATORS["H20"], clocks.MODELS["Qwen3-8B"])
    ctx = np.full(8, 200)
    plain = h800.step_ms(np.zeros(8), ctx)
    assert h800.step_ms(np.full(8, 4), ctx) == pytest.approx(plain + h800.spec_ms, rel=1e-3)
    rows = 256
    big = [h800.step_ms(np.full(rows, d), np.full(rows, 200)) for d in (6, 7)]
    per_token = 2 * h800.model.params / (h800.accelerator.tflops * 1e12 * h800.eta_flop) * 1000
    assert (big[1] - big[0]) / rows == pytest.approx(per_token, rel=0.05)
    ratio = lambda r, d: r.step_ms(np.full(64, d), np.full(64, 200)) / r.step_ms(np.zeros(64), np.full(64, 200))  # noqa: E731
    assert ratio(h20, 2) > 2.0 > 1.2 > ratio(h800, 2)


def test_profile_matches_the_step_at_its_context():
    """`profile_ms` (what a profile at start measures) is the step of even drafts at one context."""
    for clock in [*clocks.rooflines().values(), clocks.LinearClock(3.0, 0.06, 0.02, 1.0)]:
        for rows, d in ((8, 0), (8, 3), (64, 1), (256, 8)):
            want = clock.step_ms(np.full(rows, d), np.full(rows, 256))
            assert float(clock.profile_ms(rows, np.array([rows * d]), 256)[0]) == pytest.approx(want, rel=1e-6)


def test_the_compiled_profile_is_the_numpy_definition_bit_for_bit():
    """D-cut reads a roofline's profile at every draft-token count each step: the compiled pass
    (`dcut._kernels.roofline_profile`) gives the numpy definition's floats exactly — the replays'
    and the golden record's decisions do not move — on every preset, memory- and compute-bound,
    at contexts given as ints and floats; and so does one count in Python floats (a plain step's)."""
    rng = np.random.default_rng(0)
    poor = clocks.Roofline(clocks.Accelerator("compute-poor", 10.0, 4.0), clocks.MODELS["Qwen3-32B"], spec_ms=0.0)
    for clock in [*clocks.rooflines().values(), poor]:
        for rows in (1, 8, 64, 1024):
            for context in (0, 333, 2048.75):
                k = np.concatenate([np.arange(rows * 8 + 1), rng.uniform(0, rows * 8, 16)])
                got = clock.profile_ms(rows, k, context)
                assert got.dtype == np.float64 and got.tobytes() == clock._profile(rows, k, context).tobytes()
                assert clock.profile_ms(rows, k.astype(np.int64)[:5], context).tolist() == got[:5].tolist()
                for i in (0, 1, rows * 8, len(k) - 1):  # one count (a plain step's, D-cut's quiet call): Python floats
                    assert clock.profile_ms(rows, k[i], context) == got[i] == clock.profile_ms(rows, np.asarray(k[i]), context)


def test_measured_clock_fits_the_kept_steps():
    """The CPU clock fitted to lab/vllm_step_cost.py's kept steps: non-negative coefficients, a
    plain step at 8 rows within the measured range, the speculative path dearer than a draft token."""
    clock = clocks.measured_clock(["docs/bench/vllm_step_cost_b8.json", "docs/bench/vllm_step_cost_b64.json"], "cpu")
    assert min(clock.a, clock.b_rows, clock.b_draft, clock.b_spec) >= 0
    assert 1.0 < clock.step_ms(np.zeros(8), None) < 8.0
    assert clock.b_spec > clock.b_draft


def _recording(rows=16, length=48, seed=0):
    prompts, outs = completions(np.random.default_rng(seed), rows, 8, length)
    lengths = np.random.default_rng(seed + 1).integers(length // 2, length, len(outs))  # EOS: the batch drains
    return {"args": {"temperature": 1.0}, "vocab": VOCAB,
            "rollouts": [{"prompts": [p.tolist() for p in prompts], "completions": [o[:n].tolist() for o, n in zip(outs, lengths)]}]}


def test_clock_replay_is_deterministic():
    """The modelled clock is the proposer's only time source: D-cut decides the same twice."""
    rec, clock = _recording(), clocks.rooflines()["H800/Qwen3-8B"]
    rollouts, timed = rec["rollouts"], [True]
    runs = [clock_replay.run_arm(clock_replay.dcut_proposer(VOCAB, 200), rollouts, timed, [clock]) for _ in range(2)]
    assert runs[0] == runs[1] and runs[0]["drafted"] > 0


def test_the_replay_sets_what_d_cut_predicted_its_drafts_would_earn_against_what_they_earned():
    """Over the timed steps that drafted, the tokens beyond one a row that D-cut's decisions
    predicted (`BudgetDecision.expected_emitted`) and those the steps emitted; a fixed depth
    predicts none."""
    from rollout_graft.dcut.chains import FixedDepth

    rec, clock = _recording(), clocks.rooflines()["H800/Qwen3-8B"]
    rollouts = rec["rollouts"] * 2
    ours = clock_replay.run_arm(clock_replay.dcut_proposer(VOCAB, 200, clock), rollouts, [False, True], [clock])
    assert ours["predicted_gain"] > 0 and ours["gain"] > 0
    untimed = clock_replay.run_arm(clock_replay.dcut_proposer(VOCAB, 200, clock), rollouts, [False, False], [clock])
    assert untimed["predicted_gain"] == untimed["gain"] == 0
    fixed = clock_replay.dcut_proposer(VOCAB, 200)
    fixed.policy = FixedDepth(4)
    assert clock_replay.run_arm(fixed, rollouts, [True, True], [clock])["predicted_gain"] == 0


def test_dcut_near_the_best_fixed_arm_where_drafts_pay_and_plain_where_they_cannot():
    """From a fresh proposer's first rollout, D-cut started from the clock's profile: on a roofline
    where drafting pays (≥ 1.3× plain at the best fixed arm) it reaches ≥ 0.95× that arm; on one where
    no fixed arm beats plain (compute-poor: every token costs its flops) ≥ 0.99× plain."""
    pays = clocks.rooflines()["H800/Qwen3-8B"]
    poor = clocks.Roofline(clocks.Accelerator("compute-poor", 10.0, 4.0), clocks.MODELS["Qwen3-8B"])
    got = {c["clock"]: c for c in clock_replay.cells(_recording(), "first", 16, [pays, poor])}
    cell = got[pays.name]
    v = clock_replay.verdict(cell)
    assert cell["arms"][v["best_fixed"]] >= 1.3 * cell["arms"]["plain"]
    assert v["vs_best"] >= 0.95
    cell = got[poor.name]
    v = clock_replay.verdict(cell)
    assert cell["arms"][v["best_fixed"]] < cell["arms"]["plain"]
    assert v["vs_plain"] >= 0.99


def test_measured_steps_override_a_profile_that_prices_drafts_too_cheap():
    """A profile from other hardware (the H800's: drafting almost free) on a compute-poor clock,
    where every draft token costs its flops: D-cut drafts on the profile's word at first (its first
    deep step costs several plain steps), then what the rollout measures overrides the profile:
    ≥ 0.95× plain over that first short rollout, ≥ 0.99× plain over the next."""
    from rollout_graft.dcut.chains import ChainDCut

    h800 = clocks.rooflines()["H800/Qwen3-8B"]
    poor = clocks.Roofline(clocks.Accelerator("compute-poor", 10.0, 4.0), clocks.MODELS["Qwen3-8B"])
    rollouts = _recording()["rollouts"] + _recording(seed=2)["rollouts"]
    plain_prop = clock_replay.fixed_arms(VOCAB, 200)["plain"]
    for n, least in ((0, 0.95), (1, 0.99)):  # the proposer's first rollout, then its second
        timed = [i == n for i in range(2)]
        prop = clock_replay.dcut_proposer(VOCAB, 200)
        prop.policy = ChainDCut(8, profile=lambda rows, k: h800.profile_ms(rows, k, 256))
        ours = clock_replay.run_arm(prop, rollouts, timed, [poor])
        plain = clock_replay.run_arm(plain_prop(), rollouts, timed, [poor])
        assert n > 0 or ours["drafted"] > 0  # it drafted on the profile's word
        assert ours["emitted"] / ours["ms"][poor.name] >= least * plain["emitted"] / plain["ms"][poor.name]


def test_dcut_credits_a_drained_batch_by_its_slowest_rows():
    """A batch that drains ends with its slowest rows: where a step's fixed part dominates (the
    CPU clock's shape: 3 ms a step, 0.06 ms a row), confident chains on 2 of 8 rows would pay by the
    rate model (every gain at the batch's mean price per token), but leave 6 rows to set the steps:
    D-cut with a profile (`spread`) decodes plainly there, and drafts the same chains on every row."""
    from rollout_graft.dcut.chains import ChainDCut

    clock = clocks.LinearClock(3.0, 0.06, 0.02, 1.0)
    def profile(rows, k):
        return clock.profile_ms(rows, k)
    chain = 0.9 ** np.arange(1, 9)  # raw scores, prefix products; no evidence yet: calibrated ≈ raw
    few = np.zeros((8, 8))
    few[:2] = chain
    every = np.tile(chain, (8, 1))
    tokens = lambda s: np.tile(np.arange(1, s.shape[1] + 1), (len(s), 1))  # noqa: E731  (as the proposer passes them)
    rate_model = ChainDCut(8, profile=profile, spread=0.0)
    assert rate_model.cut(tokens(few), few)[0].sum() > 0
    for scores, drafts in ((few, False), (every, True)):
        depths, _ = ChainDCut(8, profile=profile).cut(tokens(scores), scores)
        assert (depths.sum() > 0) == drafts


def test_the_grpo_regime_times_the_revisits_only():
    """A recording of GRPO epochs (`lab/record_grpo.py`, one rollout an epoch): every rollout replayed
    in order at any batch size, the first epoch's untimed — the timed rows are the later epochs'."""
    first, second = _recording(seed=3)["rollouts"][0], _recording(seed=4)["rollouts"][0]
    second = {"prompts": first["prompts"], "completions": second["completions"]}  # the same prompts, revisited
    rec = {"args": {"temperature": 1.0, "regime": "grpo"}, "vocab": VOCAB, "rollouts": [first, second]}
    for batch in (8, 16):
        rollouts, timed = clock_replay.schedule(rec, "grpo", batch)
        assert [len(r["prompts"]) for r in rollouts] == [batch] * (32 // batch)
        assert [c for r, t in zip(rollouts, timed) if t for c in r["completions"]] == second["completions"]
        assert [c for r, t in zip(rollouts, timed) if not t for c in r["completions"]] == first["completions"]


def test_proposer_own_time_is_added_where_the_clock_lacks_it():
    """On a roofline (the forward alone) every step of an arm running our proposer also pays its own
    time — a drafting call at the drafting rate, a call where D-cut decided not to draft at the plain
    rate — while plain vLLM (no proposer) pays none, nor does a clock timed between `propose` calls;
    suffix decoding pays what the micro-benchmark measured of it."""
    cost = clocks.ProposerCost((8.0, 64.0), {"fixed": (10.0, 20.0), "dcut": (30.0, 40.0)}, {"dcut": (2.0, 4.0)})
    assert cost.ms("fixed", 8) == pytest.approx(0.08) and cost.ms("dcut", 36, drafted=False) == pytest.approx(0.108)
    assert cost.ms("fixed", 128) == pytest.approx(128 * 20.0 / 1000)  # flat past the last batch measured
    flat = clocks.ProposerCost((1.0, 1000.0), {"fixed": (10.0, 10.0), "dcut": (10.0, 10.0)}, {"dcut": (1.0, 1.0)})
    roof = clocks.rooflines()["H200/Qwen3-8B"]
    cpu = clocks.LinearClock(3.0, 0.06, 0.02, 1.0, name="cpu")
    rollouts, timed = clock_replay.schedule(_recording(), "first", 16)
    arms = clock_replay.fixed_arms(VOCAB, 200)
    for name in ("plain", "fixed-d4"):
        free, paid = (clock_replay.run_arm(arms[name](), rollouts, timed, [roof, cpu], c)
                      for c in (None, clock_replay.own_cost(name, flat)))
        request_steps = free["steps"] - 16  # each row's prefill step samples without a call before it
        extra = paid["ms"][roof.name] - free["ms"][roof.name]
        assert extra == pytest.approx(0.0 if name == "plain" else request_steps * 10.0 / 1000)
        assert paid["ms"]["cpu"] == free["ms"]["cpu"] and paid["emitted"] == free["emitted"]
    # suffix decoding pays its own time where the micro-benchmark measured it, else nothing (in its favour)
    assert clock_replay.own_cost("suffix-d4", flat) is None and clock_replay.own_cost("plain", flat) is None
    measured = clocks.ProposerCost(flat.batches, {**flat.drafting, "suffix": (3.0, 3.0)}, flat.plain)
    assert clock_replay.own_cost("suffix-d4", measured) == (measured, "suffix")
    assert clock_replay.own_cost("ours-dcut", measured) == (measured, "dcut")  # no profiled arm measured
    profiled = clocks.ProposerCost(flat.batches, {**flat.drafting, "dcut-roofline": (12.0, 12.0)}, flat.plain)
    assert clock_replay.own_cost("ours-dcut", profiled) == (profiled, "dcut-roofline")
    assert clock_replay.own_cost("ours-dcut-online", profiled) == (profiled, "dcut")
    assert measured.ms("suffix", 100) == pytest.approx(0.3)
    # a quiet call of D-cut started from a roofline: its own arm's figure where measured, else the online one's
    assert profiled.ms("dcut-roofline", 100, drafted=False) == pytest.approx(0.1)
    quiet = clocks.ProposerCost(flat.batches, profiled.drafting, {"dcut": (1.0, 1.0), "dcut-roofline": (1.5, 1.5)})
    assert quiet.ms("dcut-roofline", 100, drafted=False) == pytest.approx(0.15)
    assert quiet.ms("dcut", 100, drafted=False) == pytest.approx(0.1)


def test_the_kept_micro_benchmark_prices_each_dcuts_quiet_calls_by_its_own_arm():
    """`ours-dcut` starts from a roofline, as on a GPU, and reads its profile in every quiet call: its
    quiet calls are priced by the micro-benchmark's arm started so (`dcut-plain-roofline`), the
    online D-cut's by `dcut-plain`; the counting-in-call study's, which has no such arm, by its own."""
    kept = "docs/bench/vllm_proposer_vs_ngram.json"
    cost = clocks.ProposerCost.from_json(kept)
    median = {(r["arm"], r["batch"]): r["us_per_request_step_median"]
              for r in json.loads(Path(kept).read_text())["results"] if r["context"] == 256}
    assert set(cost.plain) == {"dcut", "dcut-roofline"}
    for kind, arm in (("dcut-roofline", "dcut-plain-roofline"), ("dcut", "dcut-plain")):
        assert cost.ms(kind, 256, drafted=False) == pytest.approx(256 * median[(arm, 256)] / 1000)
    assert set(clocks.ProposerCost.from_json(kept, "dcut-plain-incall").plain) == {"dcut"}


def test_proposer_counting_is_paid_where_it_is_done():
    """Where the micro-benchmark splits out our counting (`ProposerCost.count`, µs per token counted),
    a call pays it for the tokens its `teach` counted: a fixed depth counts every step's text as it
    comes, a D-cut that decides not to draft defers it to its next draft (a probe), so its quiet
    calls pay the plain rate alone and the probes pay the deferred counting."""
    base = clocks.ProposerCost((1.0, 1000.0), {"fixed": (10.0, 10.0), "dcut": (10.0, 10.0)}, {"dcut": (1.0, 1.0)})
    counting = clocks.ProposerCost(base.batches, base.drafting, base.plain, (2.0, 2.0))
    assert counting.ms("fixed", 10, counted=5) == pytest.approx((10 * 10.0 + 5 * 2.0) / 1000)
    assert counting.ms("dcut", 10, drafted=False) == base.ms("dcut", 10, drafted=False)
    roof = clocks.rooflines()["H200/Qwen3-8B"]
    rollouts, timed = clock_replay.schedule(_recording(), "first", 16)
    text = sum(len(c) for r in rollouts for c in r["completions"])
    make = clock_replay.fixed_arms(VOCAB, 200)["fixed-d4"]
    without, paid = (clock_replay.run_arm(make(), rollouts, timed, [roof], clock_replay.own_cost("fixed-d4", c))
                     for c in (base, counting))
    extra = (paid["ms"][roof.name] - without["ms"][roof.name]) * 1000 / 2.0  # tokens counted, at 2 µs each
    prompts = sum(len(p) for r in rollouts for p in r["prompts"])
    assert text * 0.9 < extra <= text + prompts  # every completion counted once (the last steps' need not be), prompts too


def test_longer_contexts_price_the_kv_reads_of_longer_rows():
    """The study clock (`lab/replay.py vllm clocks --longer-contexts`): a roofline whose rows each
    hold more context — its profile too, unless taken at the recording's contexts."""
    roof = clocks.rooflines()["H200/Qwen3-8B"]
    drafts, contexts, k = np.array([0, 2]), np.array([100, 200]), np.array([0, 8])
    long = clocks.LongerContexts(roof, 2048)
    assert long.step_ms(drafts, contexts) == roof.step_ms(drafts, contexts + 2048) > roof.step_ms(drafts, contexts)
    assert long.profile_ms(64, k, 256).tolist() == roof.profile_ms(64, k, 2304).tolist()
    stale = clocks.LongerContexts(roof, 2048, profiled_without=True)
    assert stale.profile_ms(64, k, 256).tolist() == roof.profile_ms(64, k, 256).tolist()
    assert long.name == roof.name and not long.includes_proposer  # a roofline's steps: the forward alone


def test_the_engine_on_a_clock_is_seed_exact_and_its_dcut_decides_on_that_clock():
    """`engine_clocks`: real engine rollouts whose verify forwards are priced by a clock. Every arm
    emits the plain path's tokens; D-cut, seeing the clock's milliseconds, decides the same way
    twice, and on the H800 (where wide trees are nearly free at 8 rows) verifies wider trees than on
    the compute-poor H20."""
    from conftest import random_model

    from rollout_graft import SamplingParams
    from rollout_graft_tools import engine_clocks

    model = random_model(sharp=6.0)
    gen = np.random.default_rng(0)
    sets = [[gen.integers(3, 64, 6).tolist() for _ in range(2)]]
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
    h20, h800 = (clocks.Roofline(clocks.ACCELERATORS[a], clocks.MODELS["Qwen3-8B"]) for a in ("H20", "H800"))
    plan = engine_clocks.rollouts("first", sets, 4, params)
    runs = [engine_clocks.run(engine_clocks.dcut_engine(model, None, clock), plan, clock) for clock in (h800, h800, h20)]
    shapes = [[shape[:2] for shape in steps.shapes] for steps, _, _ in runs]
    assert shapes[0] == shapes[1] and any(n > 1 for _, n in shapes[0])  # (rows, tokens per row) of every forward
    cells = engine_clocks.cells(model, None, sets, 4, "first", params, [h20, h800])
    assert all(c["seed_exact"] for c in cells)
    nodes = {c["clock"]: c["mean_verified_nodes"]["ours-dcut"] for c in cells}
    assert nodes["H800/Qwen3-8B"] > nodes["H20/Qwen3-8B"]


def test_a_pool_cut_of_the_whole_proposal_is_the_fixed_width():
    """`engine_clocks.pool_cells` (the cut study): keeping all of a proposal is the fixed-width arm
    itself (same tokens, same forwards), a cut of a wider proposal verifies the kept width, and a
    ranking it does not know is refused."""
    from conftest import random_model

    from rollout_graft import SamplingParams
    from rollout_graft_tools import engine_clocks

    model = random_model(sharp=6.0)
    gen = np.random.default_rng(0)
    sets = [[gen.integers(3, 64, 6).tolist() for _ in range(2)]]
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
    h800 = clocks.Roofline(clocks.ACCELERATORS["H800"], clocks.MODELS["Qwen3-8B"])
    cell = engine_clocks.pool_cells(model, None, sets, 4, "first", params, h800, pools=((4, 4, "raw"), (8, 4, "calibrated")))
    fixed = engine_clocks.cells(model, None, sets, 4, "first", params, [h800])[0]
    own, cut = cell["arms"]
    assert own["mat"] == fixed["mat"]["fixed-w4"] and own["tokens_per_s"] == pytest.approx(fixed["arms"]["fixed-w4"])
    assert cut["pool"] == 8 and cut["keep"] == 4 and cut["mat"] > 1.0
    with pytest.raises(ValueError, match="ranking must be"):
        engine_clocks.PoolCut(engine_clocks.table_of(h800), 8, 4, "score")


def test_an_index_learning_at_only_its_best_nodes_verifies_the_same_trees_and_learns_less():
    """`engine_clocks.learn_only_best` (the study of what a verified node teaches the index): learning
    at a tree's best W of W nodes is the shipped engine (same tokens, same forwards); learning at its
    best 2 leaves the index with fewer known successors, its tokens still plain sampling's."""
    from conftest import random_model

    from rollout_graft import EngineConfig, RolloutEngine, SamplingParams
    from rollout_graft_tools import engine_clocks

    model = random_model(sharp=6.0)
    gen = np.random.default_rng(0)
    sets = [[gen.integers(3, 64, 6).tolist() for _ in range(2)]]
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
    plan = engine_clocks.rollouts("first", sets, 4, params)

    def ran(best):
        engine = RolloutEngine(model, EngineConfig(method="retrieval", budget=8))
        if best is not None:
            engine_clocks.learn_only_best(engine, best)
        steps, tokens, completions = engine_clocks.run(engine, plan, None)
        known = int((engine.proposer.index.ids >= 0).sum())
        return [shape[:2] for shape in steps.shapes], completions, known

    shipped, whole, two = ran(None), ran(8), ran(2)
    assert whole == shipped
    assert two[1] == shipped[1] and two[2] < shipped[2]
    h800 = clocks.Roofline(clocks.ACCELERATORS["H800"], clocks.MODELS["Qwen3-8B"])
    cell = engine_clocks.learn_cells(model, None, sets, 4, "first", params, h800, arms=((8, None), (8, 2)))
    assert [(a["width"], a["learns_at"]) for a in cell["arms"]] == [(8, None), (8, 2), (None, None)]
    assert all(a["mat"] >= 1.0 and a["tokens_per_s"] > 0 for a in cell["arms"])


def test_a_gpu_measured_table_is_the_lower_envelope_of_its_cells(tmp_path):
    """`engine_clocks.measured_table_clock`: a lab/gpu_verify_cost.py grid read as the engine's
    forward-cost table. A slow outlier (a host hiccup: best-of timings err upwards only) is drawn
    under, not carried into every wider cell; a cell the run skipped is extrapolated from its row;
    an unknown model or context is named."""
    import json

    from rollout_graft_tools import engine_clocks

    cells = [{"rows": r, "tokens": q, "context": 128, "ms": 10.0 + r * q / 10 + (30.0 if (r, q) == (1, 2) else 0.0)}
             for r in (1, 8) for q in (1, 2, 4) if (r, q) != (8, 4)]
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "models": [{"model": {"name": "M"}, "cells": cells}]}))
    clock = engine_clocks.measured_table_clock(path, "M")
    assert clock.name == "H100-engine/M"
    assert np.allclose(clock.table.latency_ms, [[10.1, 10.4, 10.4], [10.8, 11.6, 13.2]])
    assert clock.step_ms(np.array([1] * 8)) == pytest.approx(11.6)  # 8 rows × 2 tokens
    with pytest.raises(ValueError, match="no cells of 'M' at context 512"):
        engine_clocks.measured_table_clock(path, "M", context=512)


def test_the_gpu_grid_script_runs_and_reads_back_as_a_clock(tmp_path):
    """lab/gpu_verify_cost.py, whose JSON the H100 clocks are read from, on this CPU with a tiny
    random model of the Qwen3 architecture: every asked cell timed or skipped with its reason, and
    the JSON readable by `measured_table_clock`."""
    import json

    from conftest import load_script

    from rollout_graft_tools import engine_clocks

    out = tmp_path / "grid.json"
    load_script("lab/gpu_verify_cost.py").main(["--models", "tiny", "--device", "cpu", "--dtype", "float32",
                                                "--rows", "1", "4", "--tokens", "1", "2", "8", "--contexts", "128",
                                                "--repeats", "1", "--max-tokens", "16", "--json", str(out)])
    run = json.loads(out.read_text())
    cells, skipped = run["models"][0]["cells"], run["models"][0]["skipped"]
    assert {(c["rows"], c["tokens"]) for c in cells} == {(1, 1), (1, 2), (1, 8), (4, 1), (4, 2)}
    assert skipped == [{"rows": 4, "tokens": 8, "context": 128, "why": "over 16 tokens"}]
    assert all(c["ms"] > 0 for c in cells)
    clock = engine_clocks.measured_table_clock(out, "tiny")
    assert clock.table.batches == [1, 4] and clock.table.tokens == [1, 2, 8]
