"""Resume that repeats the uninterrupted run: the training prompts' order by epoch, and checkpoints a
kill cannot half-write as far as resuming goes.

`ResumableGRPOTrainer` is TRL's `GRPOTrainer` with three changes, none of which alters an
uninterrupted run:

- the training sampler is `EpochRepeatSampler`: TRL's `RepeatSampler` seeds its generator once, in
  its constructor, and draws the next permutation at every `__iter__` (it has no `set_epoch`), so
  epoch e's prompt order is the (e+1)-th permutation of one stream. A resumed run builds a fresh
  sampler whose first iteration — epoch e of the run — yields epoch 0's order, and every resumed
  epoch then trains on another epoch's batches. transformers' `Trainer` does tell samplers the epoch
  (`set_epoch`, before it iterates the loader; accelerate forwards it, except to a sampler under
  `BatchSamplerShard` inside `skip_first_batches`, so we also deliver it from `on_epoch_begin`);
  `EpochRepeatSampler` positions its stream at epoch e's permutation, so an uninterrupted run draws
  exactly TRL's orders and a resumed one the same;
- every checkpoint gets a manifest (`graft_checkpoint.json`: its files and their sizes) written
  after all its files, on every rank; a checkpoint without a valid manifest is never resumed: the
  run says so and resumes from the last complete one. transformers writes a checkpoint's files one
  by one into its final directory, so a kill inside a save leaves a directory HF then fails to load;
- `resume_from_checkpoint=True` (or the string "true", as `--resume_from_checkpoint true` arrives
  from a command line) resumes from the latest complete checkpoint in `output_dir`, as HF's True does.

TRL's step counter (`_step`, which decides when a new generation batch is sampled) restarts at 0 on
resume; it is set from the checkpoint's global step instead. TRL samples a generation batch every
steps_per_generation × num_iterations steps and trains on its slices in between: a checkpoint saved
between two samplings also keeps each rank's batch (`BATCH_FILE`), and the resumed run trains on
it rather than sampling it anew.
"""

from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path

import torch
from accelerate.utils import send_to_device
from transformers import TrainerCallback
from transformers.trainer_pt_utils import safe_globals
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from rollout_graft.files import atomic_path, atomic_write_json, is_int, read_json

logger = logging.getLogger(__name__)

MANIFEST_FILE = "graft_checkpoint.json"
"""Written last into every checkpoint: {"files": {relative path: size in bytes}}."""

BATCH_FILE = "graft_generation_batch_{rank}.pt"
"""In a checkpoint saved between two samplings: rank `rank`'s generation batch (TRL's `_buffered_inputs`)."""

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
            "adapter_model.safetensors", "adapter_model.bin")


class EpochRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` whose order is a function of the epoch (`set_epoch`): epoch e yields the
    (e+1)-th permutation of the seed's stream, as an uninterrupted TRL run does, whichever epoch the
    sampler starts at. Without `set_epoch` it serves epochs 0, 1, 2, … in turn."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epoch = 0  # the epoch the next iteration serves
        self._drawn = 0  # permutations drawn from the generator so far
        self._seed = self.generator.initial_seed() if self.shuffle else None  # TRL's seed, or torch's when None

    @classmethod
    def like(cls, sampler: RepeatSampler) -> EpochRepeatSampler:
        return cls(sampler.data_source, mini_repeat_count=sampler.mini_repeat_count, batch_size=sampler.batch_size,
                   repeat_count=sampler.repeat_count, shuffle=sampler.shuffle, seed=sampler.seed)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            if self._drawn > self.epoch:  # an earlier epoch: replay the stream from its seed
                self.generator.manual_seed(self._seed)
                self._drawn = 0
            for _ in range(self.epoch - self._drawn):
                torch.randperm(self.num_samples, generator=self.generator)
            self._drawn = self.epoch + 1  # RepeatSampler draws this epoch's permutation next
        self.epoch += 1
        yield from super().__iter__()


class _SamplerEpoch(TrainerCallback):
    """Tells the training sampler the epoch at each epoch's start (see the module docstring)."""

    def __init__(self, trainer: ResumableGRPOTrainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        sampler = self.trainer._epoch_sampler
        if sampler is not None:
            # state.epoch is the epoch reached so far: exactly e at epoch e's start, e + k/n when resumed k
            # batches into it (the epoch transformers resumes in is global_step // steps per epoch, the same)
            sampler.set_epoch(math.floor(state.epoch or 0))


class ResumableGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose resumed runs train on the uninterrupted run's batches and never resume
    from a half-written checkpoint (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        self._epoch_sampler: EpochRepeatSampler | None = None  # built with the training dataloader
        super().__init__(*args, **kwargs)
        self.add_callback(_SamplerEpoch(self))

    def _get_train_sampler(self, dataset=None):
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is RepeatSampler:
            sampler = self._epoch_sampler = EpochRepeatSampler.like(sampler)
        return sampler

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        checkpoint = self._checkpoint_to_resume(resume_from_checkpoint)
        if checkpoint is not None:
            self._restore_state(checkpoint)
        return super().train(checkpoint, *args, **kwargs)

    def _checkpoint_to_resume(self, resume: str | bool | None) -> str | None:
        """The complete checkpoint `resume` names (True / "true": the latest in output_dir); an incomplete
        one is skipped with a warning for the last complete one before it; ValueError when there is none."""
        if isinstance(resume, str) and resume.strip().lower() in ("true", "false") and not os.path.exists(resume):
            resume = resume.strip().lower() == "true"
        if resume is None or resume is False:
            return None
        if resume is True:
            return latest_complete_checkpoint(self.args.output_dir)
        if not os.path.isdir(resume):
            raise ValueError(f"resume_from_checkpoint={str(resume)!r} is not a directory: pass a checkpoint directory "
                             f"(e.g. {self.args.output_dir}/checkpoint-N), or true for the latest one in output_dir")
        return latest_complete_checkpoint(os.path.dirname(os.path.abspath(resume)) or ".", upto=resume)

    def _restore_state(self, checkpoint: str) -> None:
        """Before TRL's resume: this rank's RNG state checked, TRL's step counter from the checkpoint's
        global step, and the generation batch where it was saved between two samplings (subclasses add theirs)."""
        rng = "rng_state.pth" if self.args.world_size <= 1 else f"rng_state_{self.args.process_index}.pth"
        check_rng_state(os.path.join(checkpoint, rng))
        path = os.path.join(checkpoint, "trainer_state.json")
        state = read_json(path, "the trainer state")
        step = state.get("global_step", 0) if isinstance(state, dict) else 0
        if not is_int(step) or step < 0:
            raise ValueError(f"the trainer state {path} has global_step={step!r}, not a step count: resume from "
                             "another checkpoint")
        self._step = step * self.args.gradient_accumulation_steps
        if self._between_samplings():
            self._buffered_inputs = self._read_batch(checkpoint)
            if self._buffered_inputs is None:
                logger.warning("%s was saved inside a generation batch (steps_per_generation=%d, num_iterations=%d) "
                               "without it (by an older version, or on another number of processes): the resumed run "
                               "samples that batch anew, so it will not repeat the uninterrupted run", checkpoint,
                               self.args.steps_per_generation, self.num_iterations)

    def _between_samplings(self) -> bool:
        """TRL's next step trains on a slice of the generation batch it holds, not on a new one."""
        return self._step % (self.args.steps_per_generation * self.num_iterations) != 0

    def _save_rng_state(self, output_dir: str) -> None:
        """Next to each rank's RNG state: its generation batch, where the checkpoint falls between two samplings."""
        super()._save_rng_state(output_dir)
        if self._buffered_inputs is not None and self._between_samplings():
            with atomic_path(os.path.join(output_dir, BATCH_FILE.format(rank=self.accelerator.process_index))) as tmp:
                torch.save(self._buffered_inputs, tmp)

    def _read_batch(self, checkpoint: str) -> list | None:
        """This rank's generation batch saved in `checkpoint` (on this rank's device), or None where the
        checkpoint holds none for this number of processes (every rank then samples anew alike);
        ValueError naming the file and the fix where it is corrupt or sliced for other settings."""
        saved = len(list(Path(checkpoint).glob(BATCH_FILE.format(rank="*"))))
        path = os.path.join(checkpoint, BATCH_FILE.format(rank=self.accelerator.process_index))
        if saved != self.accelerator.num_processes or not os.path.isfile(path):
            return None
        batch = _load(path, "the generation batch", "resume from an earlier checkpoint, or delete the checkpoint's "
                      "generation batch files (the batch is then sampled anew)")
        if not isinstance(batch, list) or len(batch) != self.args.steps_per_generation or not all(
                isinstance(b, dict) for b in batch):
            raise ValueError(f"the generation batch {path} does not hold steps_per_generation="
                             f"{self.args.steps_per_generation} slices: resume with the settings it was saved with, or "
                             "delete the checkpoint's generation batch files (the batch is then sampled anew)")
        return send_to_device(batch, self.accelerator.device)

    def _save_checkpoint(self, model, trial) -> None:
        super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()  # every rank's files (RNG states, shards) are in place
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
            if folder.is_dir():  # (not rotated away by save_total_limit)
                write_manifest(folder)


def check_rng_state(path: str) -> None:
    """ValueError naming `path` where transformers could not restore an RNG state from it: the
    manifest vouches for sizes, not contents, and torch's own error would advise an unsafe load.
    A missing file is transformers' case (it resumes without, saying so)."""
    if not os.path.isfile(path):
        return
    state = _load(path, "the RNG state", "resume from an earlier checkpoint")
    if not isinstance(state, dict) or not {"python", "numpy", "cpu"} <= set(state):
        raise ValueError(f"the RNG state {path} holds no python / numpy / cpu generator states: resume from an "
                         "earlier checkpoint")


def _load(path: str, what: str, fix: str):
    """A checkpoint's torch file, loaded safely on the CPU (a rank's CPU device reads "cpu:0"; transformers'
    allowed globals); ValueError naming it and `fix` where it is truncated, not a torch file, or garbage
    of the size the manifest recorded (torch's own message would advise an unsafe load)."""
    try:
        with safe_globals():
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{what} {path} is corrupt ({type(exc).__name__}): {fix}") from None


# ---------------------------------------------------------------------------- checkpoint completeness
def write_manifest(folder: str | Path) -> None:
    """Mark `folder` complete: list its files and sizes in `graft_checkpoint.json` (written atomically, last)."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != MANIFEST_FILE and not p.name.startswith(".")}
    atomic_write_json(folder / MANIFEST_FILE, {"files": files}, indent=1)


def checkpoint_problem(folder: str | Path) -> str | None:
    """Why `folder` is not a complete checkpoint (None: it is). With a manifest: every file it lists
    is there at its size. Without one (a checkpoint of plain transformers/TRL): its trainer state reads
    and it holds model weights (a DeepSpeed checkpoint: its `latest` tag)."""
    folder = Path(folder)
    manifest = folder / MANIFEST_FILE
    if not manifest.is_file():
        try:
            read_json(folder / "trainer_state.json", "the trainer state")
        except ValueError as exc:
            return f"it has no {MANIFEST_FILE} (its save did not finish) and {exc}"
        if not any((folder / name).is_file() for name in _WEIGHTS) and not (folder / "latest").is_file():
            return f"it has no {MANIFEST_FILE} (its save did not finish) and no model weights"
        return None
    try:
        files = read_json(manifest, "the checkpoint manifest")["files"]
        wrong = [name for name, size in files.items()
                 if not (folder / name).is_file() or (folder / name).stat().st_size != size]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return f"its {MANIFEST_FILE} is corrupt ({exc})"
    if wrong:
        return f"{len(wrong)} of the {len(files)} files its {MANIFEST_FILE} lists are missing or truncated ({wrong[:3]})"
    return None


def latest_complete_checkpoint(output_dir: str | Path, upto: str | Path | None = None) -> str:
    """The newest complete `checkpoint-N` in `output_dir` (with `upto`: that one, or the newest complete
    one before it), warning about each incomplete one passed over; ValueError when there is none."""
    output_dir = Path(output_dir)
    limit = None
    if upto is not None:
        match = _CHECKPOINT.match(Path(upto).name)
        if match is None:  # not a checkpoint-N directory: resume from it as it is, if it is complete
            problem = checkpoint_problem(upto)
            if problem:
                raise ValueError(f"cannot resume from {upto}: {problem}; resume from a complete checkpoint")
            return str(upto)
        limit = int(match.group(1))
    steps = sorted((int(m.group(1)), p) for p in (output_dir.iterdir() if output_dir.is_dir() else [])
                   if (m := _CHECKPOINT.match(p.name)) and p.is_dir() and (limit is None or int(m.group(1)) <= limit))
    skipped = []
    for _, path in reversed(steps):
        problem = checkpoint_problem(path)
        if problem is None:
            if skipped:
                logger.warning("not resuming from %s; resuming from %s, the last complete checkpoint",
                               "; ".join(skipped), path)
            return str(path)
        skipped.append(f"{path} ({problem})")
    where = f"{output_dir} up to checkpoint-{limit}" if limit is not None else str(output_dir)
    detail = f": {'; '.join(skipped)}" if skipped else ""
    raise ValueError(f"no complete checkpoint in {where}{detail}; start without resume_from_checkpoint, or pass "
                     "a complete checkpoint directory")
