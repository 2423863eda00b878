"""Benchmark JSON → markdown tables and PNG plots (`scripts/report.py` and `scripts/bench.py` print
with these).

Speed JSONs come from `scripts/bench.py` (either backend) and, in the older layouts still kept
under docs/bench, from the engine and vLLM runners it replaced; `speed(results)` reads all of
them through `normalize`: per method, tokens/s, its ratio to the backend's plain path measured in
the same run (median over repeats of each repeat's paired ratio, with the range), MAT and, where
measured, drafted / accepted tokens per request-step. The engine's extra tables (phases, D-cut's
widths, the profiled cost table) and the plots read the engine layout (`configs[*].methods[name]`
with tokens_per_s, ratio_vs_ar, mat, verify_tokens_per_step, propose_share, budget_ratio, ...).
"""

from __future__ import annotations

from pathlib import Path

MISSING = "–"


def _num(m: dict, key: str, spec: str, scale: float = 1.0) -> str:
    v = m.get(key)
    return MISSING if v is None else format(scale * v, spec)


def rho(m: dict) -> str:
    return _num(m, "budget_ratio", ".2f")


def paired_ratios(m: dict, ar: dict | None) -> list[float]:
    """Each repeat's tokens/s over ar's tokens/s in the same repeat, sorted (empty without runs)."""
    runs, base = m.get("tokens_per_s_runs") or [], (ar or {}).get("tokens_per_s_runs") or []
    return sorted(r / b for r, b in zip(runs, base)) if runs and len(runs) == len(base) else []


def _quantile(ordered: list[float], f: float) -> float:
    """The f-quantile of a sorted list (upper one at ties: the median of 4 is the 3rd)."""
    return ordered[min(len(ordered) - 1, int(f * len(ordered)))]


def paired_ratio(m: dict, ar: dict | None) -> float | None:
    """Median over repeats of the run's ratio to ar's run of the same repeat: a slow spell of the
    machine that lasts a repeat falls on both sides of the ratio."""
    ratios = paired_ratios(m, ar)
    return _quantile(ratios, 0.5) if ratios else None


def paired(m: dict, ar: dict | None) -> str:
    """The paired median and its interquartile range over repeats."""
    ratios = paired_ratios(m, ar)
    if not ratios:
        return MISSING
    return f"{_quantile(ratios, 0.5):.2f} [{_quantile(ratios, 0.25):.2f}–{_quantile(ratios, 0.75):.2f}]"


OWN_PHASES = ("prefill", "propose", "learn", "bookkeeping")
"""Phases outside the target's decode forward and sampling: what a method adds to "ar" when both decode plainly."""


def pooled_phase_shares(m: dict, ar: dict) -> dict[str, float] | None:
    """Per token over every repeat: each phase's seconds minus ar's, and the time outside the
    timed phases ("outside": wall − Σ phases), as shares of ar's time per token. Steadier on a noisy
    machine than one median run (None without the bench's totals)."""
    if not (m.get("phase_s_total") and ar.get("phase_s_total") and ar.get("wall_s_total")):
        return None

    def per_token(x: dict) -> dict[str, float]:
        out = {k: v / x["tokens_total"] for k, v in x["phase_s_total"].items()}
        out["outside"] = (x["wall_s_total"] - sum(x["phase_s_total"].values())) / x["tokens_total"]
        return out

    mine, base = per_token(m), per_token(ar)
    scale = ar["wall_s_total"] / ar["tokens_total"]
    return {k: (v - base.get(k, 0.0)) / scale for k, v in mine.items()}


def own_phase_share(m: dict, ar: dict, pooled: bool = False) -> float | None:
    """What a method's own phases (`OWN_PHASES`) add to ar's, as a share of ar's rollout time: in the
    median runs, or (pooled) per emitted token over every repeat (`pooled_phase_shares`)."""
    if pooled:
        shares = pooled_phase_shares(m, ar)
        return None if shares is None else sum(shares.get(k, 0.0) for k in OWN_PHASES)
    if not (ar.get("phase_s") and ar.get("wall_s")):
        return None
    return sum(m["phase_s"].get(k, 0.0) - ar["phase_s"].get(k, 0.0) for k in OWN_PHASES) / ar["wall_s"]


def pooled_phase_markdown(results: dict) -> str | None:
    """`pooled_phase_shares` of every method, in % of ar's time per token."""
    rows = []
    for e in results["configs"]:
        ar = e["methods"].get("ar")
        for name, m in e["methods"].items():
            shares = pooled_phase_shares(m, ar) if ar and name != "ar" else None
            if shares is not None:
                rows.append((e, name, shares))
    if not rows:
        return None
    keys = list(dict.fromkeys(k for _, _, shares in rows for k in shares if k != "outside")) + ["outside"]
    lines = ["| T | batch | method | " + " | ".join(f"{k} %" for k in keys) + " |", "|---|---|---|" + "---|" * len(keys)]
    for e, name, shares in rows:
        cells = " | ".join(f"{100 * shares.get(k, 0.0):+.1f}" for k in keys)
        lines.append(f"| {e['temperature']} | {e['batch']} | {name} | {cells} |")
    return "\n".join(lines)


def phase_markdown(results: dict) -> str | None:
    """Seconds per phase of each method's median run, and what its own phases (`OWN_PHASES`) add to
    ar's, as a share of ar's rollout: in the median runs, and per token over all repeats."""
    rows = [(e, name, m) for e in results["configs"] for name, m in e["methods"].items() if m.get("phase_s")]
    if not rows:
        return None
    phases = list(dict.fromkeys(k for _, _, m in rows for k in m["phase_s"]))
    lines = ["| T | batch | method | " + " | ".join(f"{k} s" for k in phases)
             + " | own phases − ar's, % of ar | … all repeats, per token |",
             "|---|---|---|" + "---|" * (len(phases) + 2)]
    for e, name, m in rows:
        ar = e["methods"].get("ar")
        shares = [own_phase_share(m, ar, pooled) if ar else None for pooled in (False, True)]
        added = [MISSING if x is None else f"{100 * x:+.1f}" for x in shares]
        cells = [f"{m['phase_s'].get(k, 0.0):.3f}" for k in phases]
        lines.append(f"| {e['temperature']} | {e['batch']} | {name} | " + " | ".join(cells) + f" | {added[0]} | {added[1]} |")
    return "\n".join(lines)


def dcut_widths(trace: list, budget: int) -> dict[int, list[int]]:
    """D-cut's budget trace ([rows, ρ, kept] per step) → rows: the widths W = ρ × budget it verified
    at that batch size (sorted; empty where it decoded plainly)."""
    seen: dict[int, set[int]] = {}
    for rows, ratio, _ in trace:
        seen.setdefault(rows, set())
        if ratio > 0:
            seen[rows].add(round(ratio * budget))
    return {rows: sorted(ws) for rows, ws in seen.items()}


def cost_markdown(results: dict) -> str | None:
    """The profiled verify-forward cost table (`scripts/bench.py --profile-cost`): ms by rows × tokens per row."""
    cost = results.get("cost_table")
    if not cost:
        return None
    lines = ["| rows \\ tokens per row | " + " | ".join(map(str, cost["tokens"])) + " |",
             "|---|" + "---|" * len(cost["tokens"])]
    for rows, ms in zip(cost["batches"], cost["latency_ms"]):
        lines.append(f"| {rows} | " + " | ".join(f"{x:.2f}" for x in ms) + " |")
    return "\n".join(lines)


def dcut_markdown(results: dict) -> str | None:
    """D-cut's choices in each method's median run, as the batch drains: rows → the widths W it
    verified at that batch size (ρ × budget, budget from the JSON's `budget`, default 60)."""
    budget = results.get("budget", 60)
    lines = []
    for e in results["configs"]:
        for name, m in e["methods"].items():
            trace = m.get("budget_trace")
            if not trace or "dcut" not in name:  # fixed budgets verify their whole tree every step
                continue
            seen = dcut_widths(trace, budget)
            spec = [f"{rows}: W {'/'.join(map(str, ws))}" for rows, ws in seen.items() if ws]
            steps = sum(1 for t in trace if t[1] > 0)
            lines.append(f"| {e['temperature']} | {e['batch']} | {name} | {steps} of {len(trace)} | "
                         f"{', '.join(spec) or 'plain throughout'} |")
    if not lines:
        return None
    return "\n".join(["| T | batch | method | steps verifying a tree | rows: widths verified |", "|---|---|---|---|---|", *lines])


def pooled_time_share(m: dict, ar: dict) -> float | None:
    """Wall time per token over every repeat, minus ar's, as a share of ar's (None without totals)."""
    if not (m.get("wall_s_total") and ar.get("wall_s_total")):
        return None
    base = ar["wall_s_total"] / ar["tokens_total"]
    return (m["wall_s_total"] / m["tokens_total"] - base) / base


def ablation_markdown(results: dict) -> str | None:
    """Methods named `BASE:knob=value` (a D-cut controller switched off) against BASE, per cell: what
    switching it off changes in the method's own work per token and in its whole time per token
    (pooled over repeats, % of ar's time per token), next to ar-twin's own deviation from ar (the
    run's noise band: `ar-twin` is a second `ar`)."""
    rows = []
    for e in results["configs"]:
        ms, ar = e["methods"], e["methods"].get("ar")
        twin = ms.get("ar-twin")
        if not ar or not twin:
            continue
        band = (own_phase_share(twin, ar, pooled=True), pooled_time_share(twin, ar))
        for name, m in ms.items():
            base, _, knob = name.partition(":")
            if not knob or base not in ms:
                continue
            own = [own_phase_share(x, ar, pooled=True) for x in (ms[base], m)]
            total = [pooled_time_share(x, ar) for x in (ms[base], m)]
            if None in own + total + list(band):
                continue
            rows.append(f"| {e['batch']} | {base} | {knob} | {100 * (own[1] - own[0]):+.1f} | {100 * (total[1] - total[0]):+.1f} "
                        f"| {100 * band[0]:+.1f} / {100 * band[1]:+.1f} |")
    if not rows:
        return None
    head = ["| batch | method | switched off | Δ own work / token, % of ar | Δ time / token, % of ar | ar-twin − ar (own / time) |",
            "|---|---|---|---|---|---|"]
    return "\n".join(head + rows)


def plain_name(results: dict) -> str:
    """The method every ratio is taken against: the backend's plain path ("ar" on the engine)."""
    if results.get("plain"):
        return results["plain"]
    first = next(iter(results["configs"][0]["methods"].values()), {}) if results.get("configs") else {}
    return "plain" if "ratio_to_plain" in first else "ar"


def normalize(results: dict) -> list[dict]:
    """The configs of any speed JSON with, per method, `vs_plain` (the median over repeats of each
    repeat's tokens/s over the plain path's in the same repeat) and `vs_plain_runs` (those ratios,
    repeat by repeat). The engine's older JSONs kept `ratio_vs_ar` / `tokens_per_s_runs`, vLLM's
    `ratio_to_plain` / `ratios`; `scripts/bench.py` writes `vs_plain` itself."""
    plain = plain_name(results)
    out = []
    for e in results["configs"]:
        base = e["methods"].get(plain)
        methods = {}
        for name, m in e["methods"].items():
            m = dict(m)
            if "vs_plain" not in m:
                if "ratio_to_plain" in m:
                    m["vs_plain"], m["vs_plain_runs"] = m["ratio_to_plain"], m.get("ratios") or []
                else:
                    runs = m.get("tokens_per_s_runs") or []
                    ref = (base or {}).get("tokens_per_s_runs") or []
                    m["vs_plain_runs"] = [r / b for r, b in zip(runs, ref)] if len(runs) == len(ref) else []
                    m["vs_plain"] = paired_ratio(m, base) or m.get("ratio_vs_ar")
                    m.setdefault("cpu_vs_plain", m.get("cpu_ratio_vs_ar"))
            methods[name] = m
        out.append({**e, "methods": methods})
    return out


def _range(m: dict) -> str:
    runs = m.get("vs_plain_runs") or []
    if m.get("vs_plain") is None:
        return MISSING
    spread = f" [{min(runs):.2f}–{max(runs):.2f}]" if len(runs) > 1 else ""
    return f"{m['vs_plain']:.2f}{spread}"


SPEED_COLUMNS = (  # (header, key, format): a column is shown when some method has the key
    ("× plain (CPU time)", "cpu_vs_plain", ".2f"),
    ("tokens/s", "tokens_per_s", ".0f"),
    ("MAT", "mat", ".2f"),
    ("drafted / step", "drafted_per_step", ".2f"),
    ("accepted / step", "accepted_per_step", ".2f"),
)


def speed(results: dict, methods: list[str] | None = None, cells=None) -> str:
    """The speed table of a JSON of either backend: one row per (T, batch, method); `× plain` is the
    paired median over repeats with its range [min–max]. `methods`: these only, in this order;
    `cells`: (temperature, batch) pairs to keep."""
    configs = normalize(results)
    plain = plain_name(results)
    revisit = " (revisit)" if results.get("revisit") or "--revisit" in (results.get("command") or "") else ""
    names = methods or list(dict.fromkeys(n for e in configs for n in e["methods"]))
    rows = [(e, n, e["methods"][n]) for e in configs for n in names if n in e["methods"]
            and (cells is None or (e["temperature"], e["batch"]) in cells)]
    cols = [c for c in SPEED_COLUMNS if any(m.get(c[1]) is not None for _, _, m in rows)]
    lines = ["| T | batch | method | × " + plain + revisit + " (median [min–max]) | repeats | "
             + " | ".join(h.replace("plain", plain) for h, _, _ in cols) + " |", "|---|---|---|---|---|" + "---|" * len(cols)]
    for e, name, m in rows:
        cells_ = " | ".join(_num(m, key, spec) for _, key, spec in cols)
        repeats = len(m.get("vs_plain_runs") or m.get("tokens_per_s_runs") or []) or MISSING
        lines.append(f"| {e['temperature']} | {e['batch']} | {name} | {_range(m)} | {repeats} | {cells_} |")
    return "\n".join(lines)


def accept_markdown(results: dict) -> str | None:
    """Share of row-steps by accepted tokens per step (bonus not counted), where recorded."""
    rows = [(e, name, m["accept_hist"]) for e in results["configs"] for name, m in e["methods"].items()
            if m.get("accept_hist")]
    if not rows:
        return None
    depth = max(len(h) for _, _, h in rows)
    lines = ["| T | batch | method | row-steps | " + " | ".join(f"{a} acc. %" for a in range(depth)) + " |",
             "|---|---|---|---|" + "---|" * depth]
    for e, name, h in rows:
        total = max(sum(h), 1)
        cells = [f"{100 * h[a] / total:.1f}" if a < len(h) else "0.0" for a in range(depth)]
        lines.append(f"| {e['temperature']} | {e['batch']} | {name} | {sum(h)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(path: Path, results: dict) -> str:
    parts = [f"### {path.name}", ""]
    if results.get("command"):
        parts += ["```", results["command"], "```", ""]
    parts.append(speed(results))
    hist = accept_markdown(results)
    if hist:
        parts += ["", "Accepted tokens per step (share of row-steps):", "", hist]
    phases = phase_markdown(results)
    if phases:
        parts += ["", "Seconds per phase (median run of each method):", "", phases]
    pooled = pooled_phase_markdown(results)
    if pooled:
        parts += ["", "Per token over all repeats, each phase minus ar's (% of ar's time per token; outside: "
                  "time outside the timed phases):", "", pooled]
    dcut = dcut_markdown(results)
    if dcut:
        parts += ["", "D-cut in the median run, as the batch drains:", "", dcut]
    ablation = ablation_markdown(results)
    if ablation:
        parts += ["", "D-cut controllers switched off, against the method with all of them (+: slower without it):",
                  "", ablation]
    cost = cost_markdown(results)
    if cost:
        parts += ["", "Profiled verify forward, ms (rows × tokens per row):", "", cost]
    env = {k: results[k] for k in ("device", "dtype", "threads", "gpu", "python", "torch", "transformers", "vllm")
           if results.get(k) is not None}
    if results.get("cpu"):
        env["cpu"] = results["cpu"]["model"]
    if env:
        parts += ["", "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items())]
    for cell in results.get("skipped") or []:
        parts += ["", f"Skipped T={cell['temperature']} batch {cell['batch']}: {cell['why']}"]
    return "\n".join(parts)


# ---------------------------------------------------------------------- plots
def _pyplot():
    """matplotlib (the `bench` / `test` extra) only when plotting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _methods(configs: list[dict], key: str) -> list[str]:
    """Methods that report `key`, in order of first appearance."""
    names: list[str] = []
    for e in configs:
        names += [n for n, m in e["methods"].items() if m.get(key) is not None and n not in names]
    return names


def grouped_bars(results: dict, key: str, ylabel: str, out: Path, annotate: str | None = None) -> Path | None:
    """One panel per temperature: x = method, one bar per batch size."""
    plt = _pyplot()
    configs = results["configs"]
    methods = _methods(configs, key)
    if not methods:
        return None
    temps = sorted({e["temperature"] for e in configs}, reverse=True)
    batches = sorted({e["batch"] for e in configs})
    width = 0.8 / len(batches)
    fig, axes = plt.subplots(len(temps), 1, figsize=(max(6.0, 0.9 * len(methods) + 1.5), 3.4 * len(temps)),
                             squeeze=False)
    for ax, t in zip(axes[:, 0], temps):
        for j, b in enumerate(batches):
            entry = next((e for e in configs if e["temperature"] == t and e["batch"] == b), None)
            if entry is None:
                continue
            xs, ys, notes = [], [], []
            for i, name in enumerate(methods):
                m = entry["methods"].get(name, {})
                if m.get(key) is not None:
                    xs.append(i + (j - (len(batches) - 1) / 2) * width)
                    ys.append(m[key])
                    notes.append(m.get(annotate) if annotate else None)
            bars = ax.bar(xs, ys, width * 0.95, label=f"batch {b}", color=plt.cm.tab10(j))
            for bar, note in zip(bars, notes):
                if note is not None:
                    ax.annotate(f"{note:.2f}×", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=6.5, rotation=90, xytext=(0, 2),
                                textcoords="offset points")
        ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_title(f"T = {t}" + (" (bar labels: × ar)" if annotate else ""), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.18)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def accept_plot(results: dict, out: Path) -> Path | None:
    """One panel per (temperature, batch): share of row-steps by accepted tokens, a line per method."""
    panels = [e for e in results["configs"] if any(m.get("accept_hist") for m in e["methods"].values())]
    if not panels:
        return None
    plt = _pyplot()
    cols = min(2, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.4 * rows), squeeze=False)
    for ax, e in zip(axes.flat, panels):
        for i, (name, m) in enumerate(e["methods"].items()):
            h = m.get("accept_hist")
            if h:
                total = max(sum(h), 1)
                ax.plot(range(len(h)), [v / total for v in h], "o-", markersize=3, color=plt.cm.tab20(i % 20),
                        label=f"{name} (MAT {m['mat']:.2f})")
        ax.set_title(f"T = {e['temperature']}, batch {e['batch']}", fontsize=10)
        ax.set_xlabel("accepted tokens per step (tree depth reached; bonus not counted)", fontsize=8)
        ax.set_ylabel("share of row-steps", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plots(path: Path, results: dict, outdir: Path) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    stem = path.stem
    made = [grouped_bars(results, "tokens_per_s", "completion tokens / s", outdir / f"{stem}_tokens_per_s.png",
                         annotate="ratio_vs_ar"),
            grouped_bars(results, "mat", "MAT (tokens per forward per sequence)", outdir / f"{stem}_mat.png"),
            accept_plot(results, outdir / f"{stem}_accept_hist.png")]
    return [p for p in made if p is not None]
