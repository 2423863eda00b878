"""lab/op_counts.py: operators per decode step counted inside and outside the target's forward."""

import torch
from conftest import load_script
from transformers import AutoModelForCausalLM

from rollout_graft.assets import TINY_TARGET


def test_op_counts_split_the_model_from_the_step():
    lab = load_script("lab/op_counts.py")
    model = AutoModelForCausalLM.from_pretrained(TINY_TARGET, dtype=torch.float32).eval()
    marked = lab.counting(model)
    prompts = [[5, 6, 7, 8]] * 2
    hf, ar, again = (lab.cell(model, marked, prompts, m, 4) for m in ("hf", "ar", "ar"))
    assert hf["steps"] == ar["steps"] == 4
    assert ar == again  # counts, not timings: the same code and shapes give the same figures
    layers = model.config.num_hidden_layers
    for c in (hf, ar):
        assert c["in_model"] > 10 * layers and c["ops_per_step"] == c["in_model"] + c["outside"]
    assert ar["outside"] > hf["outside"]  # the engine's step (masks, walk, bookkeeping) beside HF's sampling
