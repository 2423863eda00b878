"""Two-rank GRPO run for tests/test_multiprocess.py:

    torchrun --standalone --nproc_per_node 2 tests/trl_multiprocess_run.py OUT_DIR

per_device_train_batch_size=3 with num_generations=2 gives 3 groups over 6 rows, so the middle
group is split across the two ranks. Every rank writes OUT_DIR/rank{r}.json with what it saw.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch
import torch.distributed as dist
from trl import GRPOConfig
from trl_helpers import char_tokenizer, length_reward, prompt_dataset, tiny_policy

from trainers import GraftConfig, GraftGRPOTrainer

MAX_NEW = 12


class RecordingTrainer(GraftGRPOTrainer):
    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        self.rollouts = getattr(self, "rollouts", []) + [(prompt_ids, completion_ids)]
        return completion_ids, logprobs


def greedy_check(trainer, prompt_ids) -> bool:
    """This rank's rows, greedy through the trainer's rollout path == HF greedy row by row."""
    trainer.temperature = 0.0
    completions, _ = trainer._generate_single_turn(prompt_ids, None, {}, trainer.num_generations)
    trainer.temperature = trainer.args.temperature
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    ok = True
    for p, c in zip(prompt_ids, completions):
        ref = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=1, pad_token_id=0)
        ok &= c == ref[0, len(p):].tolist()
    model.train()
    return ok


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    tok = char_tokenizer()
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=3, num_generations=2, max_completion_length=MAX_NEW,
        max_steps=2, logging_steps=1, learning_rate=1e-3, report_to="none", save_strategy="no", use_cpu=True,
        bf16=False, disable_tqdm=True, seed=0,
    )
    trainer = RecordingTrainer(tiny_policy(len(tok)), length_reward, args=args, graft_config=GraftConfig(),
                               train_dataset=prompt_dataset(8), processing_class=tok)
    trainer.train()
    rank = trainer.accelerator.process_index
    first_prompts = trainer.rollouts[0][0]
    result = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "prompts": [[tok.decode(p) for p in prompts] for prompts, _ in trainer.rollouts],
        "completion_lengths": [[len(c) for c in comps] for _, comps in trainer.rollouts],
        "greedy_matches": greedy_check(trainer, first_prompts),
        "log_history": trainer.state.log_history,
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    trainer.accelerator.wait_for_everyone()  # the ranks leave together, their process group torn down first
    trainer.accelerator.end_training()  # (left to interpreter exit, gloo's teardown once aborted a rank: std::terminate)


if __name__ == "__main__":
    main(sys.argv[1])
