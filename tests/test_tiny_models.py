"""End to end on the embedded tiny Qwen3 target: real tokenizer, real prompts."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_graft import EngineConfig, RolloutEngine, SamplingParams
from rollout_graft.assets import TINY_TARGET, load_tiny_prompts


def test_tiny_target_greedy_matches_hf_generate_for_every_method():
    tok = AutoTokenizer.from_pretrained(TINY_TARGET)
    model = AutoModelForCausalLM.from_pretrained(TINY_TARGET).eval()
    texts = [r["prompt"] for r in load_tiny_prompts("test")[:3]]
    prompts = [tok(t)["input_ids"] for t in texts]
    rows = [prompts[0], prompts[1], prompts[0], prompts[2], prompts[1]]  # ragged, repeated
    params = SamplingParams(temperature=0, max_new_tokens=96)
    refs = []
    for p in rows:
        g = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=96)
        refs.append(g[0, len(p):].tolist())
    for cfg in (EngineConfig(method="ar"), EngineConfig(method="retrieval"),
                EngineConfig(method="retrieval", budget_policy="dcut")):
        out = RolloutEngine(model, cfg, tokenizer=tok).generate(rows, params)
        assert out.completion_ids == refs, cfg.method
        assert all(r == "stop" and c[-1] == tok.eos_token_id for r, c in zip(out.finish_reasons, out.completion_ids))
        if cfg.method == "retrieval" and cfg.budget_policy == "fixed":
            assert out.stats.mean_accepted_tokens > 2.0  # templated arithmetic: retrieval pays


def test_bf16_runs_on_every_path():
    """bf16 (the usual training dtype) through the same runner: finite logprobs, EOS stops."""
    tok = AutoTokenizer.from_pretrained(TINY_TARGET)
    model = AutoModelForCausalLM.from_pretrained(TINY_TARGET, dtype=torch.bfloat16).eval()
    rows = [tok(load_tiny_prompts("test")[0]["prompt"])["input_ids"]] * 2
    params = SamplingParams(temperature=1.0, max_new_tokens=96, seed=3)
    for cfg in (EngineConfig(method="ar"), EngineConfig(method="retrieval")):
        out = RolloutEngine(model, cfg, tokenizer=tok).generate(rows, params)
        assert all(torch.isfinite(torch.tensor(lp)).all() for lp in out.logprobs)
        assert all(c[-1] == tok.eos_token_id for c in out.completion_ids)
