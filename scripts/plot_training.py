"""Plot reward and rollout throughput over GRPO steps from a trainer's log history.

    python scripts/plot_training.py outputs/grpo_qwen3-engine/log_history.json \
        [outputs/grpo_qwen3-hf/log_history.json ...] [--plain outputs/grpo_qwen3-ar/log_history.json] [-o training.png]

The MAT panel draws plain decoding (MAT 1.00) as a reference line, its axis starting at 1 and reaching
at least 2, so that noise of a few hundredths does not read as spikes. `--plain` overlays a plain-decoding
run (the recipe with `--method ar`) dashed on the tokens/s panel: the rate speculation has to beat.

Accepts the recipe's `log_history.json` (a list of log dicts) or a checkpoint's
`trainer_state.json` (its `log_history`). Several runs are overlaid, labelled by their directory.
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rollout_graft.files import read_json  # noqa: E402

PANELS = (  # (log key, axis title); "eval_" + key, when logged, is drawn with markers
    ("reward", "reward (training batch; held-out set: markers)"),
    ("rewards/correctness_reward/mean", "correct answers (fraction)"),
    ("rollout/tokens_per_s", "rollout completion tokens / s"),
    ("rollout/mean_accepted_tokens", "mean accepted tokens per forward (MAT)"),
)


def load_history(path: Path) -> list[dict]:
    """The logged steps with a reward of a run's log_history.json or trainer_state.json (a run's
    folder: its log_history.json); ValueError naming the file otherwise."""
    if path.is_dir():
        found = [path / name for name in ("log_history.json", "trainer_state.json") if (path / name).is_file()]
        if not found:
            raise ValueError(f"{path} is a folder without log_history.json or trainer_state.json: pass the run's "
                             "log_history.json (the recipe writes it to its --output_dir)")
        path = found[0]
    data = read_json(path, "log")
    history = data.get("log_history") if isinstance(data, dict) else data
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise ValueError(f"{path} holds no log history (a list of log dicts, or trainer_state.json's log_history): "
                         "pass the run's log_history.json, not its summary.json")
    return [h for h in history if "step" in h and ("reward" in h or "eval_reward" in h)]


def series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(h["step"], h[key]) for h in history if h.get(key) is not None]
    return [s for s, _ in points], [v for _, v in points]


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (GRPO rewards are noisy step to step)."""
    return [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
            for i in range(len(values))]


MAT_KEY, SPEED_KEY = "rollout/mean_accepted_tokens", "rollout/tokens_per_s"


def mat_limits(values: list[float]) -> tuple[float, float]:
    """MAT axis: from just below 1 (plain decoding) to at least 2, or 10 % above the highest MAT."""
    return 0.95, max(2.0, 1.1 * max(values, default=1.0))


def plot(runs: dict[str, list[dict]], out: Path, window: int, plain: list[dict] | None = None) -> None:
    panels = [(k, t) for k, t in PANELS if any(series(h, k)[0] for h in runs.values())]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.6 * len(panels)), sharex=True, squeeze=False)
    for ax, (key, title) in zip(axes[:, 0], panels):
        for label, history in runs.items():
            steps, values = series(history, key)
            if not steps:
                continue
            line, = ax.plot(steps, values, alpha=0.35, linewidth=1)
            if window > 1 and key.startswith("reward"):
                ax.plot(steps, smooth(values, window), color=line.get_color(), linewidth=2,
                        label=f"{label} ({window}-step mean)")
            else:
                line.set_alpha(1.0)
                line.set_label(label)
            eval_steps, eval_values = series(history, f"eval_{key}")
            if eval_steps and key.startswith("reward"):
                ax.plot(eval_steps, eval_values, "o--", color=line.get_color(), label=f"{label} (held-out)")
        if key == MAT_KEY:
            ax.axhline(1.0, color="gray", linestyle=":", label="plain decoding (MAT 1.00)")
            ax.set_ylim(*mat_limits([v for h in runs.values() for v in series(h, key)[1]]))
        if key == SPEED_KEY and plain:
            steps, values = series(plain, key)
            ax.plot(steps, values, "--", color="gray", label="plain decoding (--plain run)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("training step")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", type=Path, help="log_history.json or trainer_state.json files")
    ap.add_argument("-o", "--out", type=Path, default=None, help="PNG path (default: training.png beside the first log)")
    ap.add_argument("--window", type=int, default=5, help="moving-average window for the reward curves")
    ap.add_argument("--plain", type=Path, default=None, help="a plain-decoding run's log (recipe --method ar): "
                    "its tokens/s drawn as the reference line")
    args = ap.parse_args(argv)
    if args.window < 1:
        ap.error(f"--window {args.window}: a moving average of at least 1 step")
    try:
        runs = {(p if p.is_dir() else p.parent).name or str(p): load_history(p) for p in args.logs}
        plain = load_history(args.plain) if args.plain else None
    except ValueError as exc:
        raise SystemExit(f"plot_training.py: {exc}") from None
    empty = [name for name, h in runs.items() if not h]
    if empty:
        raise SystemExit(f"no training steps with a reward in {empty}")
    out = args.out or (args.logs[0] if args.logs[0].is_dir() else args.logs[0].parent) / "training.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(runs, out, args.window, plain)


if __name__ == "__main__":
    main()
