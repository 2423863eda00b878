"""Seed-exactness: with one seed, every method emits the tokens plain "ar" sampling emits.

The uniform behind the token at completion position t of row r is hash(seed, r, t)
(`sampling.uniforms`), so neither the trees, nor D-cut's timing-driven widths, nor the waves, nor
what an index or the recall memory learnt in earlier calls can change a token — only the speed.
The strongest losslessness check: it compares samples one by one, not their distribution (the
chi-square tests in test_lossless.py check the sampler itself). Larger run: lab/seed_exact.py.
"""

import pytest
import torch
from conftest import load_script
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_graft import DCutConfig, EngineConfig, RolloutEngine, SamplingParams
from rollout_graft.assets import TINY_DRAFT, TINY_TARGET, load_tiny_prompts
from rollout_graft.sampling import row_keys, uniforms

M64 = 2**64 - 1


def splitmix_reference(x: int) -> int:
    """splitmix64's finaliser on Python ints (the published constants)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def test_uniforms_are_splitmix64_of_seed_row_position():
    golden = 0x9E3779B97F4A7C15
    seed = 2**64 - 5  # the top bit set: int64 wrap-around and logical shifts must agree with uint64
    keys = row_keys(seed, 3)
    positions = torch.tensor([[0, 1, 1000]])
    u = uniforms(keys.unsqueeze(1), positions)  # [3 rows, 3 positions]
    for r in range(3):
        key = splitmix_reference((splitmix_reference(seed) + r * golden) & M64)
        for j, t in enumerate(positions[0].tolist()):
            expected = (splitmix_reference((key + t * golden) & M64) >> 40) / 2**24
            assert u[r, j].item() == expected
    many = uniforms(row_keys(0, 64).unsqueeze(1), torch.arange(256).unsqueeze(0))
    assert many.dtype == torch.float32 and 0.0 <= many.min() and many.max() < 1.0
    assert abs(many.mean().item() - 0.5) < 0.01 and many.flatten().unique().numel() > 16_000


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    tok = AutoTokenizer.from_pretrained(TINY_TARGET)
    target = AutoModelForCausalLM.from_pretrained(TINY_TARGET, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(TINY_DRAFT, dtype=torch.float32).eval()
    prompts = [tok(r["prompt"])["input_ids"] for r in load_tiny_prompts("test")[:3]]
    return tok, target, draft, [p for p in prompts for _ in range(4)]  # 3 groups of 4 rows


METHODS = load_script("lab/seed_exact.py").METHODS  # the configurations the large check counts
PARAMS = SamplingParams(temperature=1.0, top_k=30, top_p=0.95, min_p=0.02, max_new_tokens=24, seed=7)


@pytest.mark.parametrize("policy", ["fixed", "dcut"])
def test_every_method_fresh_and_warm_emits_ar_tokens(tiny, policy):
    tok, target, draft, rows = tiny
    ar = RolloutEngine(target, tokenizer=tok).generate(rows, PARAMS)
    assert len({tuple(c) for c in ar.completion_ids}) > 3  # rows of one group are distinct streams (3 prompts)
    for name, kw in METHODS.items():
        engine = RolloutEngine(target, EngineConfig(budget=24, budget_policy=policy, dcut=DCutConfig(ratios=(0.5, 1.0)), **kw),
                               tokenizer=tok, draft_model=draft if name == "graft" else None)
        if policy == "dcut" and name == "group_lead":
            engine.speculative_share = 1.0  # D-cut runs waves only after a rollout that speculated
        for warmth in ("fresh", "warm"):
            out = engine.generate(rows, PARAMS)
            assert out.completion_ids == ar.completion_ids, (name, policy, warmth)
            assert out.finish_reasons == ar.finish_reasons, (name, policy, warmth)
            for lp, ref in zip(out.logprobs, ar.logprobs):
                assert torch.allclose(torch.tensor(lp), torch.tensor(ref), atol=1e-4), (name, policy, warmth)
            if policy == "fixed" and warmth == "fresh":
                assert out.stats.mean_accepted_tokens > 1.5, name  # the trees did the work
            engine.generate(rows[::-1], SamplingParams(max_new_tokens=12, seed=99))  # warm it on other rollouts


def test_seed_selects_the_streams(tiny):
    """Another seed gives other completions; a row keeps its stream when others join or finish."""
    tok, target, _, rows = tiny
    engine = RolloutEngine(target, EngineConfig(method="retrieval", budget=16), tokenizer=tok)
    a = engine.generate(rows, PARAMS)
    b = engine.generate(rows, SamplingParams(temperature=1.0, max_new_tokens=24, seed=8))
    assert sum(x != y for x, y in zip(a.completion_ids, b.completion_ids)) > 3
    first = engine.generate(rows[:5], PARAMS)  # the same row indices 0..4 in a smaller call
    assert first.completion_ids == a.completion_ids[:5]
