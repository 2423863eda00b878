"""scripts/report.py on a small synthetic benchmark JSON."""

import json

import pytest
from conftest import load_script

pytest.importorskip("matplotlib")



def load_report():
    return load_script("scripts/report.py")


def method(tps, ar_tps, mat, hist=None, rho=None):
    m = {"wall_s": 1.0, "tokens": 100, "tokens_per_s": tps, "ratio_vs_ar": tps / ar_tps, "mat": mat,
         "verify_tokens_per_step": 40.0, "target_forwards": 20, "propose_share": 0.1, "budget_ratio": rho}
    if hist is not None:
        m["accept_hist"] = hist
    return m


def synthetic() -> dict:
    configs = []
    for t in (1.0, 0.0):
        for batch in (8, 64):
            configs.append({"temperature": t, "prompts": batch // 8, "group": 8, "batch": batch, "methods": {
                "ar": method(1000.0, 1000.0, 1.0, hist=[50]),
                "retrieval": method(800.0, 1000.0, 2.5, hist=[10, 5, 3, 2]),
                "retrieval+dcut": method(1200.0, 1000.0, 1.8, rho=0.25),  # no histogram recorded
            }})
    return {"command": "python scripts/bench_rollout.py --synthetic", "configs": configs}


def test_report_writes_tables_and_plots(tmp_path, capsys):
    report = load_report()
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps(synthetic()))
    written = report.main([str(path), "--plots", str(tmp_path / "plots"), "--markdown"])
    names = sorted(p.name for p in written)
    assert names == ["synthetic_accept_hist.png", "synthetic_mat.png", "synthetic_tokens_per_s.png"]
    assert all(p.stat().st_size > 10_000 and p.read_bytes()[:4] == b"\x89PNG" for p in written)
    out = capsys.readouterr().out
    assert "| 1.0 | 8 | retrieval | 800 | 0.80 | – | – | – | 2.50 | 40 | 10 | – | 1.0 |" in out  # no runs: no paired ratio
    assert "| 0.0 | 64 | retrieval+dcut | 1200 | 1.20 | – | – | – | 1.80 | 40 | 10 | 0.25 | 1.0 |" in out
    assert "| 1.0 | 8 | retrieval | 20 | 50.0 | 25.0 | 15.0 | 10.0 |" in out  # accepted-length shares


def test_report_renders_replay_json_without_timings(tmp_path):
    report = load_report()
    results = {"configs": [{"temperature": 1.0, "batch": 4, "methods": {
        "retrieval": {"mat": 2.0, "verify_tokens_per_step": 100.0, "accept_hist": [3, 1, 2]}}}]}
    assert "| 1.0 | 4 | retrieval | – | – | – | – | – | 2.00 | 100 | – | – | – |" in report.markdown(results)
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(results))
    written = report.main([str(path), "--plots", str(tmp_path)])
    assert sorted(p.name for p in written) == ["replay_accept_hist.png", "replay_mat.png"]  # no tokens/s to plot


def test_report_pairs_repeats_and_shows_phases_and_dcut_choices():
    report = load_report()
    ar = {**method(100.0, 100.0, 1.0), "tokens_per_s_runs": [100.0, 50.0, 100.0, 80.0],
          "phase_s": {"prefill": 0.1, "propose": 0.1, "verify": 0.7, "learn": 0.0, "bookkeeping": 0.1}}
    dcut = {**method(90.0, 100.0, 1.2, rho=0.1), "tokens_per_s_runs": [90.0, 60.0, 80.0, 84.0],
            "phase_s": {"prefill": 0.1, "propose": 0.15, "verify": 0.7, "learn": 0.0, "bookkeeping": 0.1},
            # (rows, ρ, kept): plain at 8 rows, W = 4 at 3 rows, W = 8 at 2
            "budget_trace": [(8, 0.0, 0), (8, 0.0, 0), (3, 4 / 60, 12), (2, 8 / 60, 16), (2, 0.0, 0)]}
    results = {"budget": 60, "configs": [{"temperature": 1.0, "batch": 8, "methods": {"ar": ar, "retrieval+dcut": dcut}}]}
    # per repeat: 0.9, 1.2, 0.8, 1.05 → sorted 0.8, 0.9, 1.05, 1.2: median (upper) 1.05, IQR 0.9–1.2
    assert report.paired_ratio(dcut, ar) == pytest.approx(1.05)
    assert "| 1.05 [0.90–1.20] |" in report.markdown(results)
    # own phases: propose +0.05 s on ar's 1.0 s wall; no totals over the repeats in this JSON
    assert report.phase_markdown(results).splitlines()[-1].endswith("| +5.0 | – |")
    # over all repeats, per token: ar 0.6 s of own phases for 600 tokens in 4 s, D-cut 1.0 s for 500 tokens
    # → (2.0 − 1.0) ms per token on ar's 6.67 ms per token: +15 %
    ar.update(wall_s_total=4.0, tokens_total=600, phase_s_total={"prefill": 0.2, "propose": 0.3, "verify": 3.0, "bookkeeping": 0.1})
    dcut.update(wall_s_total=4.2, tokens_total=500, phase_s_total={"prefill": 0.2, "propose": 0.6, "verify": 3.0, "bookkeeping": 0.2})
    assert report.phase_markdown(results).splitlines()[-1].endswith("| +5.0 | +15.0 |")
    # … phase by phase (ms per token, D-cut − ar, over ar's 6.67): prefill 0.40 − 0.33, propose 1.2 − 0.5,
    # verify 6 − 5, bookkeeping 0.4 − 0.17, outside the phases (4.2 − 4.0 s)/500 − (4.0 − 3.6 s)/600 = 0.4 − 0.67
    assert report.pooled_phase_markdown(results).splitlines()[-1] == \
        "| 1.0 | 8 | retrieval+dcut | +1.0 | +10.5 | +15.0 | +3.5 | -4.0 |"
    assert report.dcut_markdown(results).splitlines()[-1] == "| 1.0 | 8 | retrieval+dcut | 2 of 5 | 3: W 4, 2: W 8 |"
