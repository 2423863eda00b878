#!/usr/bin/env python
"""The target's logits as a vLLM chain source, by replay (issue 34; `rollout_graft_tools.logit_chains`).

    python lab/logit_chains.py record --model tiny --temperature 1.0 --max-new-tokens 256 \\
        --out-dir docs/bench/logit_chains --name tiny-t1
    python lab/logit_chains.py run docs/bench/logit_chains/tiny-t1-fresh.safetensors \\
        docs/bench/logit_chains/tiny-t1-revisit.safetensors --json docs/bench/logit_chains.json

`record`: a fresh rollout (seed) and a revisit (seed + 1) of the same prompts, plain path, EOS on,
the target's top-k at every position (`rollout_graft_tools.replay.record`). `--model tiny` is the
embedded tiny target on its prompts; `--model smollm2` SmolLM2-135M-Instruct
(`scripts/prepare_models.py`) on the real prompts. `run`: replays every pair through (a) text,
(b) logits, (c) best of both, (d) vLLM suffix, over the τ sweep and depth caps, in one proposer
instance per variant across fresh then revisit; reports MAT against drafted tokens per step, and
each source's MAT interpolated at (a)'s drafted tokens. The JSON keeps the command, CPU and versions.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from rollout_graft.assets import REAL_PROMPTS, TINY_PROMPTS, TINY_TARGET
from rollout_graft_tools import logit_chains as lc


def model_and_prompts(name: str) -> tuple[str, str]:
    if name == "tiny":
        return str(TINY_TARGET), str(TINY_PROMPTS)
    if name == "smollm2":  # where scripts/prepare_models.py puts it
        cache = Path(os.environ.get("ROLLOUT_GRAFT_CACHE", Path.home() / ".cache" / "rollout_graft"))
        name = str(cache / "models" / "smollm2-135m-instruct")
        if not Path(name).is_dir():
            raise SystemExit(f"{name} is missing: run `python scripts/prepare_models.py` first")
    return name, str(REAL_PROMPTS)


def cmd_record(args) -> None:
    torch.set_num_threads(args.threads)
    model, prompts = model_and_prompts(args.model)
    spec = lc.RecordSpec(model=model, prompts=args.prompts or prompts, num_prompts=args.num_prompts, group=args.group,
                         temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    for path in lc.record_pair(spec, args.out_dir, args.name):
        print(f"{path} ({path.stat().st_size / 1e6:.2f} MB)", flush=True)


def cmd_run(args) -> None:
    torch.set_num_threads(args.threads)
    out = lc.study(args.pairs, k=args.k, taus=args.taus, depths=args.depths, suffix_probs=args.suffix_probs,
                   command=" ".join(["python", *sys.argv]))
    print(lc.table(out))
    if args.json:
        lc.write_json(out, args.json)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(required=True)
    r = sub.add_parser("record", help="a fresh rollout and a revisit, with the target's top-k per position")
    r.add_argument("--model", default="tiny", help="tiny, or a Hugging Face model folder (e.g. SmolLM2's)")
    r.add_argument("--prompts", help="JSON lines with a `prompt` per row (default: the model's prompt set)")
    r.add_argument("--num-prompts", type=int, default=8)
    r.add_argument("--group", type=int, default=8)
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--max-new-tokens", type=int, default=256)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out-dir", type=Path, required=True)
    r.add_argument("--name", required=True, help="recordings are <name>-fresh / <name>-revisit .safetensors")
    r.set_defaults(func=cmd_record)
    u = sub.add_parser("run", help="replay (a)–(d) on recording pairs")
    u.add_argument("pairs", nargs="+", type=Path, help="<name>-fresh.safetensors files (the revisit is found beside)")
    u.add_argument("--k", type=int, default=8, help="longest chain (num_speculative_tokens)")
    u.add_argument("--taus", type=float, nargs="+", default=list(lc.TAUS))
    u.add_argument("--depths", type=int, nargs="*", default=list(lc.DEPTHS), help="depth caps at τ = 0")
    u.add_argument("--suffix-probs", type=float, nargs="*", default=list(lc.SUFFIX_PROBS),
                   help="(d) suffix decoding's min_token_prob (none: skip (d); needs arctic-inference)")
    u.add_argument("--threads", type=int, default=1)
    u.add_argument("--json", type=Path)
    u.set_defaults(func=cmd_run)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
