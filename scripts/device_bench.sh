#!/usr/bin/env bash
# The GPU machine's one command (docs/BENCHMARKS.md, "GPU"): run it once per carried piece of the
# model, the second time within 30 s of the first. Extra arguments go to `device_bench.py run`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
out="${OUT:-runs}"
mkdir -p "$out"
python scripts/device_bench.py run --out "$out/device_bench.json" "$@" 2>&1 | tee "$out/device_bench.log"
