"""TRL's multi-turn tool calling (`tools=`, `environment_factory`) through GraftGRPOTrainer on one
backend, with `trl_helpers.tool_policy` (a model that always calls the tool once, then stops).
Writes OUT_DIR/report.json for tests/test_trl_tools.py.

    python tests/trl_tools_run.py OUT_DIR engine|vllm
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402
from trl_helpers import ENV_CALL, TOOL_CALL, tool_policy  # noqa: E402

from trainers import GraftConfig, GraftGRPOTrainer  # noqa: E402

CALLS: list = []


def multiply_tool(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    CALLS.append(("multiply_tool", a, b))
    return a * b


class CounterEnvironment:
    def reset(self, **kwargs):
        self.counter = 0

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        CALLS.append(("increment", step, self.counter))
        return self.counter


def length_reward(completions, **kwargs):
    return [float(len(str(c))) for c in completions]


class RecordingTrainer(GraftGRPOTrainer):
    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        self.turns = getattr(self, "turns", []) + [[self.processing_class.decode(p + c) for p, c in
                                                     zip(prompt_ids, completion_ids)]]
        return completion_ids, logprobs


def run(out: Path, backend: str, kind: str) -> dict:
    CALLS.clear()
    model, tok = tool_policy(TOOL_CALL if kind == "tools" else ENV_CALL)
    if backend == "vllm":  # vLLM loads the policy from a directory
        model.save_pretrained(out / f"policy-{kind}")
        tok.save_pretrained(out / f"policy-{kind}")
        model = str(out / f"policy-{kind}")
    args = GRPOConfig(output_dir=str(out / kind), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=48, max_steps=1, logging_steps=1, report_to="none", save_strategy="no",
                      use_cpu=True, bf16=False, seed=0, max_tool_calling_iterations=1, disable_tqdm=True,
                      vllm_gpu_memory_utilization=0.3, vllm_max_model_length=1024)
    extra = dict(tools=[multiply_tool]) if kind == "tools" else dict(environment_factory=CounterEnvironment)
    prompts = [[{"role": "user", "content": "What is 3 times 4?"}]] * 8
    graft = GraftConfig(backend=backend, method="retrieval" if backend == "engine" else "ar")
    trainer = RecordingTrainer(model, length_reward, args=args, graft_config=graft, processing_class=tok,
                               train_dataset=Dataset.from_dict({"prompt": prompts}), **extra)
    trainer.train()
    step = next(h for h in trainer.state.log_history if "loss" in h)
    return {"calls": CALLS[:], "turns": trainer.turns, "call_frequency": step.get("tools/call_frequency"),
            "failure_frequency": step.get("tools/failure_frequency")}


def main(out: Path, backend: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = {kind: run(out, backend, kind) for kind in ("tools", "environment")}
    (out / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
