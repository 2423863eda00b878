"""scripts/plot_training.py on the kept recipe logs: the MAT axis starts at plain decoding's 1 and
reaches at least 2 (noise of a few hundredths must not read as spikes); a plain run is drawn as reference."""

from pathlib import Path

import pytest
from conftest import load_script

pytest.importorskip("matplotlib", reason="needs the bench extra: pip install -e '.[bench]'")
ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "docs" / "bench" / "recipe"


def test_mat_axis_starts_at_one_with_sensible_limits():
    plot = load_script("scripts/plot_training.py")
    assert plot.mat_limits([1.0, 1.03, 1.07]) == (0.95, 2.0)
    low, high = plot.mat_limits([1.0, 5.7])
    assert low < 1.0 and high == pytest.approx(6.27)


def test_plot_with_a_plain_reference(tmp_path):
    plot = load_script("scripts/plot_training.py")
    logs = sorted(RECIPE.glob("log_history-*.json"))
    assert logs, "kept recipe logs are missing"
    out = tmp_path / "training.png"
    plot.main([str(p) for p in logs] + ["--plain", str(logs[0]), "-o", str(out)])
    assert out.stat().st_size > 10_000


def test_a_run_folder_is_read_and_a_wrong_file_is_named(tmp_path):
    plot = load_script("scripts/plot_training.py")
    log = sorted(RECIPE.glob("log_history-*.json"))[0]
    run = tmp_path / "run"
    run.mkdir()
    (run / "log_history.json").write_bytes(log.read_bytes())
    plot.main([str(run), "-o", str(tmp_path / "new" / "t.png")])  # a run's folder; the PNG's folder made
    assert (tmp_path / "new" / "t.png").stat().st_size > 10_000
    summary = tmp_path / "summary.json"
    summary.write_text('{"rollout_tokens_per_s": 1.0}')
    for path, message in ((summary, "pass the run's log_history.json, not its summary.json"),
                          (tmp_path / "absent.json", "does not exist"),
                          (tmp_path, "folder without log_history.json")):
        with pytest.raises(SystemExit, match=message):
            plot.main([str(path)])
