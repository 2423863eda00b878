#!/usr/bin/env python
"""vLLM backend benchmark: GRPO rollouts (P prompts × G samples, EOS on) through vLLM in one process.

Methods (each a `vllm.LLM` built once; every repeat runs every method once, in a fresh random
order, on prompts no earlier repeat used — so no method recalls an earlier repeat's completions):

    plain, plain-twin   vLLM without speculation (the twin is an A/A control: its ratio shows the noise)
    ngram@K             vLLM's prompt-lookup proposer
    suffix@K            vLLM's suffix decoding (arctic-inference)
    ours@K              our proposer, fixed budget (every request drafts up to K)
    ours+dcut@K         our proposer with D-cut (depths up to K)
    oracle@K            drafts the recorded T=0 plain completion: what speculation can give here at all
    empty@K             drafts nothing: vLLM's speculative path with empty drafts, the floor of a
                        proposer that decodes plainly, as vLLM ships it
    empty+plain@K       the same with our plugin's plain path for undrafted steps (our proposer's floor)
    engine-ar, engine-retrieval+dcut   our own engine (HF forwards) on the same prompts

Each method runs in its own process next to its own `plain` (vLLM binds a process's threads, and
several engines in one process slowed each other tenfold here; its Prometheus counters are
process-wide). By default one engine per method runs every cell (temperature × batch) in turn,
so what a method learned in one cell carries into the next; `--per-cell` builds fresh engines
for each cell (a GRPO run keeps one temperature and batch size), and `--warmup-rollouts W` runs
W untimed rollouts of every method per cell first (the steady state of a run, not its cold start);
`--revisit` runs each timed rollout's prompts once before, untimed (a later GRPO epoch: our
`recall`, and vLLM suffix decoding's cache of earlier responses, may reuse that epoch's text).
Tokens/s are reported as the median over repeats of each run's ratio to that process's `plain`
run of the same repeat; MAT = emitted tokens / (emitted − accepted draft
tokens), i.e. tokens per request-step.

    python scripts/bench_vllm.py --batches 1 8 64 --temperatures 1.0 0.0 --out docs/bench/vllm_tiny.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET, read_prompt_texts  # noqa: E402
from rollout_graft.vllm import proposer_summary, speculative_config  # noqa: E402
from rollout_graft.vllm.groups import RequestTracker  # noqa: E402

COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
ORACLE: dict[tuple[int, ...], list[int]] = {}  # prompt token ids → recorded T=0 completion (OracleProposer reads it)


class OracleProposer:
    """Drafts each request's recorded T=0 plain completion from where the request stands."""

    def __init__(self, vllm_config):
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.tracker = RequestTracker()
        self.counts = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
        self.pending: dict[int, int] = {}  # id(request) → draft length returned last step

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        out, pending = [], {}
        for req, new in zip(self.tracker.rows(sampled_token_ids, num_tokens_no_spec, token_ids_cpu), sampled_token_ids):
            if req is None:
                out.append([])
                continue
            if self.pending.get(id(req)):  # counted as vLLM counts: drafts that were verified
                self.counts["drafts"] += 1
                self.counts["draft_tokens"] += self.pending[id(req)]
                self.counts["accepted_tokens"] += len(new) - 1
            prompt = tuple(req.group.prompt)
            done = req.length - len(prompt)
            out.append(ORACLE.get(prompt, [])[done : done + self.k])
            pending[id(req)] = len(out[-1])
        self.pending = pending
        return out


def _oracle_counts(worker) -> dict:
    return dict(worker.model_runner.drafter.counts)


def spec_for(method: str):
    base, _, k = method.partition("@")
    k = int(k or 8)
    if base in ("plain", "plain-twin"):
        return None
    if base == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    if base == "suffix":  # vLLM's suffix decoding (arctic-inference: see docs/BENCHMARKS.md for its build)
        return {"method": "suffix", "num_speculative_tokens": k}
    if base == "ours":
        return speculative_config(k, "fixed")
    if base == "ours+dcut":
        return speculative_config(k, "dcut")
    if base == "oracle":
        return {"method": "custom_class", "model": "bench_vllm.OracleProposer", "num_speculative_tokens": k}
    if base == "empty":
        return {"method": "custom_class", "model": "rollout_graft.vllm.baselines.EmptyProposer", "num_speculative_tokens": k}
    if base == "empty+plain":
        return {"method": "custom_class", "model": "rollout_graft.vllm.baselines.PlainEmptyProposer", "num_speculative_tokens": k}
    raise SystemExit(f"unknown method {method!r}")


def counters(llm, method: str) -> dict:
    """drafts / draft_tokens / accepted_tokens so far. vLLM's Prometheus counters are process-wide and
    read the last-built engine's (ngram is built last); ours and the oracle count for themselves (our
    proposer's counts equal vLLM's: tests/test_vllm.py)."""
    if method.startswith("ours"):
        return {k: proposer_summary(llm)[k] for k in COUNTERS.values()}
    if method.startswith(("oracle", "empty")):
        return llm.collective_rpc(_oracle_counts)[0]
    got = {COUNTERS[m.name]: m.value for m in llm.get_metrics() if m.name in COUNTERS}
    return {k: got.get(k, 0) for k in COUNTERS.values()}


def run_vllm(llm, method: str, prompts: list[str], group: int, params) -> dict:
    before = counters(llm, method)
    ours = method.startswith("ours")
    prop_before = proposer_summary(llm)["propose_s"] if ours else 0.0
    start = time.perf_counter()
    outs = llm.generate([p for p in prompts for _ in range(group)], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    after = counters(llm, method)
    d = {k: after[k] - before[k] for k in after}
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    accepted = d.get("accepted_tokens", 0)
    row_steps = max(tokens - accepted, 1)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "mat": tokens / row_steps,
            "drafted_per_step": d.get("draft_tokens", 0) / row_steps, "accepted_per_step": accepted / row_steps,
            "proposer_share": ((proposer_summary(llm)["propose_s"] - prop_before) / seconds) if ours else None,
            "completions": [list(o.outputs[0].token_ids) for o in outs]}


def run_untimed(built: dict, prompts: list[str], group: int, params) -> None:
    """A rollout of these prompts on every vLLM method, not measured (`--warmup-rollouts`,
    `--revisit`): what each proposer learns from it is what a GRPO run would have learned. Our
    engine and the oracle are left out (nothing to learn)."""
    for m, llm in built.items():
        if not m.startswith(("engine-", "oracle")):
            llm.generate([p for p in prompts for _ in range(group)], params, use_tqdm=False)


def run_engine(engine, tokenizer, prompts: list[str], group: int, temperature: float, max_tokens: int) -> dict:
    from rollout_graft import SamplingParams

    rows = [tokenizer(p)["input_ids"] for p in prompts for _ in range(group)]
    start = time.perf_counter()
    out = engine.generate(rows, SamplingParams(temperature=temperature, max_new_tokens=max_tokens))
    seconds = time.perf_counter() - start
    tokens = sum(len(c) for c in out.completion_ids)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "mat": out.stats.mean_accepted_tokens, "drafted_per_step": None, "accepted_per_step": None,
            "proposer_share": None}


def build(methods: list[str], model: str, max_len: int, dtype: str):
    from transformers import AutoTokenizer
    from vllm import LLM

    from rollout_graft import EngineConfig, RolloutEngine

    built = {}
    # vLLM's Prometheus counters read the last-built engine's: build vLLM's own proposer (one at
    # most) last
    internal = [m for m in methods if m.startswith(("ngram", "suffix"))]
    if len(internal) > 1:
        raise SystemExit(f"one of vLLM's own proposers per run (its counters are process-wide), got {internal}")
    for m in sorted(methods, key=lambda m: m in internal):
        if m.startswith("engine-"):
            cfg = EngineConfig(method="ar") if m == "engine-ar" else EngineConfig(method="retrieval", budget_policy="dcut")
            import torch

            built[m] = RolloutEngine.from_pretrained(model, config=cfg, dtype=getattr(torch, dtype))
        else:
            built[m] = LLM(model, dtype=dtype, max_model_len=max_len, seed=0, enforce_eager=True,
                           speculative_config=spec_for(m), disable_log_stats=False)
    return built, AutoTokenizer.from_pretrained(model)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(TINY_TARGET))
    ap.add_argument("--prompts", default=str(TINY_PROMPTS), help="JSON lines with a `prompt` string per row")
    ap.add_argument("--methods", nargs="+", default=["plain", "plain-twin", "ngram@4", "ours@4", "ours+dcut@8",
                                                      "oracle@4", "engine-ar", "engine-retrieval+dcut"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64], help="rows per rollout (prompts × G)")
    ap.add_argument("--group", type=int, default=8, help="G: samples per prompt (fewer when the batch is smaller)")
    ap.add_argument("--temperatures", nargs="+", type=float, default=[1.0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--warmup-rollouts", type=int, default=0,
                    help="per cell, untimed rollouts of every method before the timed repeats (on prompts they do not use)")
    ap.add_argument("--per-cell", action="store_true",
                    help="fresh engines for every (temperature, batch) cell: a GRPO run keeps one temperature and "
                         "batch size, so what a method learned in another cell does not carry over")
    ap.add_argument("--revisit", action="store_true",
                    help="a GRPO epoch later: before each timed rollout every method runs the same prompts once, "
                         "untimed (what recall and every method's caches may reuse)")
    ap.add_argument("--in-process", action="store_true", help="run --methods here (the driver passes it)")
    args = ap.parse_args(argv)
    if not args.in_process:
        return drive(args, argv if argv is not None else sys.argv[1:])
    from vllm import SamplingParams

    sys.modules.setdefault("bench_vllm", sys.modules[__name__])  # vLLM imports the oracle from here
    built, tokenizer = build(args.methods, args.model, None, args.dtype)  # max_model_len: the model's
    # chat prompts (real-prompts/) go through the model's chat template, as TRL sends them
    pool = read_prompt_texts(args.prompts, tokenizer)
    results = {"command": " ".join(["python", "scripts/bench_vllm.py", *(argv or sys.argv[1:])]), "configs": []}
    rng, offset = random.Random(0), 0
    for temperature in args.temperatures:
        for batch in args.batches:
            group = min(args.group, batch)
            runs: dict[str, list[dict]] = {m: [] for m in args.methods}
            for _ in range(args.warmup_rollouts):  # untimed: what a GRPO run has learned before a rollout
                prompts = [pool[(offset + i) % len(pool)] for i in range(batch // group)]
                offset += len(prompts)
                params = SamplingParams(temperature=temperature, max_tokens=args.max_tokens)
                run_untimed(built, prompts, group, params)
            for _ in range(args.repeats):
                prompts = [pool[(offset + i) % len(pool)] for i in range(batch // group)]
                offset += len(prompts)
                oracle = built["plain"].generate(prompts, SamplingParams(temperature=0, max_tokens=args.max_tokens),
                                                 use_tqdm=False)
                ORACLE.clear()
                ORACLE.update({tuple(o.prompt_token_ids): list(o.outputs[0].token_ids) for o in oracle})
                params = SamplingParams(temperature=temperature, max_tokens=args.max_tokens)
                if args.revisit:  # the prompts' previous epoch, untimed
                    run_untimed(built, prompts, group, params)
                for m in rng.sample(args.methods, len(args.methods)):
                    if m.startswith("engine-"):
                        runs[m].append(run_engine(built[m], tokenizer, prompts, group, temperature, args.max_tokens))
                    else:
                        runs[m].append(run_vllm(built[m], m, prompts, group, params))
            results["configs"].append(summarize(runs, batch, group, temperature))
            print(markdown_row_block(results["configs"][-1]), flush=True)
    for cfg in results["configs"]:
        for r in cfg["methods"].values():
            r.pop("completions", None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(markdown(results))
    return results


def _without(argv: list[str], *flags: str) -> list[str]:
    """argv without these flags and their values."""
    out, skip = [], False
    for a in argv:
        if a.startswith("--"):
            skip = a in flags
        if not skip:
            out.append(a)
    return out


def drive(args, argv: list[str]) -> dict:
    """Run each method in a process of its own beside `plain`; merge their results."""
    import subprocess
    import tempfile

    base = _without(argv, "--out", "--methods")  # each child gets its own methods and output
    cells = [[]]
    if args.per_cell:  # a child per (temperature, batch): fresh engines
        base = _without(base, "--batches", "--temperatures")
        cells = [["--temperatures", str(t), "--batches", str(b)] for t in args.temperatures for b in args.batches]
    merged = {"command": " ".join(["python", "scripts/bench_vllm.py", *argv]), "configs": []}
    for m, cell in [(m, cell) for cell in cells for m in args.methods if m != "plain"]:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.json"
            cmd = [sys.executable, __file__, *base, *cell, "--methods", "plain", m, "--out", str(out), "--in-process"]
            subprocess.run(cmd, check=True)
            part = json.loads(out.read_text())
        for cfg in part["configs"]:
            key = (cfg["batch"], cfg["temperature"])
            same = next((c for c in merged["configs"] if (c["batch"], c["temperature"]) == key), None)
            if same is None:
                merged["configs"].append(cfg)
            else:
                same["methods"][m] = cfg["methods"][m]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=1))
    print(markdown(merged))
    return merged


def summarize(runs: dict[str, list[dict]], batch: int, group: int, temperature: float) -> dict:
    plain = runs["plain"]
    methods = {}
    for m, rs in runs.items():
        ratios = [r["tokens_per_s"] / p["tokens_per_s"] for r, p in zip(rs, plain)]
        med = lambda key: statistics.median([r[key] for r in rs]) if rs[0].get(key) is not None else None  # noqa: E731
        methods[m] = {"ratio_to_plain": statistics.median(ratios), "ratios": ratios,
                      "tokens_per_s": med("tokens_per_s"), "mat": med("mat"), "drafted_per_step": med("drafted_per_step"),
                      "accepted_per_step": med("accepted_per_step"), "proposer_share": med("proposer_share"),
                      "tokens": sum(r["tokens"] for r in rs)}
    return {"batch": batch, "group": group, "temperature": temperature, "methods": methods}


def _f(v, spec):
    return "–" if v is None else format(v, spec)


def markdown_row_block(cfg: dict) -> str:
    head = (f"\nbatch {cfg['batch']} (G={cfg['group']}), T={cfg['temperature']}\n"
            "| method | × plain (median, [min–max]) | tok/s | MAT | drafted/step | accepted/step | proposer share |\n"
            "|---|---|---|---|---|---|---|")
    rows = [f"| {m} | {r['ratio_to_plain']:.2f} [{min(r['ratios']):.2f}–{max(r['ratios']):.2f}] | "
            f"{r['tokens_per_s']:.0f} | {_f(r['mat'], '.2f')} | {_f(r['drafted_per_step'], '.2f')} | "
            f"{_f(r['accepted_per_step'], '.2f')} | {_f(r['proposer_share'], '.1%')} |" for m, r in cfg["methods"].items()]
    return "\n".join([head, *rows])


def markdown(results: dict) -> str:
    return "\n".join(markdown_row_block(cfg) for cfg in results["configs"])


if __name__ == "__main__":
    main()
