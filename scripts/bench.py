#!/usr/bin/env python
"""Rollout benchmark of either backend: GRPO rollouts, P prompts × G samples,
EOS on, every method measured in the same run as the backend's plain path.

    python scripts/bench.py --backend engine --methods ar ar-twin hf retrieval+dcut --out engine.json
    python scripts/bench.py --backend vllm --methods plain plain-twin suffix@8 ours+dcut@8 --out vllm.json
    python scripts/bench.py --backend engine --device cuda --dtype bfloat16 --model DIR --prompts P.jsonl ...

Each repeat runs every method once, in a fresh seeded order, on prompts no earlier repeat used;
`--warmup-rollouts` (1) untimed rollouts of every method come first in each cell; `--revisit` first
runs each repeat's prompts once, untimed (a later GRPO epoch: `recall` and every
method's caches may reuse that text). The JSON keeps, per (temperature, batch) and method, the
median run and its ratio to the plain path (`ar` on the engine, vLLM `plain`): the median over
repeats of each repeat's paired ratio (`vs_plain`, with every repeat's in `vs_plain_runs`); put
the plain path's A/A twin (`ar-twin`, `plain-twin`) beside it to see the run's noise, and the peer
a user would pick instead (`hf` for the engine; vLLM's `suffix@K`, `ngram@K`). Every JSON records
the command, the CPU model and flags, the versions and the device.

Engine methods: rollout_graft_tools/bench_engine.py (NAME@N: budget N). vLLM methods:
rollout_graft_tools/bench_vllm.py; each runs in a process of its own beside its own `plain`
(vLLM binds a process's threads; its counters are process-wide). Render a JSON again with
`python scripts/report.py --show RUN.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from rollout_graft import SamplingParams  # noqa: E402
from rollout_graft.assets import TINY_DRAFT, TINY_PROMPTS, TINY_TARGET  # noqa: E402
from rollout_graft.files import atomic_write_json, local_dir  # noqa: E402
from rollout_graft_tools import tables  # noqa: E402
from rollout_graft_tools.benchmark import cell, environment, measure_cell  # noqa: E402
from rollout_graft_tools.cli import positive  # noqa: E402

DEFAULT_METHODS = {"engine": ["ar", "ar-twin", "hf", "retrieval+dcut"], "vllm": ["plain", "plain-twin", "ours+dcut@8"]}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["engine", "vllm"], default="engine")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the engine; vLLM picks its own build's device)")
    ap.add_argument("--model", default=str(TINY_TARGET), help="HF model folder (scripts/prepare_models.py --print-path NAME)")
    ap.add_argument("--prompts", default=str(TINY_PROMPTS), help="JSON lines with a `prompt` (text or chat messages)")
    ap.add_argument("--methods", nargs="+", default=None, help="default: engine " + " ".join(DEFAULT_METHODS["engine"])
                    + "; vllm " + " ".join(DEFAULT_METHODS["vllm"]))
    ap.add_argument("--batches", nargs="+", type=positive, default=[8, 64], help="rows per rollout (prompts × G)")
    ap.add_argument("--group", type=positive, default=8, help="G: samples per prompt (one prompt's group if the batch is smaller)")
    ap.add_argument("--temperatures", nargs="+", type=float, default=[1.0])
    ap.add_argument("--max-tokens", type=positive, default=128, help="new tokens per row at most")
    ap.add_argument("--ignore-eos", action="store_true", help="every row writes --max-tokens (steadier timings)")
    ap.add_argument("--repeats", type=positive, default=3)
    ap.add_argument("--revisit", action="store_true", help="a later GRPO epoch: each repeat's prompts run once before, untimed")
    ap.add_argument("--warmup-rollouts", type=int, default=1,
                    help="per cell, untimed rollouts of every method first (0: none; a cold first run reads as noise)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=positive, default=None, help="torch CPU threads (engine)")
    ap.add_argument("--budget", type=positive, default=60, help="engine: candidate nodes per sequence and step")
    ap.add_argument("--draft-model", default=str(TINY_DRAFT), help="engine: the drafter of the graft methods")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    ap.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # vLLM: a child of the driver
    return ap


def check_args(ap: argparse.ArgumentParser, args) -> None:
    """What would fail only after the model loads (or deep inside it), named now."""
    plain = DEFAULT_METHODS[args.backend][0]
    if plain not in args.methods:
        ap.error(f"--methods {' '.join(args.methods)}: include {plain!r}, every ratio is taken against it")
    if args.warmup_rollouts < 0:
        ap.error(f"--warmup-rollouts {args.warmup_rollouts}: 0 or more")
    if args.backend == "engine":  # else an unknown name ends the run once the model loaded (vLLM: `drive` checks first)
        from rollout_graft_tools.bench_engine import variant

        for method in (m for m in args.methods if m != "hf"):
            try:
                variant(method, args.budget, None)  # SystemExit naming the known methods
            except (ValueError, TypeError, SyntaxError) as exc:  # a `:field=value` knob D-cut refuses
                ap.error(f"--methods {method}: {exc}")
    for t in args.temperatures:  # else a ValueError once the model loaded and the prior warmed at the first one
        try:
            SamplingParams(temperature=t)
        except ValueError as exc:
            ap.error(f"--temperatures {t}: {exc}")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            ap.error(f"--device {args.device}: this torch sees no CUDA GPU (torch {torch.__version__})")
    try:
        local_dir(args.model, "--model")
    except (FileNotFoundError, ValueError) as exc:
        ap.error(str(exc))
    if not Path(args.prompts).is_file():
        ap.error(f"--prompts {args.prompts} is not a file: JSON lines with a `prompt` per row")


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = parser()
    args = ap.parse_args(argv)
    args.methods = args.methods or DEFAULT_METHODS[args.backend]
    check_args(ap, args)
    if args.backend == "vllm" and not args.in_process:
        results = drive(args, argv)
    else:
        results = measure(args, argv)
    print(tables.speed(results))
    print(twin_lines(results))
    for method, why in (results.get("skipped") or {}).items():
        print(f"skipped {method}: {why}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out, results, indent=1)
    return results


def measure(args, argv: list[str]) -> dict:
    """Every cell of this process's methods, through one backend."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.backend == "engine":
        from rollout_graft_tools.bench_engine import EngineBackend

        backend = EngineBackend(args.model, args.prompts, args.methods, device=args.device, dtype=args.dtype,
                                budget=args.budget, draft_model=args.draft_model)
    else:
        from rollout_graft_tools.bench_vllm import VLLMBackend

        backend = VLLMBackend(args.model, args.prompts, args.methods, dtype=args.dtype)
    results = {**environment(args.device, args.dtype, ["scripts/bench.py", *argv]), "backend": args.backend,
               "plain": backend.plain, "model": args.model, "revisit": args.revisit, "budget": args.budget, "configs": []}
    try:
        for t in args.temperatures:
            for b in args.batches:
                c = cell(t, b, args.group, args.max_tokens, args.ignore_eos)
                results["configs"].append(measure_cell(backend, args.methods, c, args.repeats, args.seed,
                                                       args.revisit, args.warmup_rollouts))
    finally:
        backend.close()
    if getattr(backend, "setup_s", None):
        results["setup_s"] = backend.setup_s
    return results


def twin_lines(results: dict) -> str:
    """The A/A twin's ratio and spread beside the others, per cell: a ratio inside it is noise."""
    lines = []
    for cfg in results.get("configs", []):
        twins = {n: m for n, m in cfg["methods"].items() if n.endswith("-twin")}
        for name, m in twins.items():
            if m.get("vs_plain") is not None:
                lines.append(f"T={cfg['temperature']} batch {cfg['batch']}: A/A twin {name} {tables._range(m)} "
                             "(plain against itself: ratios inside this spread are noise)")
    return "\n".join(lines) or "no A/A twin in this run (add ar-twin / plain-twin to read the noise)"


def unavailable(method: str) -> str | None:
    """Why a vLLM method cannot run here (a missing extra), or None."""
    from rollout_graft_tools.bench_vllm import spec_for

    try:
        spec_for(method)
    except (ValueError, ImportError) as exc:
        return str(exc)
    return None


def drive(args, argv: list[str]) -> dict:
    """vLLM: each method in a child process of its own beside `plain`; their cells merged. A method that
    cannot run (its extra is missing) or whose child fails is skipped with its message; the others run."""
    base = _without(argv, "--out", "--methods")
    skipped = {m: why for m in args.methods if (why := unavailable(m))}
    for method, why in skipped.items():
        print(f"skipping {method}: {why}", file=sys.stderr)
    runnable = [m for m in args.methods if m not in skipped]
    children = [["plain", m] for m in runnable if m != "plain"] or [["plain"]]
    merged: dict | None = None
    for methods in children:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.json"
            cmd = [sys.executable, __file__, *base, "--methods", *methods, "--out", str(out), "--in-process"]
            done = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
            if done.returncode:
                sys.stderr.write(done.stderr[-4000:])
                skipped[methods[-1]] = (done.stderr.strip().splitlines() or ["failed"])[-1]
                print(f"skipping {methods[-1]}: its run failed ({skipped[methods[-1]]})", file=sys.stderr)
                continue
            part = json.loads(out.read_text())
        if merged is None:
            merged = {**part, "command": " ".join(["python", "scripts/bench.py", *argv])}
        for cfg, new in zip(merged["configs"], part["configs"]):
            cfg["methods"][methods[-1]] = new["methods"][methods[-1]]
    if merged is None:
        raise SystemExit("no method ran: " + "; ".join(f"{m}: {why}" for m, why in skipped.items()))
    if "plain" not in args.methods:
        for cfg in merged["configs"]:
            cfg["methods"].pop("plain", None)
    if skipped:
        merged["skipped"] = skipped
    return merged


def _without(argv: list[str], *flags: str) -> list[str]:
    """argv without these flags and their values."""
    out, skip = [], False
    for a in argv:
        if a.startswith("--"):
            skip = a in flags
        if not skip:
            out.append(a)
    return out


if __name__ == "__main__":
    main()
