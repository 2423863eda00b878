import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import atexit
import shutil
import tempfile

# one cost-profile cache per test session (profiles are keyed by model shape, device, dtype, threads),
# removed when the session ends
if "ROLLOUT_GRAFT_CACHE" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="rollout_graft_test_cache_")
    os.environ["ROLLOUT_GRAFT_CACHE"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from rollout_graft.tree import Draft

torch.set_num_threads(2)

ARCHS = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}


def draft_with_scores(trees):
    """trees: per row, list of (parent, score); tokens are 10 + node index."""
    d = Draft.from_lists([[(10 + i, p) for i, (p, _) in enumerate(t)] for t in trees])
    for r, t in enumerate(trees):
        for i, (_, s) in enumerate(t):
            d.score[r, i] = s
    return d


def random_model(arch: str = "qwen3", vocab: int = 64, seed: int = 0, sharp: float = 4.0):
    """A tiny random causal LM. `sharp` scales the output layer so distributions are peaked
    enough that greedy paths are stable and speculative trees get accepted."""
    cfg_cls, model_cls = ARCHS[arch]
    torch.manual_seed(seed)
    cfg = cfg_cls(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=1, pad_token_id=0, bos_token_id=2, tie_word_embeddings=False,
        **({"head_dim": 8} if arch == "qwen3" else {}),
    )
    model = model_cls(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharp)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads; on shared cores extra threads cost many times
    (use per module: `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=list(ARCHS))
def arch_model(request):
    return random_model(request.param)


@pytest.fixture
def qwen3_model():
    return random_model("qwen3")


def require_extra(module: str, extra: str) -> None:
    """Skip the calling test module when `module` is missing, naming the extra that brings it; where
    ROLLOUT_GRAFT_REQUIRE_EXTRAS=1 (CI, after installing the extras) a missing module fails instead, so
    a broken extras install can never pass as skips."""
    import importlib.util

    if os.environ.get("ROLLOUT_GRAFT_REQUIRE_EXTRAS") == "1":
        if importlib.util.find_spec(module) is None:
            raise ImportError(f"{module} is missing although ROLLOUT_GRAFT_REQUIRE_EXTRAS=1: "
                              f"pip install -e '.[{extra}]'")
        return
    pytest.importorskip(module, reason=f"needs the {extra} extra: pip install -e '.[{extra}]'")


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` (real downloads, long real-model runs) run only with `-m slow`."""
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="opt-in: run with `pytest -m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def load_script(relpath: str):
    """Import a repo script (scripts/…, lab/…, recipes/…) by its file path, registered under its file
    name; its folder is not put on sys.path (scripts import the installed package, never each other)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
