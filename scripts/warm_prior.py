#!/usr/bin/env python
"""Warm and save a global adjacency prior for a model (used via RetrievalConfig(prior_path=...)).

    python scripts/warm_prior.py --model rollout_graft/assets/tiny-math/target --out prior.safetensors
"""

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_graft import SamplingParams
from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET
from rollout_graft.warmup import warm_prior


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(TINY_TARGET))
    ap.add_argument("--prompts", default=str(TINY_PROMPTS), help="JSONL with a 'prompt' field (train split used)")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    rows = [json.loads(line) for line in open(args.prompts) if line.strip()]
    rows = [r for r in rows if r.get("split", "train") == "train"][: args.num_prompts]
    prompts = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    path = warm_prior(model, prompts, args.out, rounds=args.rounds, group=args.group_size, params=params, tokenizer=tok)
    print(f"saved prior to {path}")


if __name__ == "__main__":
    main()
