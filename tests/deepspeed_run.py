"""A two-rank DeepSpeed GRPO run of the recipe, for tests/test_deepspeed.py:

    accelerate launch --config_file recipes/accelerate/deepspeed_zero3_cpu.yaml \
        tests/deepspeed_run.py OUT_DIR [recipe arguments ...]

Runs `recipes/grpo_qwen3.py`'s own `main` (its defaults pick the CPU and gloo), watching the
trainer it builds: every rollout records whether the weights the engine saw were whole. After
training, every rank checks on the same (gathered) weights that the engine's greedy completions
equal the plain model's, and that the saved checkpoint reloads — as HF weights and as DeepSpeed
state — and writes OUT_DIR/rank{r}.json with what it saw.
"""

import importlib.util
import json
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from transformers.integrations.deepspeed import deepspeed_load_checkpoint

from rollout_graft.assets import read_jsonl

# DeepSpeed's shared-memory CPU collectives are a g++ build of ~30 s on first use and only speed up
# all-reduce; gloo's are the same operations. The test checks the trainer, not that build.
sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # (`deepspeed.comm.torch` is torch itself)

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "grpo_qwen3.py"
GREEDY_PROMPTS = 2  # per rank


def load_recipe():
    spec = importlib.util.spec_from_file_location("grpo_qwen3", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def whole(model) -> bool:
    """Every parameter holds its full tensor (ZeRO-3 keeps an empty shard outside a gather)."""
    return all(p.numel() == getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def sharded(model) -> list[str]:
    """Parameters held as empty shards right now."""
    return [n for n, p in model.named_parameters() if p.numel() == 0]


def partitioned(model) -> list[str]:
    """Parameters ZeRO-3 partitions (it keeps ones under `stage3_param_persistence_threshold` whole)."""
    return [n for n, p in model.named_parameters() if hasattr(p, "ds_id") and not p.ds_persist]


def watch(trainer, seen: list[bool]):
    """Record, at every rollout, whether the module handed to the engine has whole weights."""
    engine_for = trainer._engine_for

    def recording(model):
        seen.append(whole(model))
        return engine_for(model)

    trainer._engine_for = recording
    return trainer


def greedy_matches(trainer, prompts: list[list[int]]) -> list[bool]:
    """The engine's greedy rows (through the trainer's rollout path) == HF greedy on the same weights."""
    trainer.temperature = 0.0
    completions, _ = trainer._generate_single_turn(prompts, None, {}, 1)
    trainer.temperature = trainer.args.temperature
    with trainer._generation_model() as model:
        refs = [plain_greedy(model, p, trainer) for p in prompts]
    return [c == r for c, r in zip(completions, refs)]


def plain_greedy(model, prompt: list[int], trainer) -> list[int]:
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=trainer.max_completion_length,
                         eos_token_id=list(trainer.eos_token_ids), pad_token_id=trainer._tokenizer.pad_token_id)
    return out[0, len(prompt):].tolist()


def reloads(trainer, checkpoint: Path) -> bool:
    """Spoil the live weights, load the checkpoint's DeepSpeed state back (as `resume_from_checkpoint`
    does), and compare the live weights (gathered) with the checkpoint's HF weights file."""
    params = list(trainer.accelerator.unwrap_model(trainer.model).parameters())
    with torch.no_grad(), deepspeed.zero.GatheredParameters(params, modifier_rank=0):
        for p in params:
            p.add_(1.0)  # ZeRO-3: rank 0's change goes to every shard on exit; ZeRO-2: each rank's own copy
    deepspeed_load_checkpoint(trainer.model_wrapped, str(checkpoint))
    saved = load_file(checkpoint / "model.safetensors")  # not from_pretrained: under ZeRO-3 it would shard the weights
    with trainer._generation_model() as model:
        live = model.state_dict()
        return len(saved) > 0 and all(torch.equal(live[name], tensor) for name, tensor in saved.items())


def main(out_dir: str, recipe_args: list[str]) -> None:
    recipe = load_recipe()
    trainers, seen = [], []
    build = recipe.build_trainer

    def build_watched(*args):  # recipe.main builds its trainer through this
        trainers.append(watch(build(*args), seen))
        return trainers[-1]

    recipe.build_trainer = build_watched
    args = recipe.make_parser().parse_args_into_dataclasses(recipe_args)
    recipe.main(*args)
    trainer = trainers[0]
    model = trainer.accelerator.unwrap_model(trainer.model)
    prompts = [trainer._tokenizer(r["prompt"])["input_ids"] for r in read_jsonl(args[0].dataset_path)]
    rank = trainer.accelerator.process_index
    checkpoint = Path(args[1].output_dir) / f"checkpoint-{trainer.state.global_step}"
    result = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "engine": type(trainer.model_wrapped).__name__,
        "zero_stage": trainer.model_wrapped.zero_optimization_stage(),
        "whole_at_rollouts": seen,
        "sharded_outside": sharded(model),
        "partitioned": partitioned(model),
        "greedy_matches": greedy_matches(trainer, prompts[rank * GREEDY_PROMPTS:(rank + 1) * GREEDY_PROMPTS]),
        "reload": reloads(trainer, checkpoint),
        "log_history": trainer.state.log_history,
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
