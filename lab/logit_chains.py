#!/usr/bin/env python
"""The target's logits as a vLLM chain source, by replay (issue 34; `rollout_graft_tools.logit_chains`).

    python lab/logit_chains.py record --model tiny --temperature 1.0 --out-dir docs/bench/logit_chains --name tiny-t1
    python lab/logit_chains.py record --model smollm2 --temperature 1.0 --max-new-tokens 256 \\
        --out-dir docs/bench/logit_chains --name smollm2-t1
    python lab/logit_chains.py run docs/bench/logit_chains/*-fresh.safetensors --json docs/bench/logit_chains.json

`record`: three plain rollouts (EOS on) with the target's top-k at every position
(`rollout_graft_tools.replay.record`): `cold` (other prompts), `fresh` (the prompts, new to the
proposer) and `revisit` (the same prompts again, another seed, as a later GRPO epoch would).
`--model tiny` is the embedded tiny target on its prompts; `--model smollm2` SmolLM2-135M-Instruct
(`scripts/prepare_models.py`) on the real (chat) prompts. `run`: replays each set in that order
through one proposer per variant — (a) text, (b) logits, (c) best of both, (d) vLLM suffix, over the
τ sweep and the depth caps — and reports MAT against drafted tokens per step, and each source's MAT
interpolated at equal drafted tokens; `--decide-on` applies issue 34's rule (≥ 15 % over (a) on
fresh prompts). The JSON keeps the command, CPU model and flags, and versions.
"""

from __future__ import annotations

import argparse
import json
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
    for path in lc.record_set(spec, args.out_dir, args.name, args.rollouts):
        print(f"{path} ({path.stat().st_size / 1e6:.2f} MB)", flush=True)


def cmd_run(args) -> None:
    torch.set_num_threads(args.threads)
    model = None
    if args.offpath_model:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_and_prompts(args.offpath_model)[0], dtype=torch.float32).eval()
    out = lc.study(args.pairs, k=args.k, taus=args.taus, depths=args.depths, suffix_probs=args.suffix_probs,
                   sources=args.sources, model=model, offpath_from=args.offpath_from, rollouts=args.rollouts,
                   command=" ".join(["python", *sys.argv]))
    if args.merge and args.json and args.json.exists():
        out = lc.merge(json.loads(args.json.read_text()), out)
    finish(out, args.decide_on, args.json)


def finish(out: dict, decide_on: str, path: Path | None) -> None:
    """Decision, headline, tables printed; the JSON written."""
    if decide_on in out["pairs"]:
        out["decision"] = [lc.decide(out, decide_on, r) for r in ("cold", "fresh") if r in out["pairs"][decide_on]["compare"]]
    out["headline"] = lc.headline(out)
    print(lc.table(out))
    print("\n" + lc.headline_table(out))
    if path:
        lc.write_json(out, path)


def cmd_report(args) -> None:
    out = json.loads(args.json.read_text())
    for pair in out["pairs"].values():
        pair["compare"] = lc.compare_pair(pair)
    finish(out, args.decide_on, args.json if args.write else None)


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
    r.add_argument("--name", required=True, help="recordings are <name>-<rollout>.safetensors")
    r.add_argument("--rollouts", nargs="+", default=list(lc.ROLLOUTS), choices=lc.ROLLOUTS,
                   help="cold: other prompts first (the priors start empty); fresh: the prompts, priors warm; "
                        "revisit: the prompts again")
    r.set_defaults(func=cmd_record)
    u = sub.add_parser("run", help="replay (a)–(d) on recording pairs")
    u.add_argument("pairs", nargs="+", type=Path,
                   help="<name>-fresh.safetensors files (<name>-cold and <name>-revisit are read from beside them)")
    u.add_argument("--k", type=int, default=8, help="longest chain (num_speculative_tokens)")
    u.add_argument("--taus", type=float, nargs="+", default=list(lc.TAUS))
    u.add_argument("--depths", type=int, nargs="*", default=list(lc.DEPTHS), help="depth caps at τ = 0")
    u.add_argument("--suffix-probs", type=float, nargs="*", default=list(lc.SUFFIX_PROBS),
                   help="(d) suffix decoding's min_token_prob (none: skip (d); needs arctic-inference)")
    u.add_argument("--sources", nargs="+", default=[s for s in lc.SOURCES if s != "logits+offpath"], choices=list(lc.SOURCES))
    u.add_argument("--offpath-model", help="the recorded target (tiny or a folder), for the logits+offpath source")
    u.add_argument("--offpath-from", type=int, default=0,
                   help="run it from this rollout on (earlier ones learn on-path only: e.g. 1 = not in `cold`)")
    u.add_argument("--rollouts", nargs="+", default=list(lc.ROLLOUTS), choices=lc.ROLLOUTS, help="replay these only, in order")
    u.add_argument("--decide-on", default="smollm2-t1", help="the pair whose fresh prompts decide (issue 34's rule)")
    u.add_argument("--threads", type=int, default=1)
    u.add_argument("--json", type=Path)
    u.add_argument("--merge", action="store_true", help="add to the --json file's pairs and variants instead of replacing it")
    u.set_defaults(func=cmd_run)
    t = sub.add_parser("report", help="comparisons, decision and tables again from a study JSON")
    t.add_argument("json", type=Path)
    t.add_argument("--decide-on", default="smollm2-t1")
    t.add_argument("--write", action="store_true", help="write them back into the JSON")
    t.set_defaults(func=cmd_report)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
