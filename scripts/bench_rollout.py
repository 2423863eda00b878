#!/usr/bin/env python
"""GRPO rollout benchmark (DESIGN.md §7): P prompts × G samples, L new tokens, EOS on.

Every configuration runs in this one process on the same prompts and seeds; speed is reported
as completion tokens/s (median of --repeats) and as a ratio against our own "ar" path measured in
the same run (medians, best runs, the median of each repeat's ratio to ar's run of that repeat,
and tokens per second of the process's CPU time — the last two steadier on a shared machine),
plus plain Hugging Face `generate` (batched sampling, num_return_sequences=G).

    python scripts/bench_rollout.py --threads 2 --out docs/bench/tiny.json
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from report import markdown, paired_ratio  # scripts/report.py renders the tables
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_graft import DraftConfig, EngineConfig, RetrievalConfig, RolloutEngine, SamplingParams, calibrate
from rollout_graft.assets import TINY_DRAFT, TINY_PROMPTS, TINY_TARGET, read_jsonl
from rollout_graft.warmup import warm_prior

GRAFT_VARIANTS = ("dense-draft", "prune-only", "fixed-split", "graft", "graft+dcut")


def variant(name: str, budget: int, prior: str | None, draft: str | None = None,
            thresholds: str | None = None) -> EngineConfig:
    """The engine configuration called `name`; `name@N` is that configuration with budget N, and
    `name:field=value[:field=value]` sets fields of its `DCutConfig` (ablations: `retrieval+dcut:probe_share=0.05`)."""
    name, *knobs = name.split(":")
    base, _, size = name.partition("@")
    known = variants(budget, prior, draft, thresholds)
    if base not in known:
        raise SystemExit(f"unknown method {name!r}; known: hf, {', '.join(known)} (optionally @<budget>)")
    cfg = replace(known[base], budget=int(size)) if size else known[base]
    if knobs:
        fields = {k: ast.literal_eval(v) for k, _, v in (knob.partition("=") for knob in knobs)}
        cfg = replace(cfg, dcut=replace(cfg.dcut, **fields))
    return cfg


def variants(budget: int, prior: str | None, draft: str | None = None, thresholds: str | None = None) -> dict[str, EngineConfig]:
    """Named engine configurations (ablations are options of a method, not copies)."""
    r = RetrievalConfig(prior_path=prior, update_prior=False)
    d = DraftConfig(draft_model=draft, thresholds_path=thresholds)
    graft = lambda dc: EngineConfig(method="graft", budget=budget, retrieval=r, draft=dc)  # noqa: E731
    return {
        "dense-draft": graft(replace(d, prune=False, graft=False)),  # EAGLE-like dense drafter tree
        "prune-only": graft(replace(d, graft=False)),  # pruned, freed slots left empty
        "fixed-split": graft(replace(d, prune=False, adaptive_split=False)),  # draft + retrieval, fixed split
        "graft": graft(d),
        "graft+dcut": replace(graft(d), budget_policy="dcut"),
        "ar": EngineConfig(method="ar"),
        # A/A control: a second engine identical to "ar"; its ratios to "ar" show the noise of the run
        "ar-twin": EngineConfig(method="ar"),
        "retrieval+dcut": EngineConfig(method="retrieval", budget=budget, retrieval=r, budget_policy="dcut"),
        "retrieval": EngineConfig(method="retrieval", budget=budget, retrieval=r),
        "retrieval-noshare": EngineConfig(method="retrieval", budget=budget, retrieval=replace(r, share_in_group=False)),
        "retrieval-noprior": EngineConfig(method="retrieval", budget=budget, retrieval=replace(r, use_prior=False)),
        "retrieval-order2": EngineConfig(method="retrieval", budget=budget, retrieval=replace(r, context_order=2)),
        # suffix chains copied from the group's text; "lead": each group's first row runs first
        "retrieval+suffix": EngineConfig(method="retrieval", budget=budget, retrieval=replace(r, suffix_depth=8)),
        "retrieval+suffix-noshare": EngineConfig(method="retrieval", budget=budget,
                                                 retrieval=replace(r, suffix_depth=8, share_in_group=False)),
        # + completions of the same prompts from earlier rollouts (GRPO epochs; run with --reuse-engine)
        "retrieval+recall": EngineConfig(method="retrieval", budget=budget, retrieval=replace(r, suffix_depth=8, recall=8)),
        "retrieval+recall+dcut": EngineConfig(method="retrieval", budget=budget, budget_policy="dcut",
                                              retrieval=replace(r, suffix_depth=8, recall=8)),
        "retrieval+lead": EngineConfig(method="retrieval", budget=budget, group_lead=1, retrieval=replace(r, suffix_depth=8)),
        "retrieval+lead-noshare": EngineConfig(method="retrieval", budget=budget, group_lead=1,
                                               retrieval=replace(r, suffix_depth=8, share_in_group=False)),
        "retrieval+lead+dcut": EngineConfig(method="retrieval", budget=budget, group_lead=1, budget_policy="dcut",
                                            retrieval=replace(r, suffix_depth=8)),
        "retrieval-bare": EngineConfig(method="retrieval", budget=budget,
                                       retrieval=replace(r, share_in_group=False, use_prior=False)),
    }


def load_prompts(path: Path, tokenizer, split: str, n: int, offset: int = 0) -> list[list[int]]:
    rows = read_jsonl(path, split=split)[offset : offset + n]
    if len(rows) < n:
        raise SystemExit(f"{path} has only {len(rows)} {split!r} prompts after offset {offset}; need {n}")
    if isinstance(rows[0]["prompt"], list):  # chat messages
        return [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)
                ["input_ids"] for r in rows]
    return [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]


def calibrate_graft(model, tokenizer, prompts: list[list[int]], group: int, params: SamplingParams, draft: str,
                    prior: str, path: str, objective: str) -> float:
    """Fit the graft pruning thresholds τ on the warm-up (train) prompts; saves them as JSON."""
    cfg = EngineConfig(method="graft", retrieval=RetrievalConfig(prior_path=prior, update_prior=False),
                       draft=DraftConfig(draft_model=draft))
    start = time.perf_counter()
    calibrate(RolloutEngine(model, cfg, tokenizer=tokenizer), [p for p in prompts for _ in range(group)],
              replace(params, seed=20_000), path=path, objective=objective)
    return time.perf_counter() - start


def run_engine(model, tokenizer, cfg: EngineConfig, rows, params: SamplingParams, engine: RolloutEngine | None = None) -> dict:
    """One timed rollout; a fresh engine unless `engine` is given (--reuse-engine)."""
    engine = engine or RolloutEngine(model, cfg, tokenizer=tokenizer)
    engine.budget_policy()  # D-cut: profile the cost model (or read its disk cache) before the clock starts
    start, cpu = time.perf_counter(), time.process_time()
    out = engine.generate(rows, params)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    s = out.stats
    return {
        "wall_s": wall, "cpu_s": cpu, "tokens": s.emitted_tokens, "tokens_per_s": s.emitted_tokens / wall,
        "mat": s.mean_accepted_tokens, "verify_tokens_per_step": s.verify_tokens_per_step,
        "target_forwards": s.target_forwards, "phase_s": s.seconds,
        "propose_share": s.seconds.get("propose", 0.0) / wall,  # drafter + retrieval + merge + D-cut
        "proposer_s": dict(getattr(engine.proposer, "seconds", {})),  # graft: "draft" (drafter) and "graft"
        "budget_ratio": s.budget_ratio,  # D-cut: mean ρ; the trace shows ρ as the batch drains
        "budget_trace": [(t["rows"], t["ratio"], t["kept"]) for t in s.budget_trace],
        "dcut_expected_vs_actual": [sum(t["expected"] or 0.0 for t in s.budget_trace), sum(t["actual"] for t in s.budget_trace)],
        "accept_hist": list(s.accept_hist),  # RolloutStats.count_emitted (empty unless the engine counts)
    }


def run_hf(model, tokenizer, prompts: list[list[int]], group: int, params: SamplingParams) -> dict:
    """Plain HF generate on the same batch: left-padded distinct prompts × num_return_sequences."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    kw = dict(max_new_tokens=params.max_new_tokens, pad_token_id=pad, top_k=0, top_p=1.0)
    if params.ignore_eos:
        kw["min_new_tokens"] = params.max_new_tokens
    if params.temperature > 0:
        kw.update(do_sample=True, temperature=params.temperature, num_return_sequences=group)
    else:
        ids, mask = ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0)
        kw.update(do_sample=False)
    torch.manual_seed(params.seed or 0)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, **kw)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    eos = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
              else [model.generation_config.eos_token_id])
    tokens = 0
    for row in out[:, width:].tolist():
        n = len(row)
        if not params.ignore_eos:
            n = next((i + 1 for i, t in enumerate(row) if t in eos), n)
        tokens += n
    return {"wall_s": wall, "cpu_s": cpu, "tokens": tokens, "tokens_per_s": tokens / wall, "mat": 1.0,
            "verify_tokens_per_step": float(len(out)), "target_forwards": out.shape[1] - width, "phase_s": {}}


def median_of(runs: list[dict]) -> dict:
    best = sorted(runs, key=lambda r: r["tokens_per_s"])[len(runs) // 2]
    cpu = sorted(r["tokens"] / max(r["cpu_s"], 1e-9) for r in runs)[len(runs) // 2]
    # sums over every repeat (not just the median run): what a method's own phases cost per token is
    # steadier pooled over all repeats than read off one run of a noisy machine
    totals = {"wall_s_total": sum(r["wall_s"] for r in runs), "tokens_total": sum(r["tokens"] for r in runs),
              "phase_s_total": {k: sum(r["phase_s"].get(k, 0.0) for r in runs) for k in runs[0]["phase_s"]}}
    return {**best, "tokens_per_s_runs": [r["tokens_per_s"] for r in runs], "cpu_tokens_per_s": cpu, **totals}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(TINY_TARGET))
    ap.add_argument("--prompts", default=str(TINY_PROMPTS))
    ap.add_argument("--num-prompts", type=int, nargs="+", default=[8], help="P values (batch = P × G)")
    ap.add_argument("--group-size", type=int, default=8, help="G samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every row generates --max-new-tokens (longer, steadier timings; the text past EOS is the model's)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.0])
    ap.add_argument("--methods", nargs="+", default=["hf", "ar", "retrieval", "retrieval-noshare",
                                                      "retrieval-noprior", "retrieval-bare"],
                    help="configurations to run (see variants()); NAME@N runs NAME with budget N")
    ap.add_argument("--draft-model", default=str(TINY_DRAFT), help="drafter of the graft variants")
    ap.add_argument("--calibration", default="accepted", choices=["accepted", "separation"],
                    help="objective of the graft pruning thresholds (rollout_graft.pruning)")
    ap.add_argument("--budget", type=int, default=60, help="candidate nodes per sequence and step")
    ap.add_argument("--warmup-rounds", type=int, default=5, help="prior warm-up rounds over train prompts")
    ap.add_argument("--warmup-budget", type=int, default=60, help="retrieval nodes per sequence while warming the prior")
    ap.add_argument("--warmup-prompts", type=int, default=8, help="train prompts the prior is warmed on")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reuse-engine", action="store_true",
                    help="as a trainer does: one engine per method and batch, kept across repeats (D-cut keeps its "
                         "calibration and overhead model), after one untimed warm-up rollout")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the results JSON here")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    results = {"command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
               "model": args.model, "threads": args.threads, "budget": args.budget, "reuse_engine": args.reuse_engine,
               "dtype": args.dtype, "device": args.device,
               "torch": torch.__version__, "configs": []}
    prior_file = tempfile.NamedTemporaryFile(suffix=".safetensors", delete=False).name
    warm_prompts = load_prompts(Path(args.prompts), tokenizer, "train", args.warmup_prompts)
    for temperature in args.temperatures:
        base = SamplingParams(temperature=temperature, max_new_tokens=args.max_new_tokens, seed=args.seed,
                              ignore_eos=args.ignore_eos)
        start = time.perf_counter()
        warm_prior(model, warm_prompts, prior_file, rounds=args.warmup_rounds, group=args.group_size, params=base,
                   tokenizer=tokenizer, budget=args.warmup_budget)
        warm_s = time.perf_counter() - start
        tau_file = None
        if any(m.split(":")[0].partition("@")[0] in GRAFT_VARIANTS for m in args.methods):
            tau_file = prior_file.replace(".safetensors", ".tau.json")
            calibrate_graft(model, tokenizer, warm_prompts, args.group_size, base, args.draft_model, prior_file, tau_file,
                            args.calibration)
        for p in args.num_prompts:
            prompts = load_prompts(Path(args.prompts), tokenizer, "test", p)
            rows = [q for q in prompts for _ in range(args.group_size)]
            entry = {"temperature": temperature, "prompts": p, "group": args.group_size, "batch": len(rows),
                     "prior_warmup_s": warm_s, "methods": {},
                     "graft_thresholds": json.loads(Path(tau_file).read_text()) if tau_file else None}
            bar = tqdm(total=len(args.methods) * args.repeats, desc=f"T={temperature} batch={len(rows)}", unit="run",
                       leave=False)
            # repeats are interleaved (every method once per repeat, in a shuffled order) so a slow spell of the shared
            # machine or the allocator state left by one method does not fall on one method's runs only
            runs: dict[str, list[dict]] = {name: [] for name in args.methods}
            cfgs = {name: variant(name, args.budget, prior_file, args.draft_model, tau_file)
                    for name in args.methods if name != "hf"}
            engines: dict[str, RolloutEngine] = {}
            if args.reuse_engine:  # build and warm every engine once (untimed), before the timed repeats
                for name, cfg in cfgs.items():
                    engines[name] = RolloutEngine(model, cfg, tokenizer=tokenizer)
                    run_engine(model, tokenizer, cfg, rows, replace(base, seed=args.seed + 10_000), engines[name])
            for rep in range(args.repeats):
                params = replace(base, seed=args.seed + rep)
                # a fresh (seeded) order each repeat: no method always runs at the same position or
                # right after the same one — a rotation would keep each method behind the same
                # predecessor (e.g. a wide-tree engine whose allocations slow the next forwards)
                for name in random.Random(args.seed + rep).sample(args.methods, len(args.methods)):
                    bar.set_postfix_str(name)
                    if name == "hf":
                        runs[name].append(run_hf(model, tokenizer, prompts, args.group_size, params))
                    else:
                        runs[name].append(run_engine(model, tokenizer, cfgs[name], rows, params, engines.get(name)))
                    bar.update()
            for name in args.methods:
                entry["methods"][name] = m = median_of(runs[name])
                bar.write(f"T={temperature} batch={len(rows)} {name:>18}: {m['tokens_per_s']:8.1f} tok/s  "
                          f"MAT {m['mat']:.2f}  verify/step {m['verify_tokens_per_step']:.0f}  "
                          f"propose {100 * m.get('propose_share', 0.0):.0f}%")
            bar.close()
            ar = entry["methods"].get("ar")
            for m in entry["methods"].values():
                m["ratio_vs_ar"] = m["tokens_per_s"] / ar["tokens_per_s"] if ar else None
                # best of the repeats over ar's best: the intrinsic ratio on a noisy shared machine
                m["best_ratio_vs_ar"] = (max(m["tokens_per_s_runs"]) / max(ar["tokens_per_s_runs"])
                                         if ar and m.get("tokens_per_s_runs") else None)
                # tokens per second of this process's own CPU time (medians): time the shared machine
                # gave to other jobs is not counted, so this ratio is steadier than the wall-clock ones
                m["cpu_ratio_vs_ar"] = m["cpu_tokens_per_s"] / ar["cpu_tokens_per_s"] if ar else None
                m["paired_ratio_vs_ar"] = paired_ratio(m, ar)
            results["configs"].append(entry)
    os.unlink(prior_file)
    if os.path.exists(prior_file.replace(".safetensors", ".tau.json")):
        os.unlink(prior_file.replace(".safetensors", ".tau.json"))
    print(markdown(results))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--markdown":  # re-render a saved JSON
        print(markdown(json.loads(Path(sys.argv[2]).read_text())))
    else:
        main()
