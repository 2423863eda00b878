#!/usr/bin/env python
"""vLLM's step time against the draft tokens it verifies, measured with our proposer (tiny target).

    python lab/vllm_step_cost.py --batch 8 --rollouts 16 --json docs/bench/vllm_step_cost_b8.json

Our proposer drafts as usual, but a random policy cuts each step's chains: a depth of 0, 1, 2, 4 or
8 tokens (0 twice as often: vLLM's plain path), for a random quarter, half or all of the rows. Each
step's time (between `propose` calls, as D-cut measures it) is kept with its rows, draft tokens and
rows that drafted. It then fits, on the steps with a (nearly) full batch, the step-cost models a
budget policy could use — `linear` (a + b_rows·rows + b_draft·tokens), `spec` (+ b_spec when any
row drafted: what `dcut.chains.step_cost_fit` fits), and two richer ones (+ rows that drafted; + the
deepest chain) — and reports each model's cross-validated mean absolute error and its bias on the
steps that drafted at most a token per row (the drafts D-cut weighs at break-even), and how much
slower a token count's first step is than its later ones (`first_counts`; the proposer times it
like any other: leaving it untimed, the ablation variant `untimed-first-counts`, gained nothing).
Every step is timed here, a count's first too. Its timings follow this machine's
load, so runs differ. `--from-json` refits the raw steps of an earlier run instead of running vLLM:

    python lab/vllm_step_cost.py --from-json docs/bench/vllm_step_cost_b8.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

import numpy as np  # noqa: E402

from rollout_graft_tools.random_cut import steps_of  # noqa: E402

MODELS = {  # name → features of a step (rows, tokens, any drafted, rows drafting, deepest chain)
    "linear": lambda r, t, a, n, d: [1.0, r, t],
    "spec": lambda r, t, a, n, d: [1.0, r, t, a],
    "spec+drafting_rows": lambda r, t, a, n, d: [1.0, r, t, a, n],
    "spec+deepest": lambda r, t, a, n, d: [1.0, r, t, a, d],
}


def fit_models(steps: np.ndarray, batch: int) -> dict:
    """Least-squares fits of each model on the steps with ≥ 3/4 of the batch (the slowest 3 %
    dropped: a busy machine's hiccups), 5-fold cross-validated."""
    steps = steps[steps[:, 0] >= 0.75 * batch]
    steps = steps[steps[:, 2] < np.percentile(steps[:, 2], 97)]
    rows, tokens, ms, drafting, deepest = steps.T
    fold = np.random.default_rng(0).integers(0, 5, len(steps))
    small = (tokens > 0) & (tokens <= rows)
    out = {"steps": len(steps), "plain_ms": float(np.median(ms[tokens == 0])), "models": {}}
    for name, features in MODELS.items():
        x = np.array([features(*s) for s in zip(rows, tokens, (tokens > 0).astype(float), drafting, deepest)])
        errors = np.concatenate([np.abs(x[fold == k] @ np.linalg.lstsq(x[fold != k], ms[fold != k], rcond=None)[0]
                                        - ms[fold == k]) for k in range(5)])
        coef = np.linalg.lstsq(x, ms, rcond=None)[0]
        out["models"][name] = {"mae_ms": float(errors.mean()), "coef": coef.round(4).tolist(),
                               "bias_small_drafts_ms": float(np.mean(x[small] @ coef - ms[small])), "small_drafts": int(small.sum())}
    return out


def first_counts(steps: np.ndarray, least: int = 4) -> dict:
    """Each token count's (rows + draft tokens) first and second step against the median of its
    steps after the first, over the counts run at least `least` times (steps in the order run)."""
    times: dict[int, list[float]] = {}
    for rows, tokens, ms, *_ in steps.tolist():
        times.setdefault(int(rows + tokens), []).append(ms)
    first = [t[0] / np.median(t[1:]) for t in times.values() if len(t) >= least]
    second = [t[1] / np.median(t[1:]) for t in times.values() if len(t) >= least]
    return {"counts": len(first), "first_median": float(np.median(first)), "first_min": float(min(first)),
            "first_max": float(max(first)), "second_median": float(np.median(second))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8, help="rows per rollout (groups of 8 samples per prompt)")
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", help="write the steps and the fits here")
    ap.add_argument("--from-json", help="refit the raw steps kept in this earlier --json instead of running vLLM")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            kept = json.load(f)
        report({"command": kept["command"], **analyse(np.array(kept["raw_steps"]), args.batch)})
        return
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET, read_prompt_texts

    prompts = read_prompt_texts(str(TINY_PROMPTS), AutoTokenizer.from_pretrained(str(TINY_TARGET)))
    llm = LLM(str(TINY_TARGET), dtype="float32", seed=0, enforce_eager=True,
              speculative_config={"method": "custom_class", "model": "rollout_graft_tools.random_cut.RandomCutProposer",
                                  "num_speculative_tokens": 8})
    group, used = min(8, args.batch), 0
    for _ in range(args.rollouts):
        rows = prompts[used : used + args.batch // group]
        used += len(rows)
        llm.generate([p for p in rows for _ in range(group)],
                     SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens), use_tqdm=False)
    steps = np.array(llm.collective_rpc(steps_of)[0], dtype=np.float64)
    result = {"command": " ".join(["python", "lab/vllm_step_cost.py", *sys.argv[1:]]), **analyse(steps, args.batch)}
    report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**result, "raw_steps": steps.tolist()}, f)


def analyse(steps: np.ndarray, batch: int) -> dict:
    return {**fit_models(steps, batch), "first_counts": first_counts(steps)}


def report(result: dict) -> None:
    print(f"{result['steps']} steps at ≥ 3/4 of the batch; a plain step {result['plain_ms']:.2f} ms (median)")
    for name, m in result["models"].items():
        print(f"{name:20s} MAE {m['mae_ms']:.3f} ms  bias on ≤ 1 token per row {m['bias_small_drafts_ms']:+.2f} ms "
              f"({m['small_drafts']} steps)  coef {m['coef']}")
    fc = result["first_counts"]
    print(f"a token count's first step: {fc['first_median']:.2f}× its later steps' median ({fc['first_min']:.2f}–"
          f"{fc['first_max']:.2f}, {fc['counts']} counts run ≥ 4 times); its second {fc['second_median']:.2f}×")


if __name__ == "__main__":
    main()
