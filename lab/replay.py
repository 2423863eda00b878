#!/usr/bin/env python
"""Acceptance studies by replay, without the target: record plain rollouts once, replay draft sources
on them. One tool, an adapter per backend:

    engine   the engine's trees (`rollout_graft_tools.replay`): retrieval variants on a recording
             of the plain path with the target's top-k at every position
    vllm     the vLLM backend's chains (`rollout_graft_tools.chain_replay`): our chain proposer
             (and vLLM's suffix decoding) through a replayed persistent batch

    python lab/replay.py engine record --num-prompts 8 --group-size 8 --out rec.safetensors
    python lab/replay.py engine run rec.safetensors --variants retrieval retrieval-noshare --json replay.json
    python lab/replay.py engine bound rec.safetensors        # what copying from siblings' text could give
    python lab/replay.py engine clocks --cell first:8,64 revisit:8,64 --json docs/bench/engine_dcut_clocks.json
    python lab/replay.py engine pool --cell first:8 revisit:8 --json docs/bench/engine_cut_pool.json
    python lab/replay.py engine learn --cell first:8 revisit:8 --rollouts 12 --json docs/bench/engine_learn_value.json
    python lab/replay.py vllm record --batch 64 --rollouts 4 --out rec.json
    python lab/replay.py vllm run rec.json --json replay.json
    python lab/replay.py vllm clocks --cell rec.json:first:8,64 --json docs/bench/dcut_clocks.json

Engine: `run` needs no model: trees come from the real RetrievalProposer, acceptance from the
recorded tokens, index updates from the recorded distributions of on-path positions only (the
engine also learns from rejected nodes, so replay's MAT is lower than an engine run's: compare
variants with each other; exactness: rollout_graft_tools/replay.py). Its JSON follows the
benchmark's layout (`configs[*].methods[variant]`), so `scripts/report.py` renders it. `clocks` is
no replay of a recording: it runs the real engine (every arm seed-exact, so the tokens are the same)
and prices each verify forward on modelled clocks, D-cut deciding on the clock it is judged by
(`rollout_graft_tools.engine_clocks`). `pool` runs it with a cut of a wider proposal at a fixed
width, ranked by raw scores or by D-cut's calibration, against the proposer's own tree of that width.
`learn` runs fixed trees whose index learns at only each row's best nodes, not at every node the
forward verified: what a verified node is worth to later steps.

vLLM: `record` runs plain vLLM (no speculation) for `--rollouts` GRPO rollouts of `--batch` rows
(batch/G prompts × G samples, EOS on), each on prompts no earlier rollout used. `run` replays them
in order through each proposer (one instance per variant, kept across rollouts as in one vLLM
engine): a draft is accepted up to its first token that differs from the recorded completion,
plus one token — exactly vLLM's rejection sampler on drafts without probabilities, so replaying
plain samples gives the acceptance of a real speculative run in distribution. Variants:
`ours@K/τ` (chains of at most K tokens cut where the raw score falls below τ) and `suffix@K/p`
(vLLM's suffix decoding, min_token_prob p; needs arctic-inference); for each suffix variant, our
curves interpolated at its draft tokens per step ("higher MAT than suffix at equal drafted");
`after-walk@K/τ` (`--count-after-walk`): ours counting a step's text after walking its chains,
as a thread counting beside a GPU's next forward would (`chain_replay.count_after_walk_class`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402

from rollout_graft import EngineConfig, RetrievalConfig, SamplingParams  # noqa: E402
from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET, read_prompt_texts  # noqa: E402
from rollout_graft.proposers import RetrievalProposer  # noqa: E402
from rollout_graft.templates import TemplateConfig  # noqa: E402
from rollout_graft.vllm import proposer as proposer_module  # noqa: E402
from rollout_graft.vllm.config import MAX_MATCH  # noqa: E402
from rollout_graft_tools.bounds import suffix_chain_bound  # noqa: E402
from rollout_graft_tools.chain_replay import SuffixReplay, at_drafted, ours_proposer, replay_rollouts  # noqa: E402
from rollout_graft_tools.prompts import load_prompts  # noqa: E402
from rollout_graft_tools.replay import Recording, record, replay  # noqa: E402


# ---------------------------------------------------------------------- engine: trees
def variants(base: RetrievalConfig) -> dict[str, RetrievalConfig]:
    """Named retrieval variants (the bench's names where they exist)."""
    return {
        "retrieval": base,
        "retrieval-noshare": replace(base, share_in_group=False),
        "retrieval-noprior": replace(base, use_prior=False),
        "retrieval-bare": replace(base, share_in_group=False, use_prior=False),
        "retrieval-order2": replace(base, context_order=2),
        "retrieval+suffix": replace(base, suffix_depth=8),
        "retrieval+suffix-noshare": replace(base, suffix_depth=8, share_in_group=False),
        "retrieval-overwrite": replace(base, merge_decay=0.0),
        "breadth-first": replace(base, template=replace(base.template, kind="breadth_first")),
        "best-first-d4": replace(base, template=TemplateConfig(depth=4, width=base.template.width)),
    }


def engine_record(args) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device).eval()
    prompts = load_prompts(args.prompts, tokenizer, args.split, args.num_prompts, args.offset)
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    rec = record(model, tokenizer, prompts, args.group_size, params, args.out, top_k=args.top_k)
    lens = [len(c) for c in rec.completions]
    print(f"recorded {rec.rows} rows ({len(prompts)} prompts × {args.group_size}), {sum(lens)} completion tokens "
          f"(mean {sum(lens) / len(lens):.0f}), top-{args.top_k} per position → {args.out} "
          f"({Path(args.out).stat().st_size / 1e6:.2f} MB)")


def hist_cell(hist: list[int], at_least: int) -> str:
    rows = sum(hist)
    return f"{100 * sum(hist[at_least:]) / max(rows, 1):.0f}"


def engine_table(results: dict) -> str:
    lines = ["| variant | MAT | steps | row-steps | verified tok/step | accepted ≥1 % | ≥2 % | ≥4 % | accepted-length histogram |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, m in results["configs"][0]["methods"].items():
        h = m["accept_hist"]
        lines.append(f"| {name} | {m['mat']:.3f} | {m['target_forwards']} | {m['row_steps']} | "
                     f"{m['verify_tokens_per_step']:.0f} | {hist_cell(h, 1)} | {hist_cell(h, 2)} | {hist_cell(h, 4)} | "
                     f"{' '.join(map(str, h))} |")
    return "\n".join(lines)


def engine_run(args) -> dict:
    rec = Recording.load(args.recording)
    warm = [Recording.load(p) for p in args.warm]
    table_of = variants(RetrievalConfig(prior_path=args.prior, update_prior=bool(warm), suffix_depth=0))  # "+suffix": chains on
    unknown = [v for v in args.variants if v not in table_of]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(table_of)}")
    groups = int(rec.row_group.max()) + 1
    entry = {"temperature": rec.params.temperature, "prompts": groups, "group": rec.rows // groups, "batch": rec.rows,
             "methods": {}}
    for name in args.variants:
        cfg = EngineConfig(method="retrieval", budget=args.budget, max_depth=args.max_depth, retrieval=table_of[name])
        proposer = RetrievalProposer(cfg.retrieval, rec.vocab, args.device)
        for w in warm:  # the prior learns from other recordings first (as over earlier GRPO steps)
            replay(w, cfg, proposer=proposer, device=args.device)
        entry["methods"][name] = {**replay(rec, cfg, proposer=proposer, device=args.device).as_dict(),
                                  "retrieval": asdict(cfg.retrieval)}
    results = {"command": "python lab/replay.py " + " ".join(args.argv), "replay": True, "recording": args.recording,
               "model": rec.model, "params": asdict(rec.params), "budget": args.budget, "max_depth": args.max_depth,
               "prior": args.prior, "warm": args.warm, "configs": [entry]}
    print(engine_table(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


def engine_bound(args) -> dict:
    res = {src: suffix_chain_bound(args.recording, src, depth=args.depth) for src in ("own", "siblings", "whole")}
    print(f"suffix chain (depth {args.depth}), tokens per step: own text {res['own']:.2f}, + siblings up to the same "
          f"position {res['siblings']:.2f}, + siblings' whole completions {res['whole']:.2f}")
    return res


def _engine_target(args):
    """The target `engine clocks`, `pool` and `learn` run (float32, `--threads`) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    return AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval(), tokenizer


def _engine_cells(args, tokenizer):
    """(regime, prompt sets, sampling) of each `--cell` REGIME:BATCH,BATCH…: `--rollouts` sets of
    batch / `--group` prompts each (more where `--rows-per-cell` asks for more rows timed), prompts no
    other set of the cell uses."""
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    for spec in args.cell:
        regime, sizes = spec.split(":")
        for batch in map(int, sizes.split(",")):
            if batch % args.group:
                raise SystemExit(f"batch {batch} is not a multiple of the group size {args.group}")
            n, rollouts = batch // args.group, max(args.rollouts, -(-args.rows_per_cell // batch))
            prompts = load_prompts(args.prompts, tokenizer, "test", n * rollouts)
            yield regime, [prompts[i * n : (i + 1) * n] for i in range(rollouts)], params


def engine_clocks(args) -> dict:
    """ar, fixed tree widths and D-cut on the engine's own CPU cost table and the rooflines, per
    `--cell` (REGIME:BATCH,BATCH…); prints ours against the best fixed arm and ar."""
    from rollout_graft.cost import CostModel
    from rollout_graft_tools import clock_replay, clocks, engine_clocks
    from rollout_graft_tools.benchmark import environment

    model, tokenizer = _engine_target(args)
    table = CostModel.profile(model)
    measured = [engine_clocks.measured_table_clock(*spec.rsplit(":", 1)) for spec in args.measured]
    timers = ([engine_clocks.TableClock(table, f"engine-cpu/{Path(args.model).name}")] + measured
              + list(clocks.rooflines().values()))
    out = {"command": "python lab/replay.py " + " ".join(args.argv), "modelled": True,
           "environment": environment("cpu", "float32", ["lab/replay.py", *args.argv]),  # the engine-cpu clock's table was profiled here
           "clocks": {c.name: repr(c) if not isinstance(c, engine_clocks.TableClock) else c.table.to_json() for c in timers},
           "cells": []}
    for regime, sets, params in _engine_cells(args, tokenizer):
        for cell in engine_clocks.cells(model, tokenizer, sets, args.group, regime, params, timers, **dict(args.dcut)):
            cell.update(clock_replay.verdict(cell))
            out["cells"].append(cell)
            a = cell["arms"]
            print(f"{regime:<8} {cell['clock']:<22} b{cell['batch']:<4} best {cell['best_fixed']:<10} "
                  f"{a[cell['best_fixed']] / a['plain']:.3f}× ar; ours {cell['vs_plain']:.3f}× ar, {cell['vs_best']:.3f}× best; "
                  f"nodes/row ours {cell['mean_verified_nodes']['ours-dcut']:.2f}"
                  f"{'' if cell['meets'] else '  MISS'}{'' if cell['seed_exact'] else '  NOT SEED-EXACT'}", flush=True)
    cells = out["cells"]
    print(f"ours-dcut meets the bar in {sum(c['meets'] for c in cells)} of {len(cells)} cells")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


def engine_pool(args) -> dict:
    """Each kept width W verified from the proposer's own W-node trees and cut from wider proposals,
    ranked by raw scores and by D-cut's calibration (`engine_clocks.pool_cells`), per `--cell`."""
    from rollout_graft_tools import clocks, engine_clocks

    model, tokenizer = _engine_target(args)
    clock = clocks.rooflines()[args.clock]
    out = {"command": "python lab/replay.py " + " ".join(args.argv), "modelled": True, "cells": []}
    for regime, sets, params in _engine_cells(args, tokenizer):
        cell = engine_clocks.pool_cells(model, tokenizer, sets, args.group, regime, params, clock)
        out["cells"].append(cell)
        for a in cell["arms"]:
            print(f"{regime:<8} b{cell['batch']:<4} keep {a['keep']:>2} of {a['pool']:>2} by {a['ranking']:<10} "
                  f"MAT {a['mat']:.3f}  {a['tokens_per_s']:.0f} tok/s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


def engine_learn(args) -> dict:
    """Fixed trees whose index learns at every verified node or only at each row's best few
    (`engine_clocks.learn_cells`), per `--cell`, priced on `--clock`."""
    from rollout_graft_tools import clocks, engine_clocks

    model, tokenizer = _engine_target(args)
    if args.clock in clocks.rooflines():
        clock = clocks.rooflines()[args.clock]
    else:
        clock = engine_clocks.measured_table_clock(GPU_COST, args.clock.split("/", 1)[-1])
    out = {"command": "python lab/replay.py " + " ".join(args.argv), "modelled": True, "cells": []}
    for regime, sets, params in _engine_cells(args, tokenizer):
        cell = engine_clocks.learn_cells(model, tokenizer, sets, args.group, regime, params, clock)
        out["cells"].append(cell)
        for a in cell["arms"]:
            arm = "ours-dcut" if a["width"] is None else f"width {a['width']:>2} learning at {a['learns_at'] or 'every verified node'}"
            print(f"{regime:<8} b{cell['batch']:<4} {arm}: MAT {a['mat']:.3f}, {a['verified_nodes']:.1f} nodes/row, "
                  f"{a['tokens_per_s']:.0f} tok/s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


# ---------------------------------------------------------------------- vLLM: chains

def vllm_record(args) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = read_prompt_texts(args.prompts, tok)
    per = max(args.batch // args.group, 1)
    group = args.group if args.batch >= args.group else 1
    prompts = prompts[args.skip_prompts :]
    if per * args.rollouts > len(prompts):
        raise SystemExit(f"{args.rollouts} rollouts of {per} prompts need {per * args.rollouts} prompts; "
                         f"{args.prompts} has {len(prompts)} after the {args.skip_prompts} skipped")
    llm = LLM(args.model, dtype=args.dtype, seed=args.seed, enforce_eager=True)
    rollouts = []
    for n in range(args.rollouts):
        rows = [p for p in prompts[n * per : (n + 1) * per] for _ in range(group)]
        outs = llm.generate(rows, SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens), use_tqdm=False)
        rollouts.append({"prompts": [list(o.prompt_token_ids) for o in outs],
                         "completions": [list(o.outputs[0].token_ids) for o in outs]})
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    args.out.write_text(json.dumps({"args": meta, "vocab": len(tok), "rollouts": rollouts}))


def vllm_run(args) -> dict:
    rec = json.loads(args.recording.read_text())
    rollouts, timed = rec["rollouts"], None
    if args.revisit:  # each rollout twice in a row, the first untimed: greedy decoding repeats itself
        if rec["args"]["temperature"] != 0:
            raise SystemExit("--revisit replays a rollout as its own next epoch: only a greedy (temperature 0) recording is one")
        rollouts, timed = [r for r in rollouts for _ in range(2)], [False, True] * len(rollouts)
    max_len = max(len(p) + len(c) for r in rollouts for p, c in zip(r["prompts"], r["completions"])) + 2 * args.k + 2
    step_ms = tuple(args.step_ms) if args.step_ms else None
    results: dict[str, dict] = {}
    variants = [("ours", {}, False)] + [(o.split("=", 1)[0], json.loads(o.split("=", 1)[1]), False) for o in args.ours]
    variants += [("after-walk", {}, True)] if args.count_after_walk else []
    names = []  # (label, ChainConfig options, longest context, counting after the walk)
    for name, options, after in variants:
        names += [(f"{name}/m{m}", options, m, after) for m in args.max_match] or [(name, options, MAX_MATCH, after)]
    try:
        for name, options, longest, after in names:
            proposer_module.MAX_MATCH = longest  # a module constant of the proposer, read when one is built
            for tau in args.taus:
                prop = ours_proposer(args.k, tau, rec["vocab"], max_len, options, after)
                results[f"{name}@{args.k}/{tau:g}"] = replay_rollouts(prop, rollouts, step_ms, timed)
            if step_ms is not None:
                prop = ours_proposer(args.k, None, rec["vocab"], max_len, options, after)
                results[f"{name}+dcut@{args.k}"] = replay_rollouts(prop, rollouts, step_ms, timed)
    finally:
        proposer_module.MAX_MATCH = MAX_MATCH
    for p in args.min_token_probs:
        results[f"suffix@{args.k}/{p:g}"] = replay_rollouts(SuffixReplay(args.k, p, max_len), rollouts, step_ms, timed)
    curves = {name: [v for k, v in results.items() if k.startswith(f"{name}@")] for name, *_ in names}
    compare = {k: {"drafted_per_step": v["drafted_per_step"], "suffix_mat": v["mat"],
                   **{f"{name}_mat_at_equal_drafted": at_drafted(curve, v["drafted_per_step"])
                      for name, curve in curves.items()}}
               for k, v in results.items() if k.startswith("suffix")}
    out = {"command": "python lab/replay.py " + " ".join(args.argv), "recording": str(args.recording),
           "recorded_with": rec["args"], "k": args.k, "variants": results,
           "suffix_vs_ours": compare}
    print(f"{'variant':<18} {'MAT':>6} {'drafted/step':>13} {'accepted/step':>14} {'modelled ×plain':>16}")
    for k, v in results.items():
        print(f"{k:<18} {v['mat']:6.3f} {v['drafted_per_step']:13.2f} {v['accepted_per_step']:14.2f} "
              f"{v.get('modelled_speedup', float('nan')):16.3f}")
    for k, v in compare.items():
        for name in curves:
            o = v[f"{name}_mat_at_equal_drafted"]
            print(f"{k}: suffix MAT {v['suffix_mat']:.3f} at {v['drafted_per_step']:.2f} drafted/step; "
                  f"{name} at the same: {'outside its curve' if o is None else f'{o:.3f}'}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


GPU_COST = "docs/bench/gpu_verify_cost_h100.json"  # the engine's verify forward measured on an H100
PROPOSER_COST = "docs/bench/vllm_proposer_vs_ngram.json"  # our proposer's own µs per request-step (this CPU)
STEP_COST_RUNS = ["docs/bench/vllm_step_cost_b8.json", "docs/bench/vllm_step_cost_b64.json"]  # the tiny target's


def vllm_clocks(args) -> dict:
    """Every arm on every clock (`rollout_graft_tools.clock_replay.cells`) for each `--cell`
    (RECORDING:REGIME:BATCH,BATCH…); prints ours against the best fixed arm and plain."""
    from rollout_graft_tools import clock_replay, clocks

    steps = [c for c in args.cpu_steps if Path(c).exists()]
    timers = ([clocks.measured_clock(steps, "cpu-measured/tiny")] if steps else []) + list(clocks.rooflines().values())
    if args.longer_contexts or args.profile_param:  # a study of the rooflines alone
        timers = [c if not args.longer_contexts else clocks.LongerContexts(c, args.longer_contexts, args.stale_profile)
                  for c in timers if isinstance(c, clocks.Roofline)]
    params = dict(args.profile_param)

    def profile_of(clock):  # the profile's roofline with the --profile-param values
        if isinstance(clock, clocks.LongerContexts):
            return replace(clock, inner=replace(clock.inner, **params))
        return replace(clock, **params)
    quiet = "dcut-plain-incall" if args.count_in_call else "dcut-plain"
    cost = clocks.ProposerCost.from_json(args.proposer_cost, quiet) if args.proposer_cost else None
    out = {"command": "python lab/replay.py " + " ".join(args.argv), "modelled": True,
           "clocks": {c.name: repr(c) for c in timers},
           "proposer_cost": None if cost is None else {"source": args.proposer_cost, **asdict(cost)}, "cells": []}
    for spec in args.cell:
        path, regime, sizes = spec.split(":")
        rec = json.loads(Path(path).read_text())
        if regime == "revisit" and rec["args"]["temperature"] != 0:
            raise SystemExit(f"{path}: a revisit replays a rollout as its own next epoch: only a greedy recording is one")
        if (regime == "grpo") != (rec["args"].get("regime") == "grpo"):
            raise SystemExit(f"{path}: the regime grpo is for recordings of GRPO epochs (lab/record_grpo.py), and only it")
        for batch in map(int, sizes.split(",")):
            for cell in clock_replay.cells(rec, regime, batch, timers, dict(args.dcut), cost,
                                           profile_of if params else None, count_beside=not args.count_in_call):
                cell.update(recording=Path(path).name, temperature=rec["args"]["temperature"],
                            **clock_replay.verdict(cell))
                out["cells"].append(cell)
                a = cell["arms"]
                print(f"{Path(path).stem:<20} {regime:<8} {cell['clock']:<18} b{cell['batch']:<4} "
                      f"best {cell['best_fixed']:<13} {a[cell['best_fixed']] / a['plain']:.3f}× plain; ours "
                      f"{cell['vs_plain']:.3f}× plain, {cell['vs_best']:.3f}× best; depth ours "
                      f"{cell['mean_verified_depth']['ours-dcut']:.2f}{'' if cell['meets'] else '  MISS'}"
                      + (f"; {cell['vs_suffix']:.3f}× suffix" if "vs_suffix" in cell else ""), flush=True)
    cells = out["cells"]
    print(f"ours-dcut meets the bar in {sum(c['meets'] for c in cells)} of {len(cells)} cells; ours-dcut-online in "
          f"{sum(clock_replay.meets(c['arms'], 'ours-dcut-online') for c in cells)}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


def _dcut_option(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    return name, float(value)


def _engine_rollout_args(p: argparse.ArgumentParser) -> None:
    """The rollouts `engine clocks`, `pool` and `learn` run: model, prompts and sampling."""
    p.add_argument("--model", default=str(TINY_TARGET))
    p.add_argument("--prompts", default=str(TINY_PROMPTS))
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--rollouts", type=int, default=4, help="timed rollouts per cell, each on prompts of its own")
    p.add_argument("--rows-per-cell", type=int, default=0,
                   help="at least this many rows timed per cell: more rollouts for small batches (an 8-row cell's "
                        "verdict moves with the prompts drawn: docs/DESIGN.md, \"The engine's trees on clocks\")")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    backends = ap.add_subparsers(dest="backend", required=True)
    engine = backends.add_parser("engine", help="the engine's trees").add_subparsers(dest="cmd", required=True)
    r = engine.add_parser("record", help="run the plain path once and record completions + target top-k")
    r.add_argument("--model", default=str(TINY_TARGET))
    r.add_argument("--prompts", default=str(TINY_PROMPTS), help="JSON lines with a 'prompt' (text or chat messages)")
    r.add_argument("--split", default="test")
    r.add_argument("--offset", type=int, default=0, help="start at this prompt of the split")
    r.add_argument("--num-prompts", type=int, default=8)
    r.add_argument("--group-size", type=int, default=8)
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--max-new-tokens", type=int, default=256)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--top-k", type=int, default=8, help="successors recorded per position (>= the index's top_k)")
    r.add_argument("--device", default="cpu")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", required=True)
    r.set_defaults(func=engine_record)
    p = engine.add_parser("run", help="replay retrieval variants on a recording (no model)")
    p.add_argument("recording")
    p.add_argument("--variants", nargs="+", default=["retrieval", "retrieval-noshare", "retrieval-noprior", "breadth-first"],
                   help=f"any of {list(variants(RetrievalConfig()))}")
    p.add_argument("--budget", type=int, default=EngineConfig().budget, help="candidate nodes per sequence and step")
    p.add_argument("--max-depth", type=int, default=EngineConfig().max_depth)
    p.add_argument("--prior", default=None, help="a saved adjacency prior (scripts/warm_prior.py) to start from")
    p.add_argument("--warm", nargs="*", default=[], help="recordings replayed first to warm the prior (on-path rule)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, help="write the results here (the benchmark's layout)")
    p.set_defaults(func=engine_run)
    b = engine.add_parser("bound", help="tokens/step of a lone suffix-chain drafter copying from own / sibling text")
    b.add_argument("recording")
    b.add_argument("--depth", type=int, default=8)
    b.set_defaults(func=engine_bound)
    k = engine.add_parser("clocks", help="ar, fixed tree widths and D-cut on modelled clocks (real engine runs)")
    k.add_argument("--cell", nargs="+", required=True, metavar="REGIME:BATCHES",
                   help="`first` (fresh prompts) or `revisit` (the same prompts a GRPO epoch later, timed the second "
                        "time) and batch sizes (rows), e.g. first:8,64")
    _engine_rollout_args(k)
    k.add_argument("--dcut", nargs="*", default=[], metavar="NAME=VALUE", type=_dcut_option,
                   help="a DCutConfig setting of ours-dcut (e.g. probe_share=0.02)")
    k.add_argument("--measured", nargs="*", default=[f"{GPU_COST}:{m}" for m in ("Qwen3-8B", "Qwen3-32B")],
                   metavar="JSON:MODEL", help="clocks measured on a GPU: a lab/gpu_verify_cost.py JSON and a model in it "
                                              f"(its forwards at the profile's context; default: {GPU_COST}'s two)")
    k.add_argument("--json", type=Path)
    k.set_defaults(func=engine_clocks)
    q = engine.add_parser("pool", help="a cut of a wider proposal against the proposer's own tree (a study)")
    q.add_argument("--cell", nargs="+", required=True, metavar="REGIME:BATCHES", help="as `clocks`'")
    q.add_argument("--clock", default="H200/Qwen3-32B", help="a roofline's name (the steps' prices; MAT does not depend on it)")
    _engine_rollout_args(q)
    q.add_argument("--json", type=Path)
    q.set_defaults(func=engine_pool)
    n = engine.add_parser("learn", help="fixed trees whose index learns at only their best nodes (a study)")
    n.add_argument("--cell", nargs="+", required=True, metavar="REGIME:BATCHES", help="as `clocks`'")
    n.add_argument("--clock", default="H100-engine/Qwen3-8B",
                   help=f"a roofline's name, or H100-engine/MODEL (the forwards measured on an H100: {GPU_COST})")
    _engine_rollout_args(n)
    n.add_argument("--json", type=Path)
    n.set_defaults(func=engine_learn)
    chains = backends.add_parser("vllm", help="the vLLM backend's chains").add_subparsers(dest="cmd", required=True)
    r = chains.add_parser("record", help="plain vLLM rollouts, kept as token ids")
    r.add_argument("--model", default=str(TINY_TARGET))
    r.add_argument("--prompts", type=Path, default=TINY_PROMPTS, help="JSON lines with a `prompt` per row")
    r.add_argument("--batch", type=int, default=64)
    r.add_argument("--group", type=int, default=8)
    r.add_argument("--skip-prompts", type=int, default=0, help="start at this prompt (a recording on prompts another did not use)")
    r.add_argument("--rollouts", type=int, default=4)
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--dtype", default="float32")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", type=Path, required=True)
    r.set_defaults(func=vllm_record)
    u = chains.add_parser("run", help="replay chain proposers on a recording")
    u.add_argument("recording", type=Path)
    u.add_argument("--k", type=int, default=8, help="longest chain (num_speculative_tokens)")
    u.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    u.add_argument("--min-token-probs", type=float, nargs="*", default=[0.1, 0.3, 0.5],
                   help="suffix decoding's thresholds (none: ours only; suffix needs arctic-inference)")
    u.add_argument("--ours", nargs="*", default=[], metavar="NAME=JSON",
                   help="more variants of ours: a name and ChainConfig options, e.g. noprior='{\"use_prior\": false}'")
    u.add_argument("--revisit", action="store_true", help="each rollout replayed twice, timed the second time "
                   "(a later GRPO epoch; greedy recordings only)")
    u.add_argument("--step-ms", type=float, nargs=3, metavar=("A", "B_ROWS", "B_DRAFT"),
                   help="model a vLLM step as A + B_ROWS·rows + B_DRAFT·draft tokens ms (a fake clock): adds ours "
                        "with D-cut (`NAME+dcut@K`) and each variant's modelled speed-up over plain decoding")
    u.add_argument("--max-match", type=int, nargs="*", default=[],
                   help=f"replay ours with each of these longest contexts (the proposer's MAX_MATCH, {MAX_MATCH})")
    u.add_argument("--count-after-walk", action="store_true",
                   help="study: adds `after-walk`, ours counting a step's text after its walk where the last step drafted "
                        "(what counting beside a GPU's next forward, off the critical path, would draft)")
    u.add_argument("--json", type=Path)
    u.set_defaults(func=vllm_run)
    c = chains.add_parser("clocks", help="plain, fixed arms and D-cut on modelled clocks (CPU-measured, rooflines)")
    c.add_argument("--cell", nargs="+", required=True, metavar="RECORDING:REGIME:BATCHES",
                   help="a recording, `first` (each rollout once), `revisit` (twice, timed the second time; greedy "
                        "recordings only) or `grpo` (GRPO epochs from lab/record_grpo.py, the revisits timed) and "
                        "batch sizes, e.g. docs/bench/replay/rec_tiny_t1.json:first:8,64,256")
    c.add_argument("--dcut", nargs="*", default=[], metavar="NAME=VALUE", type=_dcut_option,
                   help="a ChainDCut setting of ours-dcut (e.g. spread=0: the rate model), to compare settings")
    c.add_argument("--proposer-cost", nargs="?", const=PROPOSER_COST, metavar="JSON",
                   help="add our proposer's own time per request-step to the rooflines' steps of the arms that run it, "
                        f"from this lab/profile_vllm_proposer.py --compare JSON (default {PROPOSER_COST}; "
                        "without the flag: the forward alone)")
    c.add_argument("--count-in-call", action="store_true",
                   help="the A/B of counting beside the forward: ours counts the text its plain spells defer in its next "
                        "draft (`RLDraftProposer.count_beside` off), its quiet calls priced by the micro-benchmark's "
                        "dcut-plain-incall arm")
    c.add_argument("--cpu-steps", nargs="*", default=STEP_COST_RUNS,
                   help="lab/vllm_step_cost.py JSONs the CPU clock is fitted to")
    c.add_argument("--longer-contexts", type=float, default=0.0, metavar="TOKENS",
                   help="study: the rooflines only, every row's context this much longer (KV reads; acceptance as recorded)")
    c.add_argument("--stale-profile", action="store_true",
                   help="with --longer-contexts: the start profile taken at the recording's contexts, not the longer ones")
    c.add_argument("--profile-param", nargs="*", default=[], metavar="NAME=VALUE", type=_dcut_option,
                   help="study: the rooflines only, ours-dcut's start profile from a roofline with these parameters "
                        "(eta_mem, eta_flop, overhead_ms, spec_ms): how wrong a start profile may be")
    c.add_argument("--json", type=Path)
    c.set_defaults(func=vllm_clocks)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the JSON records as its command
    return args.func(args)


if __name__ == "__main__":
    main()
