"""scripts/bench.py --backend engine end to end on the embedded tiny target (a few seconds): the JSON it
writes — ratios to `ar` paired per repeat, the A/A twin, the HF peer, and what every JSON records."""

import json

from conftest import load_script


def test_bench_writes_same_run_ratios_and_the_environment(tmp_path):
    bench = load_script("scripts/bench.py")
    out = tmp_path / "bench.json"
    methods = ["ar", "ar-twin", "hf", "retrieval@8", "retrieval+lead", "retrieval+recall+dcut"]
    argv = ["--backend", "engine", "--device", "cpu", "--methods", *methods, "--batches", "2", "--group", "2",
            "--max-tokens", "12", "--ignore-eos", "--repeats", "2", "--revisit", "--threads", "1", "--out", str(out)]
    bench.main(argv)
    result = json.loads(out.read_text())
    assert result["command"] == "python scripts/bench.py " + " ".join(argv)
    assert result["backend"] == "engine" and result["plain"] == "ar" and result["device"] == "cpu"
    assert result["cpu"]["model"] is not None and isinstance(result["cpu"]["flags"], list)
    assert {"torch", "transformers", "python", "rollout_graft"} <= set(result)
    [entry] = result["configs"]
    assert entry["batch"] == 2 and entry["group"] == 2 and list(entry["methods"]) == methods
    for m in entry["methods"].values():
        assert len(m["tokens_per_s_runs"]) == len(m["vs_plain_runs"]) == 2
        assert m["tokens"] == 24  # --ignore-eos: every row writes 12 tokens
        assert m["mat"] >= 1.0 and m["vs_plain"] > 0 and m["cpu_vs_plain"] > 0 and m["cpu_s"] > 0
    ar = entry["methods"]["ar"]
    assert ar["vs_plain"] == 1.0 == ar["cpu_vs_plain"] and ar["vs_plain_runs"] == [1.0, 1.0]
    assert entry["methods"]["retrieval@8"]["mat"] > 1.0  # drafts from the group's index are accepted


def test_a_method_whose_extra_is_missing_is_named_and_the_twin_spread_is_printed():
    import importlib.util

    bench = load_script("scripts/bench.py")
    assert bench.parser().parse_args([]).warmup_rollouts == 1  # warm-up on by default
    assert bench.unavailable("plain") is None and bench.unavailable("ours+dcut@8") is None
    # the vLLM backend's own engine arms run beside vLLM's (they were refused as unknown, their names in the message)
    assert bench.unavailable("engine-ar") is None and bench.unavailable("engine-retrieval+dcut") is None
    if importlib.util.find_spec("arctic_inference") is None:
        assert "vllm-suffix" in bench.unavailable("suffix@8")
    results = {"configs": [{"temperature": 1.0, "batch": 8, "methods": {
        "plain": {"vs_plain": 1.0}, "plain-twin": {"vs_plain": 1.05, "vs_plain_runs": [0.93, 1.05, 1.2]}}}]}
    assert "A/A twin plain-twin 1.05 [0.93–1.20]" in bench.twin_lines(results)
    assert "no A/A twin" in bench.twin_lines({"configs": [{"temperature": 1.0, "batch": 8, "methods": {}}]})


def test_bad_arguments_are_named_before_any_model_loads(tmp_path, capsys):
    import re

    import pytest

    bench = load_script("scripts/bench.py")
    no_prompt = tmp_path / "rows.jsonl"
    no_prompt.write_text('{"question": "1+1"}\n')
    for argv, says in ((["--batches", "0"], "--batches: 0: 1 or more"),
                       (["--repeats", "-1"], "--repeats: -1: 1 or more"),
                       (["--methods", "retrieval"], "include 'ar', every ratio is taken against it"),
                       (["--model", str(tmp_path / "none")], "--model directory .* does not exist"),
                       (["--prompts", str(tmp_path)], "is not a file")):
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert re.search(says, capsys.readouterr().err)
    with pytest.raises(SystemExit, match="the part after @ is a budget"):
        bench.main(["--methods", "ar", "retrieval@x", "--batches", "2", "--group", "2", "--max-tokens", "2"])
    with pytest.raises(ValueError, match="line 1 has no `prompt` field"):
        bench.main(["--methods", "ar", "--prompts", str(no_prompt), "--batches", "2", "--group", "2", "--max-tokens", "2"])


def test_an_unknown_method_is_named_before_any_model_loads(capsys):
    """--methods with an unknown engine method (or a D-cut knob it refuses) ended the run only once the model
    had loaded; a vLLM depth that is no number read as a missing extra (skipped)."""
    import pytest

    bench = load_script("scripts/bench.py")
    never = ["--model", "/nonexistent-model-dir"]  # the model is never read
    with pytest.raises(SystemExit, match="unknown engine method 'retreival'; known: hf, ar, ar-twin, retrieval,"):
        bench.main(["--methods", "ar", "retreival", *never])
    with pytest.raises(SystemExit):
        bench.main(["--methods", "ar", "retrieval+dcut:probe_share=2", *never])
    assert "--methods retrieval+dcut:probe_share=2: DCutConfig.probe_share must be in (0, 1]" in capsys.readouterr().err
    from rollout_graft_tools.bench_vllm import spec_for

    with pytest.raises(SystemExit, match="the part after @ is a draft depth K in tokens, e.g. ours@8"):
        spec_for("ours@x")


def test_a_bad_temperature_is_named_before_any_model_loads(capsys):
    """--temperatures -1 / nan / 1e-9 failed with SamplingParams' ValueError only after the model had
    loaded and the prior had been warmed."""
    import pytest

    bench = load_script("scripts/bench.py")
    for bad, says in (("-1", "finite number >= 0"), ("nan", "finite number >= 0"), ("1e-9", "use 0 for greedy")):
        with pytest.raises(SystemExit):
            bench.main(["--temperatures", "1.0", bad, "--model", "/nonexistent-model-dir"])  # the model is never read
        err = capsys.readouterr().err
        assert f"--temperatures {float(bad)}: temperature" in err and says in err, err
