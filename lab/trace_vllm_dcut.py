#!/usr/bin/env python
"""Trace chain D-cut's state through a sequence of rollouts in one vLLM engine (tiny target).

    python lab/trace_vllm_dcut.py 1:1 8:1 64:1 1:0 1:0 1:0
    python lab/trace_vllm_dcut.py --model M --prompts P.jsonl 8:0 8:0:again   # a later epoch

Each argument is one rollout, `batch:temperature` (batch 8 and up: groups of 8 samples per prompt;
prompts no earlier rollout used; at most --max-tokens new tokens), or `batch:temperature:again`
(the last rollout's prompts again: a later GRPO epoch). After each rollout it prints what our
proposer drafted in it (steps, drafts, draft and accepted tokens) and the policy's state: whether
the last decision was plain, the probe credit (ms), the step-cost fit ([a, b_rows, b_draft, b_spec]
ms) and the steps it was fitted on, the share of plain steps it remembers, the predicted drafting time at
one row and the acceptance rate so far: a trace of D-cut's cold start, its cost model and its probe
credit. Its decisions follow measured step times, so runs differ.
"""

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

from vllm import LLM, SamplingParams  # noqa: E402

from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET, read_prompt_texts  # noqa: E402
from rollout_graft.vllm import proposer_summary, speculative_config  # noqa: E402


def policy_state(worker) -> dict:
    p = worker.model_runner.drafter.policy
    seen = float(p.calibration.seen.sum())
    return {"plain": p.plain, "credit_ms": round(p.credit.ms, 2), "fit": p.cost.coef.round(3).tolist(),
            "steps_fitted": p.cost.samples,
            "plain_share": round(p.plain_share(), 3) if p.cost.samples else None,
            "draft_ms1": round(float(p.draft_cost.predict(1)), 3),
            "accept_rate": round(float(p.calibration.accepted.sum()) / seen, 3) if seen else None}


def main(cells: list[str], model: str = str(TINY_TARGET), prompts_path: str = str(TINY_PROMPTS), max_tokens: int = 128) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = read_prompt_texts(prompts_path, tokenizer)
    llm = LLM(model, dtype="float32", seed=0, enforce_eager=True,
              speculative_config=speculative_config(8, "dcut"))
    used, rows = 0, []
    for cell in cells:
        batch, temperature = int(cell.split(":")[0]), float(cell.split(":")[1])
        group = 8 if batch >= 8 else 1
        if not cell.endswith(":again"):  # `:again`: the last cell's prompts once more (a later epoch)
            rows = prompts[used : used + batch // group]
            used += len(rows)
        before = proposer_summary(llm)
        llm.generate([p for p in rows for _ in range(group)], SamplingParams(temperature=temperature, max_tokens=max_tokens),
                     use_tqdm=False)
        after = proposer_summary(llm)
        drafted = {k: after[k] - before[k] for k in ("steps", "drafts", "draft_tokens", "accepted_tokens")}
        print(cell, drafted, llm.collective_rpc(policy_state)[0], flush=True)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cells", nargs="*", default=["1:1", "8:1", "64:1", "1:0", "1:0", "1:0"])
    ap.add_argument("--model", default=str(TINY_TARGET))
    ap.add_argument("--prompts", default=str(TINY_PROMPTS), help="JSON lines with a `prompt` (string or chat messages)")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    main(args.cells, args.model, args.prompts, args.max_tokens)
