"""Runs vLLM on the embedded tiny target with our proposer and a KV cache too small for the batch,
so vLLM preempts requests, and writes its counters and our proposer's summary as JSON.

    python tests/vllm_faults_run.py OUT.json BLOCKS POLICY...

BLOCKS: KV-cache blocks of 32 tokens (`num_gpu_blocks_override`; 64 requests of up to ~160 tokens
need ~300); POLICY: "fixed" or "dcut", one engine after the other. OUT: {policy: {"completions",
"counters", "summary"}}.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vllm import LLM, SamplingParams  # noqa: E402

from rollout_graft.assets import TINY_TARGET, load_tiny_prompts  # noqa: E402
from rollout_graft.vllm import proposer_summary, speculative_config  # noqa: E402

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
            "vllm:num_preemptions")


def run(blocks: int, policy: str) -> dict:
    llm = LLM(str(TINY_TARGET), dtype="float32", max_model_len=256, seed=0, enforce_eager=True, block_size=32,
              num_gpu_blocks_override=blocks, max_num_seqs=64, disable_log_stats=False,
              speculative_config=speculative_config(4, budget_policy=policy))
    prompts = [r["prompt"] for r in load_tiny_prompts("test")[:8]]
    rows = [p for p in prompts for _ in range(8)]
    outs = llm.generate(rows, SamplingParams(temperature=1.0, max_tokens=128), use_tqdm=False)
    result = {"completions": [list(o.outputs[0].token_ids) for o in outs],
              "counters": {m.name: m.value for m in llm.get_metrics() if m.name in COUNTERS},
              "summary": proposer_summary(llm)}
    del llm
    return result


if __name__ == "__main__":
    results = {policy: run(int(sys.argv[2]), policy) for policy in sys.argv[3:]}
    with open(sys.argv[1], "w") as f:
        json.dump(results, f)
