#!/usr/bin/env python
"""Warm and save a global adjacency prior for a model (used via RetrievalConfig(prior_path=...)).

    python scripts/warm_prior.py --model rollout_graft/assets/tiny-math/target --out prior.safetensors
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_graft import SamplingParams
from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET, read_prompt_texts
from rollout_graft.files import local_dir
from rollout_graft.warmup import warm_prior
from rollout_graft_tools.cli import positive


def train_prompts(path: str, limit: int, tokenizer) -> list[list[int]]:
    """Token ids of the first `limit` train rows' prompts (rows without `split` count as train)."""
    texts = read_prompt_texts(path, tokenizer, split="train")[:limit]
    if not texts:
        raise ValueError(f"--prompts {path} has no train rows (a row's `split` absent or \"train\")")
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(TINY_TARGET), help="a local model folder")
    ap.add_argument("--prompts", default=str(TINY_PROMPTS), help="JSONL with a 'prompt' field (train split used)")
    ap.add_argument("--num-prompts", type=positive, default=8)
    ap.add_argument("--rounds", type=positive, default=5)
    ap.add_argument("--group-size", type=positive, default=8)
    ap.add_argument("--max-new-tokens", type=positive, default=256)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--threads", type=positive, default=2)
    ap.add_argument("--out", required=True, help="the prior's .safetensors file")
    args = ap.parse_args(argv)
    if Path(args.out).is_dir():
        ap.error(f"--out {args.out} is a folder: name the file, e.g. {Path(args.out) / 'prior.safetensors'}")
    try:
        model_dir = local_dir(args.model, "--model")
        torch.set_num_threads(args.threads)
        tok = AutoTokenizer.from_pretrained(model_dir)
        prompts = train_prompts(args.prompts, args.num_prompts, tok)
        params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    except (ValueError, FileNotFoundError) as exc:
        sys.exit(f"warm_prior.py: {exc}")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    path = warm_prior(model, prompts, args.out, rounds=args.rounds, group=args.group_size, params=params, tokenizer=tok)
    print(f"saved prior to {path}")


if __name__ == "__main__":
    main()
