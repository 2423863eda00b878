"""GraftGRPOTrainer accepts what TRL's GRPOTrainer accepts on its own generate path, or refuses it
when the trainer is built with a message naming the fix: `generation_kwargs` that leave plain
sampling's distribution unchanged or that the engine samples with, every `loss_type` (vespo
included), and hybrid / recurrent models (refused: the engine cannot verify drafts on them).
TRL's own GRPO test file against both classes: lab/trl_grpo_tests.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest
import torch
from transformers import AutoConfig
from trl import GRPOConfig
from trl_helpers import char_tokenizer, length_reward, prompt_dataset, tiny_policy

from rollout_graft.config import EngineConfig
from rollout_graft.engine import RolloutEngine
from rollout_graft.runner import recurrent_layers
from trainers import GraftGRPOTrainer
from trainers.config import engine_sampling_overrides

pytestmark = pytest.mark.usefixtures("one_thread")


def grpo_args(tmp_path, **overrides) -> GRPOConfig:
    kwargs = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                  max_steps=1, logging_steps=1, learning_rate=1e-2, report_to="none", save_strategy="no", use_cpu=True,
                  bf16=False, disable_tqdm=True, seed=0)
    return GRPOConfig(**{**kwargs, **overrides})


def build(tmp_path, model=None, **overrides) -> GraftGRPOTrainer:
    tok = char_tokenizer()
    return GraftGRPOTrainer(model if model is not None else tiny_policy(len(tok)), length_reward,
                            args=grpo_args(tmp_path, **overrides), train_dataset=prompt_dataset(), processing_class=tok)


# ---------------------------------------------------------------------------- generation_kwargs
@pytest.mark.parametrize("kwargs, sampling", [
    ({"do_sample": True, "num_beams": 1, "length_penalty": -0.1}, {}),  # change nothing without beams
    ({"top_k": 50}, {"top_k": 50}),  # sampling controls the engine has: used, as TRL's generate uses them
    ({"top_p": 0.9, "min_p": 0.05, "temperature": 0.7}, {"top_p": 0.9, "min_p": 0.05, "temperature": 0.7}),
    ({"max_new_tokens": 8, "repetition_penalty": 1.0, "use_cache": True}, {}),
    ({"repetition_penalty": 1.1}, {"repetition_penalty": 1.1}),  # the engine penalizes as TRL's generate does
])
def test_generation_kwargs_the_engine_honours_are_accepted_and_used(tmp_path, kwargs, sampling):
    trainer = build(tmp_path, generation_kwargs=kwargs, top_k=3)
    params = trainer._sampling_params()
    expected = {"temperature": 1.0, "top_k": 3, "top_p": 1.0, "min_p": 0.0, **sampling}
    assert {k: getattr(params, k) for k in expected} == pytest.approx(expected)


@pytest.mark.parametrize("kwargs, named", [
    ({"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1}, ["num_beams=2", "length_penalty=-0.1"]),
    ({"do_sample": False}, ["do_sample=False"]),
    ({"no_repeat_ngram_size": 3, "top_k": 5}, ["no_repeat_ngram_size=3"]),
    ({"max_new_tokens": 99}, ["max_new_tokens=99"]),
    ({"bad_words_ids": [[5]]}, ["bad_words_ids=[[5]]"]),
])
def test_generation_kwargs_that_change_the_distribution_are_refused_by_name(tmp_path, kwargs, named):
    with pytest.raises(ValueError, match="generation_kwargs") as err:
        build(tmp_path, generation_kwargs=kwargs)
    for item in named:
        assert item in str(err.value)
    assert "top_k" not in str(err.value).split("would change")[0]  # an honoured key is never named as refused


def test_a_bad_sampling_value_in_generation_kwargs_is_named():
    with pytest.raises(ValueError, match="top_p"):
        engine_sampling_overrides({"top_p": 1.5}, 8)
    with pytest.raises(ValueError, match="greedy"):
        engine_sampling_overrides({"temperature": 0}, 8)


# ---------------------------------------------------------------------------- loss types
@pytest.mark.parametrize("loss_type", ["vespo", "cispo", "sapo", "luspo"])
def test_every_loss_type_trl_trains_on_its_generate_path_trains_on_the_engine(tmp_path, loss_type):
    trainer = build(tmp_path, loss_type=loss_type, importance_sampling_level="sequence" if loss_type == "luspo" else "token")
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    step = next(h for h in trainer.state.log_history if "loss" in h)
    assert torch.isfinite(torch.tensor(step["loss"]))
    assert any(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in before.items())


def test_grpo_repetition_penalty_trains_on_the_engine(tmp_path):
    """GRPOConfig.repetition_penalty, which TRL's generate applies, reaches the engine's sampling; the
    logprobs the rollout returns stay the unpenalized ones TRL's forward recomputes (ratio 1)."""
    trainer = build(tmp_path, repetition_penalty=1.2, generation_kwargs={"top_k": 5})
    assert trainer._sampling_params().repetition_penalty == 1.2
    trainer.train()
    step = next(h for h in trainer.state.log_history if "loss" in h)
    assert step["sampling/sampling_logp_difference/max"] < 1e-5
    assert build(tmp_path, repetition_penalty=1.2, generation_kwargs={"repetition_penalty": 1.05})._sampling_params(
    ).repetition_penalty == 1.05  # generation_kwargs override, as on TRL's generate path


# ---------------------------------------------------------------------------- hybrid / recurrent models
def tiny_nemotron_h(vocab: int):
    """A random 2-layer hybrid Nemotron-H (one Mamba-2 layer, one attention layer)."""
    from transformers import NemotronHForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("nemotron_h", vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, layers_block_type=["mamba", "attention"], num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=8, mamba_num_heads=4, mamba_head_dim=8,
                                  ssm_state_size=8, n_groups=1, chunk_size=8, eos_token_id=1, pad_token_id=0)
    return NemotronHForCausalLM(config)


def test_a_hybrid_model_is_refused_when_the_trainer_is_built(tmp_path):
    tok = char_tokenizer()
    with pytest.raises(ValueError, match="recurrent layers") as err:
        build(tmp_path, model=tiny_nemotron_h(len(tok)))
    assert "backend='vllm'" in str(err.value) and "GRPOTrainer" in str(err.value)


def test_the_engine_refuses_a_hybrid_model_too():
    with pytest.raises(ValueError, match="recurrent layers"):
        RolloutEngine(tiny_nemotron_h(40), EngineConfig(method="ar"))


@pytest.mark.parametrize("model_type", ["nemotron_h", "jamba", "qwen3_next", "falcon_h1", "mamba2", "bamba", "mamba"])
def test_recurrent_architectures_are_recognised(model_type):
    assert recurrent_layers(AutoConfig.for_model(model_type))


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "llama", "gemma2", "cohere2", "gpt_oss", "qwen3_moe", "glm4_moe"])
def test_attention_architectures_are_not_refused(model_type):
    assert recurrent_layers(AutoConfig.for_model(model_type)) == []


# ---------------------------------------------------------------------------- the lab's stand-ins
def test_the_qwen3_standins_carry_a_tool_capable_chat_template(tmp_path):
    """TRL's tools= / environment_factory tests build the trainer on its Qwen3 ids: their stand-ins must
    pass TRL's tool-calling template check (the tiny-math template renders no tool calls)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import supports_tool_calling

    from rollout_graft.assets import TINY_TARGET
    from rollout_graft_tools.trl_standins import RANDOM_MODELS, TOOL_TEMPLATE, _random_model

    assert not supports_tool_calling(AutoTokenizer.from_pretrained(TINY_TARGET))
    for name in TOOL_TEMPLATE:
        _random_model(name, *RANDOM_MODELS[name], tmp_path / name)
        assert supports_tool_calling(AutoTokenizer.from_pretrained(tmp_path / name)), name
