"""Losslessness of tree verification: greedy identity, sampled distribution, logprobs, seeds."""

import math
from dataclasses import replace

import pytest
import torch
from conftest import random_model
from proposers import OracleProposer, RandomTreeProposer
from scipy.stats import chisquare

from rollout_graft import DCutConfig, EngineConfig, RetrievalConfig, RolloutEngine, SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [5, 6, 7, 8, 9], [3], [20, 21, 22, 23, 24, 25, 26], [10, 11]]
MAX_NEW = 24
ALPHA = 1e-4  # chi-square significance; the negative control below must fall under it


def hf_greedy(model, prompts, max_new):
    outs = []
    for p in prompts:
        g = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=max_new, eos_token_id=1, pad_token_id=0)
        outs.append(g[0, len(p):].tolist())
    return outs


@pytest.mark.parametrize("kind", ["right", "partly", "wrong"])
def test_greedy_tree_equals_ar_and_hf_generate(arch_model, kind):
    model = arch_model
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    ar = RolloutEngine(model).generate(PROMPTS, greedy)
    assert ar.completion_ids == hf_greedy(model, PROMPTS, MAX_NEW)
    proposer = OracleProposer(ar.completion_ids, model.config.vocab_size, kind, depth=4, max_new_tokens=MAX_NEW)
    spec = RolloutEngine(model, EngineConfig(budget=16), proposer=proposer).generate(PROMPTS, greedy)
    assert spec.completion_ids == ar.completion_ids
    assert spec.finish_reasons == ar.finish_reasons
    if kind == "right":  # whole chains accepted: 4 candidates + bonus per forward
        assert spec.stats.mean_accepted_tokens > 3.0
    if kind == "wrong":  # nothing accepted, one token per forward like plain decoding
        assert spec.stats.mean_accepted_tokens == pytest.approx(1.0)


def test_greedy_retrieval_equals_ar(arch_model):
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    ar = RolloutEngine(arch_model).generate(PROMPTS, greedy)
    for share, policy, suffix, lead in ((True, "fixed", 0, 0), (False, "fixed", 0, 0), (True, "dcut", 0, 0),
                                        (True, "fixed", 6, 0), (True, "fixed", 6, 1), (False, "dcut", 4, 1)):
        cfg = EngineConfig(method="retrieval", budget=16, retrieval=RetrievalConfig(share_in_group=share, suffix_depth=suffix),
                           budget_policy=policy, dcut=DCutConfig(ratios=(0.5, 1.0)), group_lead=lead)
        engine = RolloutEngine(arch_model, cfg)
        spec = engine.generate(PROMPTS, greedy)
        assert spec.completion_ids == ar.completion_ids and spec.finish_reasons == ar.finish_reasons
        assert spec.stats.mean_accepted_tokens > 1.0 or policy == "dcut"
        if policy == "dcut" and lead:  # D-cut runs waves once a rollout speculated in most steps
            engine.speculative_share = 1.0
            assert len(engine._waves([0, 0, 1, 1])) == 2
            spec = engine.generate(PROMPTS, greedy)
            assert spec.completion_ids == ar.completion_ids and spec.finish_reasons == ar.finish_reasons


def test_greedy_stops_at_eos_like_hf():
    model = random_model("qwen3", vocab=64, seed=3)
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12]]
    # make EOS the likely continuation of token 40 so some completions stop early
    ar_probe = RolloutEngine(model).generate(prompts, SamplingParams(temperature=0, max_new_tokens=40))
    stop_tok = ar_probe.completion_ids[0][3]
    params = SamplingParams(temperature=0, max_new_tokens=40, stop_token_ids=[stop_tok])
    ar = RolloutEngine(model).generate(prompts, params)
    assert ar.finish_reasons[0] == "stop" and ar.completion_ids[0][-1] == stop_tok
    assert len(ar.completion_ids[0]) == 4
    proposer = OracleProposer(ar_probe.completion_ids, 64, "right", depth=6, max_new_tokens=40)
    spec = RolloutEngine(model, proposer=proposer).generate(prompts, params)
    assert spec.completion_ids == ar.completion_ids and spec.finish_reasons == ar.finish_reasons


def exact_two_token_probs(model, prompt, params):
    """p(t1, t2 | prompt) under the warped target, by brute force. Returns [V, V]."""
    from rollout_graft.sampling import target_probs

    v = model.config.vocab_size
    with torch.no_grad():
        p1 = target_probs(model(torch.tensor([prompt])).logits[0, -1], params)  # [V]
        seqs = torch.tensor([prompt + [t] for t in range(v)])
        p2 = target_probs(model(seqs).logits[:, -1], params)  # [V, V]
    return p1.unsqueeze(1) * p2


def chi2_pvalue(samples: list[tuple[int, int]], probs: torch.Tensor) -> float:
    """Chi-square goodness of fit; cells with expected count < 5 are pooled."""
    n = len(samples)
    counts = torch.zeros_like(probs)
    for a, b in samples:
        counts[a, b] += 1
    exp = probs.flatten() * n
    obs = counts.flatten()
    big = exp >= 5
    f_obs = torch.cat([obs[big], obs[~big].sum().view(1)])
    f_exp = torch.cat([exp[big], exp[~big].sum().view(1)])
    if f_exp[-1] < 5:  # fold a tiny pooled cell into the largest one
        f_obs, f_exp = f_obs[:-1].clone(), f_exp[:-1].clone()
        f_obs[f_exp.argmax()] += obs[~big].sum()
        f_exp[f_exp.argmax()] += exp[~big].sum()
    f_exp = f_exp * f_obs.sum() / f_exp.sum()
    return float(chisquare(f_obs.numpy(), f_exp.numpy()).pvalue)


SAMPLING_CASES = [
    SamplingParams(temperature=1.0, max_new_tokens=2, ignore_eos=True, seed=1),
    SamplingParams(temperature=0.7, top_k=6, max_new_tokens=2, ignore_eos=True, seed=2),
    SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=2, ignore_eos=True, seed=3),
    SamplingParams(temperature=1.0, min_p=0.1, top_k=10, max_new_tokens=2, ignore_eos=True, seed=4),
]


def _engines(model):
    yield "random-tree", RolloutEngine(model, EngineConfig(budget=42), proposer=RandomTreeProposer(16, 6, 2, seed=0))
    yield "retrieval", RolloutEngine(model, EngineConfig(method="retrieval", budget=30))
    yield "retrieval+dcut", RolloutEngine(model, EngineConfig(method="retrieval", budget=30, budget_policy="dcut",
                                                              dcut=DCutConfig(ratios=(0.5, 1.0))))
    yield "retrieval+suffix+lead", RolloutEngine(model, EngineConfig(method="retrieval", budget=30, group_lead=2,
                                                                     retrieval=RetrievalConfig(suffix_depth=4)))
    yield "retrieval+recall", RolloutEngine(model, EngineConfig(method="retrieval", budget=30,
                                                                retrieval=RetrievalConfig(suffix_depth=4, recall=8)))
    yield "ar", RolloutEngine(model)


@pytest.mark.parametrize("params", SAMPLING_CASES, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_tree_sampling_matches_target_distribution(params):
    model = random_model("qwen3", vocab=16, seed=7, sharp=5.0)
    prompt, n = [3, 4, 5, 3, 4, 6, 5, 3], 4000  # repeats give retrieval something to draft from
    probs = exact_two_token_probs(model, prompt, params)
    for name, engine in _engines(model):
        if name == "retrieval+recall":  # a first rollout of the prompt fills the memory the measured one reads
            engine.generate([prompt] * 16, replace(params, seed=99))
        out = engine.generate([prompt] * n, params)
        if name not in ("ar", "retrieval+dcut"):
            assert out.stats.mean_accepted_tokens > 1.1, name  # the trees were actually used
        p_value = chi2_pvalue([tuple(c) for c in out.completion_ids], probs)
        assert p_value > ALPHA, (name, p_value)


def test_distribution_test_detects_a_wrong_sampler():
    """Negative control: the same check rejects samples drawn at another temperature."""
    model = random_model("qwen3", vocab=16, seed=7, sharp=5.0)
    prompt, n = [3, 4, 5], 4000
    params = SamplingParams(temperature=1.0, max_new_tokens=2, ignore_eos=True, seed=5)
    wrong = SamplingParams(temperature=0.7, max_new_tokens=2, ignore_eos=True, seed=5)
    out = RolloutEngine(model).generate([prompt] * n, wrong)
    assert chi2_pvalue([tuple(c) for c in out.completion_ids], exact_two_token_probs(model, prompt, params)) < ALPHA


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_logprobs_equal_full_recompute(arch_model, temperature):
    model = arch_model
    params = SamplingParams(temperature=temperature, top_k=20, max_new_tokens=16, seed=11)
    proposer = RandomTreeProposer(vocab=model.config.vocab_size, width=3, depth=3, seed=1)
    engines = (RolloutEngine(model), RolloutEngine(model, EngineConfig(budget=12), proposer=proposer),
               RolloutEngine(model, EngineConfig(method="retrieval", budget=12)),
               RolloutEngine(model, EngineConfig(method="retrieval", budget=12, group_lead=1,
                                                 retrieval=RetrievalConfig(suffix_depth=6))))
    for engine in engines:
        assert_logprobs_match_recompute(model, PROMPTS, engine.generate(PROMPTS, params), temperature)


def assert_logprobs_match_recompute(model, prompts, out, temperature):
    """Returned logprobs = log_softmax(model(prompt + completion).logits / T) within 1e-4."""
    scale = temperature if temperature > 0 else 1.0
    for p, c, lp in zip(prompts, out.completion_ids, out.logprobs):
        assert len(c) == len(lp) > 0
        with torch.no_grad():
            logits = model(torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
        ref = torch.log_softmax(logits / scale, -1).gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(torch.tensor(lp), ref, atol=1e-4)
        assert all(math.isfinite(x) for x in lp)


@pytest.mark.parametrize("method", ["random-tree", "retrieval", "retrieval+suffix+lead", "ar"])
def test_seeded_runs_repeat_and_siblings_differ(qwen3_model, method):
    prompts = [[5, 6, 7]] * 8
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=123)
    if method == "random-tree":
        make = lambda: RolloutEngine(qwen3_model, EngineConfig(budget=12), proposer=RandomTreeProposer(64, seed=4))  # noqa: E731
    elif method == "retrieval+suffix+lead":
        cfg = EngineConfig(method="retrieval", budget=12, group_lead=2, retrieval=RetrievalConfig(suffix_depth=6))
        make = lambda: RolloutEngine(qwen3_model, cfg)  # noqa: E731
    else:
        make = lambda: RolloutEngine(qwen3_model, EngineConfig(method=method, budget=12))  # noqa: E731
    a, b = make().generate(prompts, params), make().generate(prompts, params)
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert len({tuple(c) for c in a.completion_ids}) > 1  # siblings of a group are independent samples
    c = make().generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=12, seed=124))
    assert c.completion_ids != a.completion_ids
