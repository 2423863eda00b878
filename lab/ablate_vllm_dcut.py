#!/usr/bin/env python
"""A/A-controlled ablation of the vLLM chain D-cut: each mechanism taken out, against the unchanged.

    python lab/ablate_vllm_dcut.py --batches 8 64 --temperatures 1.0 --repeats 6 --json docs/bench/ablation_fresh.json
    python lab/ablate_vllm_dcut.py --revisit ...                       # a later GRPO epoch
    python lab/ablate_vllm_dcut.py --model "$(python scripts/prepare_models.py --print-path smollm2-135m-instruct)" ...

For every variant of `rollout_graft_tools.ablation.VARIANTS` (`same`: nothing taken out, the A/A
twin), one process runs vLLM `plain`, `ours+dcut@K` and `ours+dcut@K~VARIANT` on the same prompts,
interleaved in a fresh seeded order each repeat (`scripts/bench.py --backend vllm --in-process`).
Per cell it reports the variant's tokens/s over `ours+dcut@K`'s in the same repeat (median and
range over repeats) and both against plain. A mechanism earns its place where taking it out
loses beyond the spread of `same`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rollout_graft.files import atomic_write_json
from rollout_graft_tools.ablation import VARIANTS

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


def run_variant(variant: str, base: str, bench_args: list[str]) -> dict:
    """One process: plain, the base method and its variant, every cell; the bench JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        subprocess.run([sys.executable, str(BENCH), "--backend", "vllm", "--in-process", "--methods", "plain", base,
                        f"{base}~{variant}", *bench_args, "--out", str(out)], check=True)
        return json.loads(out.read_text())


def paired(cell: dict, base: str, variant: str) -> dict:
    """The variant's tokens/s over the base method's, repeat by repeat (both over the same plain)."""
    methods = cell["methods"]
    ratios = [v / b for v, b in zip(methods[f"{base}~{variant}"]["vs_plain_runs"], methods[base]["vs_plain_runs"])]
    return {"vs_base": statistics.median(ratios), "vs_base_runs": ratios,
            "base_vs_plain": methods[base]["vs_plain"], "variant_vs_plain": methods[f"{base}~{variant}"]["vs_plain"],
            "base_mat": methods[base]["mat"], "variant_mat": methods[f"{base}~{variant}"]["mat"]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--depth", type=int, default=8, help="num_speculative_tokens of ours+dcut")
    ap.add_argument("--json", type=Path)
    args, bench_args = ap.parse_known_args(argv)
    base = f"ours+dcut@{args.depth}"
    result = {"command": " ".join(["python", "lab/ablate_vllm_dcut.py", *(argv if argv is not None else sys.argv[1:])]),
              "base": base, "variants": {}}
    for variant in args.variants:
        bench = run_variant(variant, base, bench_args)
        result.setdefault("environment", {k: bench[k] for k in ("cpu", "python", "torch", "vllm", "model", "revisit")
                                          if k in bench})
        result["variants"][variant] = [{"temperature": c["temperature"], "batch": c["batch"], **paired(c, base, variant)}
                                       for c in bench["configs"]]
        for c in result["variants"][variant]:
            runs = ", ".join(f"{r:.2f}" for r in c["vs_base_runs"])
            print(f"{variant:<20} T={c['temperature']} b={c['batch']:<3} x{base}: {c['vs_base']:.2f} [{runs}]  "
                  f"{base} x plain {c['base_vs_plain']:.2f}", flush=True)
    if args.json:
        atomic_write_json(args.json, result, indent=1)
    return result


if __name__ == "__main__":
    main()
