"""scripts/report.py regenerates docs/RESULTS.md from the kept JSONs; rollout_graft_tools.tables renders
benchmark JSONs of either backend (and the older layouts still kept) as tables and plots."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import load_script

from rollout_graft_tools import tables

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    return load_script("scripts/report.py")


def test_committed_results_are_what_report_generates(report):
    assert (REPO / "docs" / "RESULTS.md").read_text() == report.generate(), "run `python scripts/report.py`"
    assert report.main(["--check"]) == 0


def test_docs_bench_holds_exactly_the_files_results_cites(report):
    cited = set(report.cited())
    assert all((REPO / "docs" / "bench" / f).is_file() for f in cited)
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git checkout: tracked files unknown")
    tracked = subprocess.run(["git", "ls-files", "docs/bench"], cwd=REPO, capture_output=True, text=True).stdout.split()
    uncited = sorted(f for f in tracked if f.removeprefix("docs/bench/") not in cited)
    assert not uncited, f"docs/bench keeps only what RESULTS cites: add a Section to scripts/report.py or git rm {uncited}"


def test_results_carry_no_history(report):
    text = report.generate()
    for word in ("issue", "before", "commit", "BENCHMARKS"):
        assert word not in text.replace("before each timed rollout", ""), word


def _engine_run() -> dict:
    """The engine's older layout: ratio_vs_ar, tokens_per_s_runs per method."""
    def method(runs, mat, hist=None):
        m = {"tokens_per_s": sorted(runs)[len(runs) // 2], "tokens_per_s_runs": runs, "mat": mat, "tokens": 100,
             "ratio_vs_ar": None, "verify_tokens_per_step": 40.0, "wall_s": 1.0, "propose_share": 0.1}
        if hist:
            m["accept_hist"] = hist
        return m
    ar = method([100.0, 50.0, 100.0, 80.0], 1.0, hist=[50])
    dcut = method([90.0, 60.0, 80.0, 84.0], 1.8, hist=[10, 5, 3, 2])
    return {"command": "python scripts/bench.py --backend engine", "configs": [
        {"temperature": 1.0, "batch": 8, "methods": {"ar": ar, "retrieval+dcut": dcut}}]}


def test_speed_table_pairs_repeats_in_every_layout():
    # per repeat: 0.9, 1.2, 0.8, 1.05 → the median (upper of 4) 1.05, range 0.80–1.20
    engine = tables.speed(_engine_run())
    assert "| 1.0 | 8 | retrieval+dcut | 1.05 [0.80–1.20] | 4 | 84 | 1.80 |" in engine
    vllm = {"command": "python scripts/bench.py --backend vllm --revisit", "configs": [{"temperature": 0.0, "batch": 2, "methods": {
        "plain": {"ratio_to_plain": 1.0, "ratios": [1.0, 1.0], "tokens_per_s": 10.0, "mat": 1.0, "drafted_per_step": 0.0},
        "ours+dcut@8": {"ratio_to_plain": 1.5, "ratios": [1.4, 1.6], "tokens_per_s": 15.0, "mat": 2.0, "drafted_per_step": 3.0}}}]}
    text = tables.speed(vllm)
    assert "× plain (revisit) (median [min–max])" in text and "| 0.0 | 2 | ours+dcut@8 | 1.50 [1.40–1.60] | 2 | 15 | 2.00 | 3.00 |" in text
    new = {"plain": "plain", "configs": [{"temperature": 1.0, "batch": 1, "methods": {
        "plain": {"vs_plain": 1.0, "vs_plain_runs": [1.0], "mat": 1.0}}}]}
    assert "| 1.0 | 1 | plain | 1.00 | 1 | 1.00 |" in tables.speed(new)


def test_show_prints_tables_and_writes_plots(report, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_engine_run()))
    report.main(["--show", str(path), "--plots", str(tmp_path / "plots")])
    out = capsys.readouterr().out
    assert "### run.json" in out and "Accepted tokens per step" in out
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["run_accept_hist.png", "run_mat.png", "run_tokens_per_s.png"]


def test_show_names_a_file_that_is_not_a_benchmark_json(report, tmp_path):
    bad = tmp_path / "bad.json"
    for content, says in (("", "is not valid JSON"), ('{"configs": [{"a": 1}]}', "not a scripts/bench.py JSON"),
                          ('{"configs": 5}', "not a scripts/bench.py JSON"), ("[1, 2]", "not a scripts/bench.py JSON")):
        bad.write_text(content)
        with pytest.raises(SystemExit, match=says):
            report.main(["--show", str(bad)])
    for path, says in ((tmp_path / "none.json", "does not exist"), (tmp_path, "is a folder")):
        with pytest.raises(SystemExit, match=says):
            report.main(["--show", str(path)])
    with pytest.raises(SystemExit, match="is a file: name a folder"):
        report.main(["--show", str(bad), "--plots", str(bad)])


def test_phases_and_dcut_choices():
    ar = {"tokens_per_s": 100.0, "tokens_per_s_runs": [100.0], "mat": 1.0, "wall_s": 1.0, "tokens": 100,
          "phase_s": {"prefill": 0.1, "propose": 0.1, "verify": 0.7, "learn": 0.0, "bookkeeping": 0.1}}
    dcut = {"tokens_per_s": 90.0, "tokens_per_s_runs": [90.0], "mat": 1.2, "wall_s": 1.0, "tokens": 100,
            "phase_s": {"prefill": 0.1, "propose": 0.15, "verify": 0.7, "learn": 0.0, "bookkeeping": 0.1},
            # (rows, ρ, kept): plain at 8 rows, W = 4 at 3 rows, W = 8 at 2
            "budget_trace": [(8, 0.0, 0), (8, 0.0, 0), (3, 4 / 60, 12), (2, 8 / 60, 16), (2, 0.0, 0)]}
    results = {"budget": 60, "configs": [{"temperature": 1.0, "batch": 8, "methods": {"ar": ar, "retrieval+dcut": dcut}}]}
    # own phases: propose +0.05 s on ar's 1.0 s wall; no totals over the repeats in this JSON
    assert tables.phase_markdown(results).splitlines()[-1].endswith("| +5.0 | – |")
    # over all repeats, per token: ar 0.6 s of own phases for 600 tokens in 4 s, D-cut 1.0 s for 500 tokens
    # → (2.0 − 1.0) ms per token on ar's 6.67 ms per token: +15 %
    ar.update(wall_s_total=4.0, tokens_total=600, phase_s_total={"prefill": 0.2, "propose": 0.3, "verify": 3.0, "bookkeeping": 0.1})
    dcut.update(wall_s_total=4.2, tokens_total=500, phase_s_total={"prefill": 0.2, "propose": 0.6, "verify": 3.0, "bookkeeping": 0.2})
    assert tables.phase_markdown(results).splitlines()[-1].endswith("| +5.0 | +15.0 |")
    assert tables.pooled_phase_markdown(results).splitlines()[-1] == \
        "| 1.0 | 8 | retrieval+dcut | +1.0 | +10.5 | +15.0 | +3.5 | -4.0 |"
    assert tables.dcut_markdown(results).splitlines()[-1] == "| 1.0 | 8 | retrieval+dcut | 2 of 5 | 3: W 4, 2: W 8 |"
