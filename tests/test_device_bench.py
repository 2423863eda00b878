"""scripts/device_bench.py: the GGUF travels in pieces and is joined only when whole and intact; the
CPU quick mode runs the GPU benchmark's code path end to end on the tiny target."""

import hashlib
import json
from dataclasses import replace

import pytest
from conftest import load_script


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLOUT_GRAFT_CACHE", str(tmp_path / "cache"))
    return load_script("scripts/device_bench.py")


def _fake_gguf(db, tmp_path):
    data = bytes(range(256)) * 10  # 2560 bytes
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(data)
    src = replace(db.prep.SMOLLM2, gguf="fake.gguf", sha256=hashlib.sha256(data).hexdigest())
    return gguf, data, src


def test_pieces_are_joined_once_all_have_arrived(db, tmp_path):
    gguf, data, src = _fake_gguf(db, tmp_path)
    pieces = db.pack(gguf, tmp_path / "pack", piece_mib=1000 / 2**20)  # 1000-byte pieces: 3 of them
    assert [p.name for p in pieces] == ["piece-1", "piece-2", "piece-3"]
    arrivals = tmp_path / "arrive"
    for k, piece in enumerate(pieces, 1):  # one piece per command, as the device receives them
        (arrivals / piece.name).parent.mkdir(exist_ok=True)
        piece.rename(arrivals / piece.name)
        joined = db.stash(arrivals, src)
        assert (joined is None) == (k < 3)
    assert joined.read_bytes() == data
    assert db.prep.fetch_gguf(src) == joined  # found where prepare_models looks: no pip call, sha256 checked


def test_a_damaged_or_foreign_piece_is_refused(db, tmp_path):
    gguf, _, src = _fake_gguf(db, tmp_path)
    [first, _, _] = db.pack(gguf, tmp_path / "pack", piece_mib=1000 / 2**20)
    with pytest.raises(ValueError, match="another file"):
        db.stash(tmp_path / "pack", replace(src, sha256="0" * 64))
    (first / "part.bin").write_bytes(b"flipped")
    with pytest.raises(ValueError, match="damaged"):
        db.stash(tmp_path / "pack", src)


def test_largest_batches_run_last_and_a_cell_that_would_overrun_is_predicted(db):
    plan = db.Plan(temperatures=(1.0, 0.0), batches=(1, 8, 64, 256))
    assert db.cells(plan) == [(1.0, 1), (1.0, 8), (1.0, 64), (0.0, 1), (0.0, 8), (0.0, 64), (1.0, 256), (0.0, 256)]
    assert db.predict_s([], 8) == 0.0
    assert db.predict_s([(64, 30.0)], 256) == 60.0  # 30 s × √(256 / 64)
    assert db.predict_s([(64, 30.0)], 1) == 30.0  # never predicted cheaper than the latest cell
    assert (db.cell(1.0, 1, 8, 4).prompts, db.cell(1.0, 1, 8, 4).group) == (1, 1)
    assert (db.cell(1.0, 64, 8, 4).prompts, db.cell(1.0, 64, 8, 4).group) == (8, 8)
    with pytest.raises(ValueError, match="multiple of the group"):
        db.cell(1.0, 12, 8, 4)


def test_quick_mode_writes_the_device_json(db, tmp_path):
    out = tmp_path / "device_bench.json"
    methods = ["hf", "ar", "retrieval@4", "retrieval+dcut", "retrieval+recall"]
    db.main(["run", "--device", "cpu", "--quick", "--threads", "1", "--methods", *methods, "--out", str(out)])
    results = json.loads(out.read_text())
    assert [(e["temperature"], e["batch"]) for e in results["configs"]] == [(1.0, 1), (0.0, 1), (1.0, 2), (0.0, 2)]
    assert results["skipped"] == [] and results["device"] == "cpu" and results["cpu"]["model"] is not None
    for entry in results["configs"]:
        assert list(entry["methods"]) == methods
        assert entry["methods"]["ar"]["vs_plain"] == 1.0
        for m in entry["methods"].values():
            assert m["tokens"] > 0 and m["mat"] >= 1.0 and m["vs_plain"] > 0
        assert set(entry["methods"]["retrieval+dcut"]["dcut_widths"]) <= {"1", "2"}  # keyed by rows
    cost = results["cost_table"]
    assert len(cost["latency_ms"]) == len(cost["batches"]) and all(len(r) == len(cost["tokens"]) for r in cost["latency_ms"])
    text = db.tables.render(out, results)
    assert "Profiled verify forward" in text and "retrieval+recall" in text


def test_a_piece_and_the_tracked_files_fit_one_command_and_stash_only_measures_nothing(db, tmp_path, monkeypatch):
    """`pack`'s default piece leaves room for what travels with every command (the tracked files),
    and `run --stash-only` stashes a carried piece without the smoke test (GPU time is scarce)."""
    assert 0 < db.tree_mib() < db.TRAVEL_MIB - 8  # room for a piece of several MiB
    stashed = []
    monkeypatch.setattr(db, "stash", lambda incoming, source: stashed.append((incoming, source.name)))
    out = tmp_path / "out.json"
    assert db.main(["run", "--stash-only", "--pieces", str(tmp_path / "pack"), "--out", str(out)]) is None
    assert stashed == [(tmp_path / "pack", db.prep.SMOLLM2.name)] and not out.exists()
