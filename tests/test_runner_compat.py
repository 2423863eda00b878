"""ModelRunner passes the KV cache by the keyword the model's forward takes (issue 15): a keyword the
model does not know disappears into **kwargs and the model silently runs without our cache."""

import torch
import transformers
from packaging import version

from rollout_graft.runner import cache_keyword


class _Old(torch.nn.Module):  # transformers < 5.24
    def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs): ...


class _New(torch.nn.Module):  # transformers >= 5.24
    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs): ...


class _Wrapper(torch.nn.Module):  # PEFT-style: forwards **kwargs, names neither
    def forward(self, *args, **kwargs): ...


def test_the_keyword_is_read_off_the_forward_signature():
    assert cache_keyword(_Old()) == "past_key_values"
    assert cache_keyword(_New()) == "cache"


def test_a_kwargs_wrapper_falls_back_to_the_installed_transformers():
    new = version.parse(transformers.__version__) >= version.parse("5.24")
    assert cache_keyword(_Wrapper()) == ("cache" if new else "past_key_values")


def test_the_installed_models_take_the_chosen_keyword(qwen3_model):
    import inspect

    assert cache_keyword(qwen3_model) in inspect.signature(qwen3_model.forward).parameters
