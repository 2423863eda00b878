#!/usr/bin/env bash
# The GPU machine's one command (scripts/device_bench.py): run it once per carried piece of the
# model, the second time within 30 s of the first. Extra arguments go to `device_bench.py run`.
# The pure-Python gguf wheel travels with piece 1 and is stashed in the cache: importable from the
# zip once on PYTHONPATH (the machine has no package registry).
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${ROLLOUT_GRAFT_CACHE:-$HOME/.cache/rollout_graft}"
wheels="$(ls .cache/device/piece-*/wheels/*.whl "$cache"/device/*/*.whl 2>/dev/null | tr '\n' ':' || true)"
export PYTHONPATH="$PWD:${wheels}${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
out="${OUT:-runs}"
mkdir -p "$out"
python scripts/device_bench.py run --out "$out/device_bench.json" "$@" 2>&1 | tee "$out/device_bench.log"
