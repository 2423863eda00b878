"""lab/make_tiny_models.py: an early-target snapshot is the real step-N state of the full run."""

import random

import pytest
import torch
from conftest import load_script
from transformers import Qwen3Config, Qwen3ForCausalLM


def load_builder():
    return load_script("lab/make_tiny_models.py")


def tiny_run(builder, **kwargs):
    cfg = Qwen3Config(vocab_size=24, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
                      pad_token_id=1, eos_token_id=0, bos_token_id=0, tie_word_embeddings=True)
    r = random.Random(0)
    seqs = []
    for _ in range(48):
        plen = r.randint(2, 5)
        seqs.append(([r.randrange(2, 24) for _ in range(plen + r.randint(2, 8))] + [0], plen))
    torch.manual_seed(3)
    model = Qwen3ForCausalLM(cfg)
    snapshots = {}
    builder.train_model(model, seqs, steps=12, batch_size=4, lr=3e-3, seed=5, pad_id=1, label="t",
                        log_every=1000, snapshots=snapshots, **kwargs)
    return model.state_dict(), snapshots


def test_stop_after_equals_the_snapshot_of_the_full_run():
    builder = load_builder()
    torch.set_num_threads(1)
    full, snaps = tiny_run(builder, snapshot_steps=(5,))
    early, none = tiny_run(builder, stop_after=5)  # the schedule still spans all 12 steps
    assert set(snaps) == {5} and not none
    assert all(torch.equal(early[k], snaps[5][k]) for k in full)
    assert not all(torch.equal(full[k], snaps[5][k]) for k in full)  # the snapshot is not the end state


def test_snapshot_steps_need_a_dict():
    builder = load_builder()
    with pytest.raises(ValueError, match="snapshots dict"):
        builder.train_model(None, [], steps=2, batch_size=1, lr=1e-3, seed=0, pad_id=1, label="t",
                            snapshot_steps=(1,))
