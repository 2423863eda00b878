"""A drafter checkpoint that would draft garbage is refused at load; a reload keeps the old drafter."""

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_graft import small_draft

from rollout_graft import DraftConfig, EngineConfig, RolloutEngine, SamplingParams

GREEDY = SamplingParams(temperature=0, max_new_tokens=8)


def saved_drafter(path, damage=None):
    """small_draft saved to `path`; damage(state dict) edits the weights file in place."""
    small_draft().save_pretrained(path)
    if damage is not None:
        weights = load_file(path / "model.safetensors")
        damage(weights)
        save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def nan_in_one_tensor(weights):
    name = next(k for k in weights if "mlp" in k)
    weights[name][0, 0] = float("nan")  # a valid header, corrupt data


def one_tensor_missing(weights):
    del weights[next(k for k in weights if "mlp" in k)]


def graft(model, draft):
    return RolloutEngine(model, EngineConfig(method="graft", budget=12, draft=DraftConfig()), draft_model=draft)


@pytest.mark.parametrize("damage, match", [(nan_in_one_tensor, "NaN"), (one_tensor_missing, "lacks 1 weight tensor")])
def test_a_damaged_drafter_is_refused_at_load(qwen3_model, tmp_path, damage, match):
    with pytest.raises(ValueError, match=match):
        graft(qwen3_model, saved_drafter(tmp_path / "bad", damage))


def test_a_loaded_drafter_with_nan_is_refused(qwen3_model):
    draft = small_draft()
    with torch.no_grad():
        draft.model.embed_tokens.weight[3, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN/inf .*embed_tokens"):
        graft(qwen3_model, draft)


@pytest.mark.parametrize("damage", [nan_in_one_tensor, one_tensor_missing])
def test_a_damaged_reload_keeps_the_old_drafter(qwen3_model, tmp_path, damage):
    engine = graft(qwen3_model, saved_drafter(tmp_path / "good"))
    before = engine.generate([[5, 6, 7]] * 2, GREEDY)
    drafter = engine.proposer.drafter.runner
    with pytest.raises(OSError, match="current drafter is kept"):
        engine.reload_draft_model(saved_drafter(tmp_path / "bad", damage))
    assert engine.proposer.drafter.runner is drafter  # the old drafter still drafts
    assert engine.generate([[5, 6, 7]] * 2, GREEDY).completion_ids == before.completion_ids
