#!/usr/bin/env python
"""Multi-epoch GRPO benchmark: the recipe, trained end to end once per arm and repeat, per epoch.

    python lab/grpo_epochs.py --steps 20 --repeats 3 --json docs/bench/grpo_epochs.json
    python lab/grpo_epochs.py --arm default= --arm ar=--method,ar --arm ar-twin=--method,ar ...
    python lab/grpo_epochs.py --from-json runs.json --plot epochs.png       # draw an earlier result

Each arm is `recipes/grpo_qwen3.py` with its own extra arguments (`NAME=ARG,ARG,…`; the defaults:
the recipe as shipped, `fixed` = every draft verified whole, `ar` = plain decoding and its A/A twin
`ar-twin`), run as a process of its own on the same prompts and seeds. Every repeat runs every arm
once, in a fresh seeded order. The demo revisits its 16 prompts every 4 steps, so epoch 0 is the
prompts' first visit and every later epoch a revisit. From each run's `summary.json` it keeps the
per-epoch rollout seconds, tokens/s, MAT, drafted share and D-cut's verdict, and the reward per
step; per epoch it reports each arm's tokens/s as the median over repeats of its ratio to the
reference arm (`ar`) of the same repeat — `ar-twin`'s ratio is the run's noise.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollout_graft.files import atomic_write_json
from rollout_graft_tools.benchmark import environment

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "grpo_qwen3.py"
DEFAULT_ARMS = {"default": [], "fixed": ["--budget_policy", "fixed"], "ar": ["--method", "ar"],
                "ar-twin": ["--method", "ar"]}


def run_arm(args: list[str], steps: int, out_dir: Path) -> dict:
    """One training run of the recipe; its summary (per-epoch table included) and reward per step."""
    command = [sys.executable, str(RECIPE), "--max_steps", str(steps), "--num_eval_prompts", "0",
               "--disable_tqdm", "true", "--output_dir", str(out_dir), *args]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    summary = json.loads((out_dir / "summary.json").read_text())
    history = json.loads((out_dir / "log_history.json").read_text())
    summary["rewards"] = [h["reward"] for h in history if "reward" in h]
    summary.pop("config", None)
    return summary


def ratios(runs: dict[str, list[dict]], reference: str, part: str) -> dict[str, dict]:
    """Per arm, the median over repeats of its tokens/s over the reference arm's in the same repeat,
    for `part` ("first_visit" or "revisits"), with every repeat's ratio and the arm's median MAT."""
    out = {}
    for arm, arm_runs in runs.items():
        paired = [r[part]["tokens_per_s"] / ref[part]["tokens_per_s"] for r, ref in zip(arm_runs, runs[reference])
                  if r.get(part) and ref.get(part) and ref[part]["tokens_per_s"]]
        mats = [r[part]["mat"] for r in arm_runs if r.get(part) and r[part].get("mat") is not None]
        drafted = [r[part]["drafted_share"] for r in arm_runs if r.get(part) and r[part].get("drafted_share") is not None]
        out[arm] = {"vs_reference": statistics.median(paired) if paired else None, "vs_reference_runs": paired,
                    "tokens_per_s": _median_of(arm_runs, part, "tokens_per_s"),  # None: no run reached it (no revisits)
                    "mat": statistics.median(mats) if mats else None,
                    "drafted_share": statistics.median(drafted) if drafted else None,
                    "break_even_mat": _median_of(arm_runs, part, "break_even_mat"),
                    "expected_mat": _median_of(arm_runs, part, "expected_mat")}
    return out


def _median_of(arm_runs: list[dict], part: str, key: str) -> float | None:
    values = [r[part][key] for r in arm_runs if r.get(part) and r[part].get(key) is not None]
    return statistics.median(values) if values else None


def reward_curves(runs: dict[str, list[dict]]) -> dict[str, list[float]]:
    """Per arm, the mean training reward at each step over the repeats."""
    return {arm: [statistics.mean(step) for step in zip(*(r["rewards"] for r in arm_runs))] for arm, arm_runs in runs.items()}


def plot(result: dict, path: Path) -> None:
    """Rollout tokens/s and MAT per epoch, each arm's median over its repeats (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, mat) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for arm, runs in result["runs"].items():
        epochs = sorted({e["epoch"] for r in runs for e in r["epochs"]})
        per = [[e for r in runs for e in r["epochs"] if e["epoch"] == k] for k in epochs]
        speed.plot(epochs, [statistics.median(e["tokens_per_s"] for e in es) for es in per], marker="o", label=arm)
        mat.plot(epochs, [statistics.median(e["mat"] or 1.0 for e in es) for es in per], marker="o", label=arm)
    speed.set_ylabel("rollout tokens / s")
    mat.set_ylabel("MAT")
    mat.set_xlabel("epoch (0: first visit)")
    speed.legend(fontsize=7)
    for ax in (speed, mat):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def parse_arms(specs: list[str] | None) -> dict[str, list[str]]:
    if not specs:
        return dict(DEFAULT_ARMS)
    arms = {}
    for spec in specs:
        name, sep, args = spec.partition("=")
        if not sep or not name:
            raise SystemExit(f"--arm {spec!r}: write NAME=ARG,ARG,… (NAME= for the recipe as shipped)")
        arms[name] = [a for a in args.split(",") if a]
    return arms


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", action="append", help="NAME=ARG,ARG,… recipe arguments of an arm (repeatable)")
    parser.add_argument("--reference", default="ar", help="the arm every ratio is taken against")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (4 per epoch in the demo)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="seeds the arms' order in each repeat")
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument("--plot", type=Path, help="also draw tokens/s and MAT per epoch and arm here (PNG)")
    parser.add_argument("--from-json", type=Path, help="run nothing: draw --plot from this earlier result")
    args = parser.parse_args(argv)
    if args.from_json:
        result = json.loads(args.from_json.read_text())
        if args.plot:
            plot(result, args.plot)
        return result
    arms = parse_arms(args.arm)
    if args.reference not in arms:
        raise SystemExit(f"--reference {args.reference!r} is not an arm: {sorted(arms)}")
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    order = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            names = list(arms)
            order.shuffle(names)
            for arm in names:
                start = time.perf_counter()
                runs[arm].append(run_arm(arms[arm], args.steps, Path(tmp) / f"{arm}-{repeat}"))
                print(f"repeat {repeat} {arm}: {time.perf_counter() - start:.0f}s", flush=True)
    env = environment("cpu", "float32", argv if argv is not None else sys.argv)
    result = {"command": env["command"], "environment": env,
              "arms": arms, "steps": args.steps, "repeats": args.repeats, "reference": args.reference,
              "first_visit": ratios(runs, args.reference, "first_visit"),
              "revisits": ratios(runs, args.reference, "revisits"),
              "rewards": reward_curves(runs), "runs": runs}
    for part in ("first_visit", "revisits"):
        print(f"\n{part}: tokens/s vs {args.reference} (median of paired repeats), MAT, drafted share")
        for arm, r in result[part].items():
            vs = "n/a" if r["vs_reference"] is None else f"{r['vs_reference']:.2f}x"
            mat = "n/a" if r["mat"] is None else f"{r['mat']:.2f}"
            print(f"  {arm:<10} {vs:>7}  MAT {mat}  drafted {r['drafted_share']}")
    if args.json:
        atomic_write_json(args.json, result)
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == "__main__":
    main()
