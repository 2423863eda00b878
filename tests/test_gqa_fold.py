"""rollout_graft.attention (`EngineConfig.fold_gqa`): grouped-query attention folded into the query
axis computes the attention transformers' SDPA path computes under the engine's masks, the engine
samples the same tokens with it, and the model's own attention is back after every rollout."""

import pytest
import torch
from conftest import load_script
from transformers import AutoModelForCausalLM

from rollout_graft import EngineConfig, RolloutEngine, SamplingParams
from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET
from rollout_graft.attention import FOLDED, foldable, folded
from rollout_graft.runner import ModelRunner
from rollout_graft_tools.prompts import load_prompts


@pytest.fixture(scope="module")
def target():
    model = AutoModelForCausalLM.from_pretrained(TINY_TARGET, dtype=torch.float32).eval()
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # the tiny target shares KV heads
    return model


def test_folded_attention_gives_the_sdpa_paths_logits(target):
    fold = load_script("lab/gqa_fold.py")
    runner = ModelRunner(target)
    logits = {}
    for attention in ("sdpa", FOLDED):
        logits[attention] = [fold.timed(target, runner, attention, rows, 40, tokens, repeats=1)[1]
                             for rows, tokens in ((3, 1), (3, 5))]
    target.set_attn_implementation("sdpa")
    for a, b in zip(logits["sdpa"], logits[FOLDED]):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4)


@pytest.mark.parametrize("config", [dict(method="ar"), dict(method="retrieval")])
def test_a_folded_rollout_samples_the_same_tokens_and_restores_the_models_attention(target, config):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY_TARGET)
    rows = [p for p in load_prompts(str(TINY_PROMPTS), tok, "test", 4) for _ in range(4)]
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
    outs = {}
    for fold in (False, True):
        seen = []
        hook = target.model.layers[0].self_attn.register_forward_pre_hook(
            lambda m, a: seen.append(target.config._attn_implementation))
        try:
            outs[fold] = RolloutEngine(target, EngineConfig(fold_gqa=fold, **config), tokenizer=tok).generate(rows, params)
        finally:
            hook.remove()
        assert set(seen) == {FOLDED if fold else "sdpa"}  # every forward of the rollout
        assert target.config._attn_implementation == "sdpa"  # the training forward's attention, back
    assert outs[True].completion_ids == outs[False].completion_ids
    for a, b in zip(outs[True].logprobs, outs[False].logprobs):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4


def test_d_cuts_cost_table_times_the_folded_forward(target, monkeypatch):
    """D-cut's table is profiled with the attention the rollouts run, and cached apart from the other's."""
    from rollout_graft.cost import CostModel

    with folded(target):
        key = CostModel.key_for(target)
    assert key != CostModel.key_for(target)
    profiled = []

    def profile(model, **kwargs):
        profiled.append(model.config._attn_implementation)
        return CostModel([1, 4], [1, 2], [[1.0, 1.1], [1.2, 1.3]])
    monkeypatch.setattr(CostModel, "profile", staticmethod(profile))
    RolloutEngine(target, EngineConfig(method="retrieval", budget_policy="dcut", fold_gqa=True)).budget_policy()
    assert profiled == [FOLDED] and target.config._attn_implementation == "sdpa"


def test_folding_leaves_other_models_and_restores_after_an_error(target):
    with pytest.raises(RuntimeError), folded(target):
        assert target.config._attn_implementation == FOLDED
        raise RuntimeError("a rollout that fails")
    assert target.config._attn_implementation == "sdpa"
    target.set_attn_implementation("eager")
    try:
        assert not foldable(target)  # another attention than transformers' sdpa runs as it is
        with folded(target):
            assert target.config._attn_implementation == "eager"
    finally:
        target.set_attn_implementation("sdpa")


def test_the_gpu_probe_script_runs(tmp_path):
    """lab/gpu_verify_paths.py, prepared for a GPU session, smoke-run on this CPU: every cell timed
    (whole and host-side), the profiler's tables written."""
    import json

    load_script("lab/gpu_verify_paths.py").main(["--out", str(tmp_path), "--device", "cpu", "--repeats", "1",
                                                "--rows", "2", "--tokens", "1", "3", "--profile", "2:131:0.3:3",
                                                "--layers", "2"])
    results = json.loads((tmp_path / "gpu_verify_paths.json").read_text())["results"]
    assert len(results) == 8 and all(r["ms"] >= r["host_ms"] > 0 for r in results)
    assert "self_cpu_time_total" in (tmp_path / "gpu_verify_paths.txt").read_text()


def test_graft_config_passes_fold_gqa_to_the_engine_and_refuses_it_for_vllm():
    from trainers import GraftConfig

    assert GraftConfig(fold_gqa=True).engine_config().fold_gqa is True
    assert GraftConfig().engine_config().fold_gqa is False
    with pytest.raises(ValueError, match=r"\['fold_gqa'\] apply to backend='engine' only"):
        GraftConfig(backend="vllm", fold_gqa=True)
    with pytest.raises(TypeError, match="fold_gqa"):
        GraftConfig(fold_gqa="yes")


def test_a_call_without_the_engines_mask_is_transformers_own(target):
    """No mask (a plain causal call): `folded_sdpa` hands it to transformers' SDPA path unchanged."""
    from rollout_graft.attention import folded_sdpa

    q, k = torch.randn(2, 6, 5, 32), torch.randn(2, 2, 5, 32)
    attention = target.model.layers[0].self_attn
    out, _ = folded_sdpa(attention, q, k, k, None, scaling=0.2)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.testing.assert_close(out, sdpa_attention_forward(attention, q, k, k, None, scaling=0.2)[0])


def test_a_bench_methods_fold_suffix_is_that_method_folded():
    from rollout_graft_tools.bench_engine import variant

    plain, folded_ar = variant("ar", 60, None), variant("ar-fold", 60, None)
    assert (plain.method, plain.fold_gqa, folded_ar.method, folded_ar.fold_gqa) == ("ar", False, "ar", True)
    cfg = variant("retrieval+recall+dcut-fold@30", 60, None)
    assert (cfg.budget_policy, cfg.budget, cfg.fold_gqa, cfg.retrieval.recall) == ("dcut", 30, True, 4)
    with pytest.raises(SystemExit, match="unknown engine method"):
        variant("nothing-fold", 60, None)
