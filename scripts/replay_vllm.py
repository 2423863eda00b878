#!/usr/bin/env python
"""Chain proposers by replay, without the target: tokens per step (MAT) against draft tokens per step.

    python scripts/replay_vllm.py record --batch 64 --rollouts 4 --temperature 1.0 --max-tokens 128 --out rec.json
    python scripts/replay_vllm.py run rec.json --json replay.json

`record`: plain vLLM (no speculation) generates `rollouts` GRPO rollouts of `batch` rows (batch/G
prompts × G samples, EOS on), each on prompts no earlier rollout used, and keeps every row's prompt
and completion token ids.

`run`: replays the rollouts in order through each proposer (one instance per variant, kept across
rollouts as in one vLLM engine), as vLLM's persistent batch calls it
(`profile_vllm_proposer.replay_rows`): a draft is accepted up to its first token that differs from
the recorded completion, plus one token. Drafts without draft probabilities are accepted by vLLM's
rejection sampler exactly when the emitted token equals the draft token, and the emitted text is
distributed as plain sampling, so replaying plain samples gives the acceptance of a real
speculative run in distribution (at any temperature), with no timing noise. Variants:

    ours@K/τ       our proposer (its default sources), chains of at most K tokens cut where the
                   raw score (the score D-cut calibrates and ranks by) falls below τ
    suffix@K/p     vLLM's suffix decoding (arctic-inference; vLLM's own proposer class), min_token_prob p

Reports per variant: MAT (emitted tokens per request-step), draft tokens and accepted tokens per
request-step; and, for each `suffix` variant, each of our curves (`ours` and every `--ours NAME`,
over the τ sweep) interpolated at its draft tokens per step (the criterion "higher MAT than
suffix at equal drafted tokens").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from profile_vllm_proposer import replay_rows, vllm_config  # noqa: E402

from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET, read_prompt_texts  # noqa: E402
from rollout_graft.budget import BudgetDecision, BudgetPolicy  # noqa: E402


class ScoreThreshold(BudgetPolicy):
    """Chains cut where their raw score falls below `tau` (no cost model: replay has no clock)."""

    def __init__(self, depth: int, tau: float):
        self.depth, self.tau = depth, tau

    def plan(self, rows: int) -> int:
        return self.depth

    def cut(self, draft):
        return draft.cut((draft.scores >= self.tau).sum(1)), BudgetDecision(1.0)

    def observe(self, step) -> None:
        pass


def ours(k: int, tau: float, vocab: int, max_len: int, options: dict | None = None):
    from rollout_graft.vllm.config import ChainConfig
    from rollout_graft.vllm.proposer import RLDraftProposer

    cls = type("Replayed", (RLDraftProposer,), {"config": ChainConfig(budget_policy="fixed", **(options or {}))})
    prop = cls(vllm_config(k, max_len, vocab))
    prop.policy = ScoreThreshold(k, tau)
    return prop


class SuffixReplay:
    """vLLM's `SuffixDecodingProposer` behind the `custom_class` call: told each row's request by
    the replay (`set_requests`), as vLLM's input batch tells it."""

    def __init__(self, k: int, min_token_prob: float, max_len: int, max_spec_factor: float = 1.0):
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        spec = SimpleNamespace(num_speculative_tokens=k, suffix_decoding_max_tree_depth=24,
                               suffix_decoding_max_cached_requests=10000,
                               suffix_decoding_max_spec_factor=max_spec_factor,
                               suffix_decoding_min_token_prob=min_token_prob)
        self.inner = SuffixDecodingProposer(SimpleNamespace(speculative_config=spec,
                                                            model_config=SimpleNamespace(max_model_len=max_len)))
        self.k, self.max_model_len, self.rollout = k, max_len, 0
        self.ids: list[str] = []
        self.prompt_lens: list[int] = []

    def set_requests(self, requests: list[int], prompt_lengths: list[int]) -> None:
        self.ids = [f"{self.rollout}-{r}" for r in requests]
        self.prompt_lens = prompt_lengths

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        rows = len(self.ids)
        batch = SimpleNamespace(req_ids=self.ids, req_id_to_index={r: i for i, r in enumerate(self.ids)},
                                num_tokens_no_spec=num_tokens_no_spec, token_ids_cpu=token_ids_cpu,
                                num_prompt_tokens=np.array(self.prompt_lens + [0] * (len(num_tokens_no_spec) - rows)))
        out = self.inner.propose(self.k, batch, sampled_token_ids[:rows])
        return [list(d) for d in out] + [[] for _ in range(len(sampled_token_ids) - rows)]


def record(args) -> None:
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


def replay(prop, rollouts: list[dict]) -> dict:
    counts = {"steps": 0, "emitted": 0, "drafted": 0, "accepted": 0}
    for n, r in enumerate(rollouts):
        prop.rollout = n
        replay_rows(prop, r["prompts"], r["completions"], record=False, counts=counts)
    steps = max(counts["steps"], 1)
    return {**counts, "mat": counts["emitted"] / steps, "drafted_per_step": counts["drafted"] / steps,
            "accepted_per_step": counts["accepted"] / steps}


def at_drafted(curve: list[dict], drafted: float) -> float | None:
    """MAT on a curve of (drafted_per_step, mat) points, linearly interpolated at `drafted`."""
    pts = sorted((c["drafted_per_step"], c["mat"]) for c in curve)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    if not xs or drafted < xs[0] or drafted > xs[-1]:
        return None
    return float(np.interp(drafted, xs, ys))


def run(args) -> dict:
    rec = json.loads(args.recording.read_text())
    rollouts = rec["rollouts"]
    max_len = max(len(p) + len(c) for r in rollouts for p, c in zip(r["prompts"], r["completions"])) + 2 * args.k + 2
    results: dict[str, dict] = {}
    names = [("ours", {})] + [(o.split("=", 1)[0], json.loads(o.split("=", 1)[1])) for o in args.ours]
    for name, options in names:
        for tau in args.taus:
            results[f"{name}@{args.k}/{tau:g}"] = replay(ours(args.k, tau, rec["vocab"], max_len, options), rollouts)
    for p in args.min_token_probs:
        results[f"suffix@{args.k}/{p:g}"] = replay(SuffixReplay(args.k, p, max_len), rollouts)
    curves = {name: [v for k, v in results.items() if k.startswith(f"{name}@")] for name, _ in names}
    compare = {k: {"drafted_per_step": v["drafted_per_step"], "suffix_mat": v["mat"],
                   **{f"{name}_mat_at_equal_drafted": at_drafted(curve, v["drafted_per_step"])
                      for name, curve in curves.items()}}
               for k, v in results.items() if k.startswith("suffix")}
    out = {"recording": str(args.recording), "recorded_with": rec["args"], "k": args.k, "variants": results,
           "suffix_vs_ours": compare}
    print(f"{'variant':<18} {'MAT':>6} {'drafted/step':>13} {'accepted/step':>14}")
    for k, v in results.items():
        print(f"{k:<18} {v['mat']:6.3f} {v['drafted_per_step']:13.2f} {v['accepted_per_step']:14.2f}")
    for k, v in compare.items():
        for name in curves:
            o = v[f"{name}_mat_at_equal_drafted"]
            print(f"{k}: suffix MAT {v['suffix_mat']:.3f} at {v['drafted_per_step']:.2f} drafted/step; "
                  f"{name} at the same: {'outside its curve' if o is None else f'{o:.3f}'}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


def main(argv=None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(required=True)
    r = sub.add_parser("record", help="plain vLLM rollouts, kept as token ids")
    r.add_argument("--model", default=str(TINY_TARGET))
    r.add_argument("--prompts", type=Path, default=TINY_PROMPTS, help="JSON lines with a `prompt` string per row")
    r.add_argument("--batch", type=int, default=64)
    r.add_argument("--group", type=int, default=8)
    r.add_argument("--skip-prompts", type=int, default=0, help="start at this prompt (a recording on prompts another did not use)")
    r.add_argument("--rollouts", type=int, default=4)
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--dtype", default="float32")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", type=Path, required=True)
    r.set_defaults(func=record)
    u = sub.add_parser("run", help="replay proposers on a recording")
    u.add_argument("recording", type=Path)
    u.add_argument("--k", type=int, default=8, help="longest chain (num_speculative_tokens)")
    u.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    u.add_argument("--min-token-probs", type=float, nargs="*", default=[0.1, 0.3, 0.5],
                   help="suffix decoding's thresholds (none: ours only; suffix needs arctic-inference)")
    u.add_argument("--ours", nargs="*", default=[], metavar="NAME=JSON",
                   help="more variants of ours: a name and ChainConfig options, e.g. noprior='{\"use_prior\": false}'")
    u.add_argument("--json", type=Path)
    u.set_defaults(func=run)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    main()
