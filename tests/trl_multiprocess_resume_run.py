"""Two-rank GRPO run, saved and resumed between two samplings of a generation batch, for
tests/test_multiprocess.py:

    torchrun --standalone --nproc_per_node 2 tests/trl_multiprocess_resume_run.py OUT_DIR [CHECKPOINT]

steps_per_generation=2 samples a batch at steps 1 and 3; the checkpoint after step 3 holds the second
batch's slices, one file per rank. Every rank writes OUT_DIR/rank{r}.json: its rollouts and its log.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch
from trl import GRPOConfig
from trl_helpers import char_tokenizer, length_reward, prompt_dataset, tiny_policy

from trainers import GraftConfig, GraftGRPOTrainer


def main(out_dir: str, resume: str | None) -> None:
    torch.set_num_threads(1)
    tok = char_tokenizer()
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=3, num_generations=2, max_completion_length=12,
        max_steps=4, steps_per_generation=2, logging_steps=1, learning_rate=1e-3, report_to="none",
        save_strategy="steps", save_steps=3, use_cpu=True, bf16=False, disable_tqdm=True, seed=0,
    )
    trainer = GraftGRPOTrainer(tiny_policy(len(tok)), length_reward, args=args, graft_config=GraftConfig(),
                               train_dataset=prompt_dataset(8), processing_class=tok)
    trainer.train(resume_from_checkpoint=resume)
    log = [{k: h[k] for k in ("step", "loss", "grad_norm") if k in h} for h in trainer.state.log_history if "loss" in h]
    rank = trainer.accelerator.process_index
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"rollouts": trainer._rollouts, "log": log}))
    trainer.accelerator.wait_for_everyone()  # the ranks leave together, their process group torn down first: one
    trainer.accelerator.end_training()  # rank exiting while the other still saved once aborted in gloo's teardown


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
