"""Run recipes/grpo_qwen3.py (its `main`, argv after the first argument) and write what each training
step trained on to the JSON file named first: the step's prompts and completions (TRL's completion
log, in sampler order), reward, loss and the trainer's rollout counter, and the steps evaluated at; with `--backend vllm` also the
proposer's state as the run starts (saved to `<json>.state/`, after any resume)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import TrainerCallback  # noqa: E402

import recipes.grpo_qwen3 as recipe  # noqa: E402


class Record(TrainerCallback):
    def __init__(self, trainer, out: Path):
        self.trainer, self.out, self.steps = trainer, out, {}

    def on_train_begin(self, args, state, control, **kwargs):
        if getattr(self.trainer, "graft_config", None) is not None and self.trainer.graft_config.uses_our_proposer:
            from rollout_graft.vllm import save_proposer_state

            save_proposer_state(self.trainer.vllm_generation.llm, str(self.out) + ".state")

    def on_step_end(self, args, state, control, **kwargs):
        logs = self.trainer._logs
        self.steps[state.global_step] = {"prompts": list(logs["prompt"]), "completions": list(logs["completion"]),
                                         "rollouts": getattr(self.trainer, "_rollouts", None)}


def main(out: Path, argv: list[str]) -> None:
    build, record = recipe.build_trainer, []

    def build_and_record(*args):
        trainer = build(*args)
        record.append(Record(trainer, out))
        trainer.add_callback(record[0])
        return trainer

    recipe.build_trainer = build_and_record
    recipe.main(*recipe.make_parser().parse_args_and_config(args=argv))
    trainer, steps = record[0].trainer, record[0].steps
    for h in trainer.state.log_history:
        if "loss" in h and h["step"] in steps:
            steps[h["step"]].update(reward=h["reward"], loss=h["loss"])
    evals = [h["step"] for h in trainer.state.log_history if any(k.startswith("eval_") for k in h)]
    out.write_text(json.dumps({"steps": steps, "evals": evals}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
