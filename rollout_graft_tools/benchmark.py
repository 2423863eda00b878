"""One measuring loop for both backends (DESIGN.md §7): GRPO rollouts, P prompts × G samples, EOS on.

A `Backend` runs one timed rollout of a method on a cell's prompts; `measure_cell` runs every
method once per repeat, in a fresh seeded order each repeat (a slow spell of a shared machine,
or the allocator state one method leaves, falls on no method's runs only), on prompts no earlier
repeat used. With `revisit`, every method first runs the repeat's prompts once, untimed: a later
GRPO epoch, where `recall` and any method's caches may reuse that text.

Per method the entry keeps its median run's numbers and, against the backend's plain path
(`Backend.plain`: the engine's "ar", vLLM "plain") measured in the same repeats:
`vs_plain_runs`, each repeat's tokens/s over plain's in that repeat, and `vs_plain`, their median
(a slow spell that lasts a repeat falls on both sides of the ratio); `cpu_vs_plain` is the same
median over tokens per second of this process's CPU time (steadier on a shared machine).
MAT = emitted tokens / request-steps (tokens per row and target forward).
"""

from __future__ import annotations

import platform
import random
import sys
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Cell:
    """One (temperature, batch) setting: `batch` rows = `batch // group` prompts × `group` samples."""

    temperature: float
    batch: int
    group: int
    max_new_tokens: int
    ignore_eos: bool = False

    @property
    def prompts(self) -> int:
        return self.batch // self.group


def cell(temperature: float, batch: int, group: int, max_new_tokens: int, ignore_eos: bool = False) -> Cell:
    """The cell of `batch` rows: whole groups of `group` samples, or one prompt's group if smaller."""
    g = min(group, batch)
    if batch % g:
        raise ValueError(f"batch {batch} is not a multiple of the group size {g}: pick batches in multiples of --group")
    return Cell(temperature, batch, g, max_new_tokens, ignore_eos)


class Backend(Protocol):
    """What the loop needs of a backend (`bench_engine.EngineBackend`, `bench_vllm.VLLMBackend`)."""

    plain: str  # the method every ratio is taken against

    def prompts(self, cell: Cell, count: int) -> list:
        """The next `count` prompts of the pool (never the same ones twice while the pool lasts)."""

    def untimed(self, methods: list[str], cell: Cell, prompts: list, seed: int) -> None:
        """One rollout of these prompts on every method, not measured (warm-up, revisit)."""

    def run(self, method: str, cell: Cell, prompts: list, seed: int) -> dict:
        """One timed rollout: at least tokens, wall_s, cpu_s, mat (drafted/accepted_per_step where known)."""


def median(xs: list[float]) -> float:
    """The median; of an even count, the upper middle value (a value that was measured)."""
    ordered = sorted(xs)
    return ordered[len(ordered) // 2]


def measure_cell(backend: Backend, methods: list[str], cell: Cell, repeats: int, seed: int = 0,
                 revisit: bool = False, warmup_rollouts: int = 0) -> dict:
    """`repeats` interleaved timed rollouts of every method on this cell → the cell's entry."""
    if backend.plain not in methods:
        raise ValueError(f"--methods must include {backend.plain!r}: every ratio is taken against it")
    for w in range(warmup_rollouts):  # untimed: what a GRPO run has learned before this rollout
        backend.untimed(methods, cell, backend.prompts(cell, cell.prompts), seed + 10_000 + w)
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    for rep in range(repeats):
        prompts = backend.prompts(cell, cell.prompts)
        if revisit:  # the prompts' previous epoch, untimed
            backend.untimed(methods, cell, prompts, seed + 20_000 + rep)
        for m in random.Random(seed + rep).sample(methods, len(methods)):
            runs[m].append(backend.run(m, cell, prompts, seed + rep))
    return {"temperature": cell.temperature, "batch": cell.batch, "prompts": cell.prompts, "group": cell.group,
            "methods": summarize(runs, backend.plain)}


def summarize(runs: dict[str, list[dict]], plain: str) -> dict[str, dict]:
    """Per method: its median run, the paired ratios to `plain`, and totals over every repeat."""
    for r in (r for rs in runs.values() for r in rs):
        r["tokens_per_s"] = r["tokens"] / r["wall_s"]
        r["cpu_tokens_per_s"] = r["tokens"] / max(r["cpu_s"], 1e-9)
    base = runs[plain]
    out = {}
    for name, rs in runs.items():
        mid = sorted(rs, key=lambda r: r["tokens_per_s"])[len(rs) // 2]
        ratios = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(rs, base)]
        cpu = [r["cpu_tokens_per_s"] / b["cpu_tokens_per_s"] for r, b in zip(rs, base)]
        out[name] = {**mid, "vs_plain": median(ratios), "vs_plain_runs": ratios, "cpu_vs_plain": median(cpu),
                     "tokens_per_s_runs": [r["tokens_per_s"] for r in rs],
                     "mat": median([r["mat"] for r in rs]),
                     "wall_s_total": sum(r["wall_s"] for r in rs), "tokens_total": sum(r["tokens"] for r in rs)}
        for key in ("drafted_per_step", "accepted_per_step"):
            if rs[0].get(key) is not None:
                out[name][key] = median([r[key] for r in rs])
        if rs[0].get("phase_s") is not None:  # the engine's phases, pooled over the repeats
            out[name]["phase_s_total"] = {k: sum(r["phase_s"].get(k, 0.0) for r in rs) for k in rs[0]["phase_s"]}
    return out


def cpu_info() -> dict:
    """The CPU's model name and flags (/proc/cpuinfo; the platform's processor string elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        return {"model": fields.get("model name", ""), "flags": fields.get("flags", "").split()}
    except OSError:
        return {"model": platform.processor(), "flags": []}


def environment(device: str, dtype: str, argv: list[str] | None = None) -> dict:
    """What every benchmark JSON records: the command, the machine and the versions."""
    import torch
    import transformers

    import rollout_graft

    env = {"command": " ".join(["python", *(argv if argv is not None else sys.argv)]),
           "device": device, "dtype": dtype, "cpu": cpu_info(), "threads": torch.get_num_threads(),
           "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "rollout_graft": rollout_graft.__version__}
    if "vllm" in sys.modules:
        env["vllm"] = sys.modules["vllm"].__version__
    if device.startswith("cuda"):
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    return env
