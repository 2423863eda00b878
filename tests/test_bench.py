"""scripts/bench_rollout.py end to end on the embedded tiny target (a few seconds): the JSON it writes."""

import json

from conftest import load_script


def test_bench_writes_same_run_ratios(tmp_path):
    bench = load_script("scripts/bench_rollout.py")
    out = tmp_path / "bench.json"
    methods = ["ar", "ar-twin", "retrieval@8", "retrieval+lead", "retrieval+recall+dcut"]
    bench.main(["--num-prompts", "1", "--group-size", "2", "--max-new-tokens", "12", "--ignore-eos", "--temperatures", "1.0",
                "--methods", *methods, "--repeats", "2", "--reuse-engine", "--warmup-rounds", "1",
                "--warmup-prompts", "1", "--threads", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["reuse_engine"] is True
    [entry] = result["configs"]
    assert entry["batch"] == 2 and list(entry["methods"]) == methods
    for name, m in entry["methods"].items():
        assert len(m["tokens_per_s_runs"]) == 2 and m["tokens"] == 24  # --ignore-eos: every row writes 12 tokens
        assert m["mat"] >= 1.0 and m["ratio_vs_ar"] > 0 and m["cpu_ratio_vs_ar"] > 0 and m["cpu_s"] > 0
    assert entry["methods"]["ar"]["ratio_vs_ar"] == 1.0 == entry["methods"]["ar"]["cpu_ratio_vs_ar"]
    assert entry["methods"]["ar"]["paired_ratio_vs_ar"] == 1.0
