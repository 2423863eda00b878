"""The repetition penalty (`SamplingParams.repetition_penalty`, TRL's `GRPOConfig.repetition_penalty`):
HF's rule, the same greedy tokens as HF `generate`, and seed-exact under every method."""

from dataclasses import replace

import pytest
import torch
from conftest import load_script, random_model
from proposers import OracleProposer
from transformers import AutoModelForCausalLM, AutoTokenizer, RepetitionPenaltyLogitsProcessor

from rollout_graft import DCutConfig, EngineConfig, RetrievalConfig, RolloutEngine, SamplingParams
from rollout_graft.assets import TINY_DRAFT, TINY_TARGET, load_tiny_prompts
from rollout_graft.sampling import penalize

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [5, 6, 7, 8, 9], [3], [20, 21, 22, 23, 24, 25, 26], [10, 11]]
MAX_NEW = 24


def test_penalize_is_hf_repetition_penalty_processor():
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 4
    ids = torch.tensor([[1, 2, 2, 49], [0, 7, 8, 9], [30, 30, 30, 30]])
    seen = torch.zeros(3, 51, dtype=torch.bool).scatter(1, ids, True)
    for penalty in (0.7, 1.3):
        expected = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
        assert torch.equal(penalize(logits, seen, penalty), expected)


def hf_greedy(model, prompts, penalty):
    outs = []
    for p in prompts:  # one prompt a call: HF's batched generate would penalize its left padding too
        g = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=MAX_NEW, repetition_penalty=penalty,
                           eos_token_id=1, pad_token_id=0)
        outs.append(g[0, len(p):].tolist())
    return outs


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_greedy_with_penalty_equals_hf_generate_for_plain_and_trees(penalty):
    model = random_model(vocab=64)  # a small vocabulary: most steps meet a token already seen
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW, repetition_penalty=penalty)
    ar = RolloutEngine(model).generate(PROMPTS, greedy)
    assert ar.completion_ids == hf_greedy(model, PROMPTS, penalty)
    assert ar.completion_ids != RolloutEngine(model).generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=MAX_NEW)).completion_ids
    for kind in ("right", "partly"):  # trees whose paths hold repeated tokens: each node penalizes its own path
        proposer = OracleProposer(ar.completion_ids, model.config.vocab_size, kind, depth=4, max_new_tokens=MAX_NEW)
        spec = RolloutEngine(model, EngineConfig(budget=16), proposer=proposer).generate(PROMPTS, greedy)
        assert spec.completion_ids == ar.completion_ids and spec.finish_reasons == ar.finish_reasons
        if kind == "right":
            assert spec.stats.mean_accepted_tokens > 3.0
    for policy in ("fixed", "dcut"):
        cfg = EngineConfig(method="retrieval", budget=16, budget_policy=policy, retrieval=RetrievalConfig(suffix_depth=4),
                           dcut=DCutConfig(ratios=(0.5, 1.0)))
        assert RolloutEngine(model, cfg).generate(PROMPTS, greedy).completion_ids == ar.completion_ids


def test_every_method_with_penalty_emits_ar_tokens():
    """Seed-exact (test_seed_exact.py) with the penalty on, T = 1: every method, fresh and warm."""
    tok = AutoTokenizer.from_pretrained(TINY_TARGET)
    target = AutoModelForCausalLM.from_pretrained(TINY_TARGET, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(TINY_DRAFT, dtype=torch.float32).eval()
    rows = [p for r in load_tiny_prompts("test")[:2] for p in [tok(r["prompt"])["input_ids"]] * 4]
    params = SamplingParams(temperature=1.0, top_k=30, max_new_tokens=24, seed=5, repetition_penalty=1.2)
    ar = RolloutEngine(target, tokenizer=tok).generate(rows, params)
    unpenalized = RolloutEngine(target, tokenizer=tok).generate(rows, replace(params, repetition_penalty=1.0))
    assert ar.completion_ids != unpenalized.completion_ids
    for lp, ref in zip(ar.logprobs, RolloutEngine(target, tokenizer=tok).generate(rows, params).logprobs):
        assert lp == ref
    for name, kw in load_script("lab/seed_exact.py").METHODS.items():
        engine = RolloutEngine(target, EngineConfig(budget=24, **kw), tokenizer=tok, draft_model=draft if name == "graft" else None)
        for warmth in ("fresh", "warm"):
            out = engine.generate(rows, params)
            assert out.completion_ids == ar.completion_ids, (name, warmth)
            for lp, ref in zip(out.logprobs, ar.logprobs):  # unpenalized logprobs, as TRL recomputes them
                assert torch.allclose(torch.tensor(lp), torch.tensor(ref), atol=1e-4), (name, warmth)


@pytest.mark.parametrize("value, error", [(0.0, ValueError), (-1.1, ValueError), (float("nan"), ValueError),
                                          (float("inf"), ValueError), (True, TypeError), ("1.1", TypeError)])
def test_bad_penalty_is_named(value, error):
    with pytest.raises(error, match="repetition_penalty"):
        SamplingParams(repetition_penalty=value)
