"""Bad input → ValueError naming the fix; the engine stays usable afterwards."""

import pytest
import torch

from rollout_graft import EngineConfig, RolloutEngine, SamplingParams


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.0}, "min_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_invalid_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_invalid_engine_config():
    with pytest.raises(ValueError, match="unknown method"):
        EngineConfig(method="medusa")
    with pytest.raises(ValueError, match="budget"):
        EngineConfig(budget=-1)


def test_bad_prompts_raise_and_engine_recovers(qwen3_model):
    engine = RolloutEngine(qwen3_model)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[1, 2], []], params)
    with pytest.raises(ValueError, match="non-empty list"):
        engine.generate([], params)
    with pytest.raises(ValueError, match="context"):
        engine.generate([[3] * 250], SamplingParams(max_new_tokens=10))
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([[3, 64]], params)
    with pytest.raises(ValueError, match="input_ids"):  # a tokenizer's BatchEncoding instead of its ids
        engine.generate([{"input_ids": [3, 4], "attention_mask": [1, 1]}], params)
    out = engine.generate([[3, 4]], params)  # nothing was left half-done
    assert len(out.completion_ids[0]) >= 1


def test_tokenizer_vocabulary_mismatch(qwen3_model):
    from transformers import AutoTokenizer

    from rollout_graft.assets import TINY_TARGET

    tiny_tokenizer = AutoTokenizer.from_pretrained(TINY_TARGET)  # 749 tokens; the model has 64
    with pytest.raises(ValueError, match="tokenizer"):
        RolloutEngine(qwen3_model, tokenizer=tiny_tokenizer)


def test_nan_logits_raise(qwen3_model):
    with torch.no_grad():
        qwen3_model.lm_head.weight[5].fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        RolloutEngine(qwen3_model).generate([[3, 4]], SamplingParams(max_new_tokens=4))


def test_prompt_of_one_token_and_tensor_input(qwen3_model):
    engine = RolloutEngine(qwen3_model)
    out = engine.generate(torch.tensor([[7], [7]]), SamplingParams(temperature=0, max_new_tokens=5))
    ref = qwen3_model.generate(torch.tensor([[7]]), do_sample=False, max_new_tokens=5, eos_token_id=1, pad_token_id=0)
    assert out.completion_ids == [ref[0, 1:].tolist()] * 2
