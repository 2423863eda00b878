import json

import pytest
import torch
from conftest import load_script


@pytest.fixture(scope="module")
def eval_heldout():
    return load_script("lab/eval_heldout.py")


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()  # main() sets --threads for the whole process
    yield
    torch.set_num_threads(threads)


def test_eval_heldout_is_deterministic_and_complete(eval_heldout, keep_threads, tmp_path, capsys):
    argv = ["--num-prompts", "4", "--samples", "3", "--seed", "5", "--max-new-tokens", "96"]
    first = eval_heldout.main([*argv, "--json", str(tmp_path / "a.json")])
    second = eval_heldout.main([*argv, "--json", str(tmp_path / "b.json")])
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    for res in (a, b):
        res.pop("generate_seconds")
    assert a == b  # same seed: same samples, same scores
    assert a["num_prompts"] == 4 and a["samples"] == 3 and a["num_samples"] == 12
    assert len(a["correct_per_prompt"]) == 4 and all(0 <= c <= 3 for c in a["correct_per_prompt"])
    assert a["accuracy"] == sum(a["correct_per_prompt"]) / 12 == first["accuracy"] == second["accuracy"]
    assert 0 <= a["format_rate"] <= 1 and 0 <= a["eos_rate"] <= 1
    assert a["format_rate"] > 0.5  # the embedded target writes the `#### N` format almost always
    assert a["config"] == {**a["config"], "temperature": 1.0, "seed": 5, "max_new_tokens": 96, "method": "ar",
                           "split": "test", "threads": 1}
    out = capsys.readouterr().out
    assert "accuracy" in out and "format rate" in out


def test_eval_heldout_defaults_follow_the_recipe(eval_heldout):
    recipe = load_script("recipes/grpo_qwen3.py")
    assert eval_heldout.evaluate.__kwdefaults__["max_new_tokens"] == recipe.RECIPE_DEFAULTS["max_completion_length"]
    assert recipe.ScriptArguments().eval_split == eval_heldout.evaluate.__kwdefaults__["split"]
