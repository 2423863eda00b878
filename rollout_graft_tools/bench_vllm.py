"""vLLM behind the benchmark loop (`scripts/bench.py --backend vllm`). Methods (each a `vllm.LLM`
built once, kept across cells):

    plain, plain-twin   vLLM without speculation (the twin is an A/A control: its ratio shows the noise)
    ngram@K             vLLM's prompt-lookup proposer
    suffix@K            vLLM's suffix decoding (arctic-inference)
    ours@K              our proposer, fixed budget (every request drafts up to K)
    ours+dcut@K         our proposer with D-cut (depths up to K)
    ours+dcut@K~NAME    the same with one of D-cut's mechanisms taken out (`ablation.VARIANTS`)
    oracle@K            drafts the recorded T=0 plain completion: what speculation can give here at all
    empty@K             drafts nothing: vLLM's speculative path with empty drafts (vLLM's floor)
    empty+plain@K       the same with our plugin's plain path for undrafted steps (our proposer's floor)
    engine-ar, engine-retrieval+dcut   our own engine (HF forwards) on the same prompts

vLLM binds a process's threads and its Prometheus counters are process-wide, so `scripts/bench.py`
runs each method in a process of its own beside its own `plain`. MAT = emitted tokens /
(emitted − accepted draft tokens): tokens per request-step.
"""

from __future__ import annotations

import time

from rollout_graft.assets import read_prompt_texts
from rollout_graft.vllm import proposer_summary, speculative_config, vllm_speculative_config
from rollout_graft.vllm.groups import RequestTracker

from .benchmark import Cell

COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
ORACLE: dict[tuple[int, ...], list[int]] = {}  # prompt token ids → recorded T=0 completion (OracleProposer reads it)


class OracleProposer:
    """Drafts each request's recorded T=0 plain completion from where the request stands."""

    def __init__(self, vllm_config):
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.tracker = RequestTracker()
        self.counts = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
        self.pending: dict[int, int] = {}  # id(request) → draft length returned last step

    def load_model(self, *args, **kwargs) -> None:
        pass

    def set_requests(self, ids, prompt_lengths, finished=()) -> None:  # each step, from our plugin
        self.requests, self.finished = (ids, prompt_lengths), finished

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        out, pending = [], {}
        self.tracker.rows(*self.requests, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        self.tracker.finish(self.finished)
        rows = self.tracker.requests()
        for req, new in zip(rows, sampled_token_ids):
            if req is None:
                out.append([])
                continue
            if self.pending.get(id(req)):  # counted as vLLM counts: drafts that were verified
                self.counts["drafts"] += 1
                self.counts["draft_tokens"] += self.pending[id(req)]
                self.counts["accepted_tokens"] += len(new) - 1
            prompt = tuple(req.group.prompt)
            done = req.length - len(prompt)
            out.append(ORACLE.get(prompt, [])[done : done + self.k])
            pending[id(req)] = len(out[-1])
        self.pending = pending
        return out


def _oracle_counts(worker) -> dict:
    return dict(worker.model_runner.drafter.counts)


ENGINE_METHODS = ("engine-ar", "engine-retrieval+dcut")
"""Our own engine (HF forwards) beside vLLM's on the same prompts (`_build`): no speculative config."""


def spec_for(method: str) -> dict | None:
    """The `speculative_config` of a method name (None: plain, or one of `ENGINE_METHODS`)."""
    if method in ENGINE_METHODS:
        return None
    base, _, k = method.partition("@")
    k, _, variant = k.partition("~")
    if k and not k.isdigit():  # else int()'s ValueError, which `scripts/bench.py` reads as a missing extra
        raise SystemExit(f"vLLM method {method!r}: the part after @ is a draft depth K in tokens, e.g. {base}@8")
    k = int(k or 8)
    if variant:  # ours+dcut@K~NAME: one of D-cut's mechanisms taken out (`ablation.VARIANTS`)
        from .ablation import VARIANTS

        if base != "ours+dcut" or variant not in VARIANTS:
            raise SystemExit(f"unknown ablation {method!r}: ours+dcut@K~NAME, NAME one of {sorted(VARIANTS)}")
        return {"method": "custom_class", "model": f"{VARIANTS[variant].__module__}.{VARIANTS[variant].__name__}",
                "num_speculative_tokens": k}
    if base in ("plain", "plain-twin"):
        return None
    custom = {"oracle": f"{__name__}.OracleProposer", "empty": "rollout_graft_tools.baselines.EmptyProposer",
              "empty+plain": "rollout_graft_tools.baselines.PlainEmptyProposer"}
    if base in ("ngram", "suffix"):  # as GraftConfig(backend="vllm", method=base) builds them
        return vllm_speculative_config(base, k)
    if base in ("ours", "ours+dcut"):
        return speculative_config(k, "dcut" if base == "ours+dcut" else "fixed")
    if base in custom:
        return {"method": "custom_class", "model": custom[base], "num_speculative_tokens": k}
    raise SystemExit(f"unknown vLLM method {method!r}; known: plain, plain-twin, ngram@K, suffix@K, ours@K, ours+dcut@K, "
                     "oracle@K, empty@K, empty+plain@K, " + ", ".join(ENGINE_METHODS))


class VLLMBackend:
    """vLLM engines (and, for `engine-*`, our engine) on one target, in this process."""

    plain = "plain"

    def __init__(self, model: str, prompts_path: str, methods: list[str], dtype: str = "float32"):
        from transformers import AutoTokenizer

        internal = [m for m in methods if m.startswith(("ngram", "suffix"))]
        if len(internal) > 1:
            raise SystemExit(f"one of vLLM's own proposers per process (its counters are process-wide), got {internal}")
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        # chat prompts (real-prompts/) go through the model's chat template, as TRL sends them
        self.pool = read_prompt_texts(prompts_path, self.tokenizer)
        self.offset = 0
        # vLLM's Prometheus counters read the last-built engine's: build vLLM's own proposer last
        self.llms = {m: _build(m, model, dtype) for m in sorted(methods, key=lambda m: m in internal)}

    def prompts(self, cell: Cell, count: int) -> list[str]:
        out = [self.pool[(self.offset + i) % len(self.pool)] for i in range(count)]
        self.offset += count
        if any(m.startswith("oracle") for m in self.llms):  # the oracle drafts plain's T=0 completions
            from vllm import SamplingParams

            done = self.llms["plain"].generate(out, SamplingParams(temperature=0, max_tokens=cell.max_new_tokens),
                                               use_tqdm=False)
            ORACLE.clear()
            ORACLE.update({tuple(o.prompt_token_ids): list(o.outputs[0].token_ids) for o in done})
        return out

    def untimed(self, methods: list[str], cell: Cell, prompts: list[str], seed: int) -> None:
        """What each proposer learns from a rollout is what a GRPO run would have learned; our engine
        and the oracle are left out (nothing to learn)."""
        for m in methods:
            if not m.startswith(("engine-", "oracle")):
                self.llms[m].generate(_rows(prompts, cell.group), self._params(cell), use_tqdm=False)

    def run(self, method: str, cell: Cell, prompts: list[str], seed: int) -> dict:
        if method.startswith("engine-"):
            return self._run_engine(method, cell, prompts, seed)
        llm = self.llms[method]
        before = counters(llm, method)
        ours = method.startswith("ours")
        own = proposer_summary(llm)["propose_s"] if ours else 0.0
        start, cpu = time.perf_counter(), time.process_time()
        outs = llm.generate(_rows(prompts, cell.group), self._params(cell), use_tqdm=False)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        after = counters(llm, method)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        accepted = after["accepted_tokens"] - before["accepted_tokens"]
        steps = max(tokens - accepted, 1)
        return {"wall_s": wall, "cpu_s": cpu, "tokens": tokens, "mat": tokens / steps,
                "drafted_per_step": (after["draft_tokens"] - before["draft_tokens"]) / steps,
                "accepted_per_step": accepted / steps,
                "proposer_share": (proposer_summary(llm)["propose_s"] - own) / wall if ours else None}

    def close(self) -> None:
        pass

    def _params(self, cell: Cell):
        from vllm import SamplingParams

        return SamplingParams(temperature=cell.temperature, max_tokens=cell.max_new_tokens, ignore_eos=cell.ignore_eos)

    def _run_engine(self, method: str, cell: Cell, prompts: list[str], seed: int) -> dict:
        from rollout_graft import SamplingParams

        from .bench_engine import run_engine

        rows = [self.tokenizer(p)["input_ids"] for p in _rows(prompts, cell.group)]
        params = SamplingParams(temperature=cell.temperature, max_new_tokens=cell.max_new_tokens, seed=seed,
                                ignore_eos=cell.ignore_eos)
        run = run_engine(self.llms[method], rows, params)
        return {k: run[k] for k in ("wall_s", "cpu_s", "tokens", "mat")}


def _rows(prompts: list[str], group: int) -> list[str]:
    return [p for p in prompts for _ in range(group)]


def _build(method: str, model: str, dtype: str):
    if method.startswith("engine-"):
        import torch

        from rollout_graft import EngineConfig, RolloutEngine

        cfg = EngineConfig(method="ar") if method == "engine-ar" else EngineConfig(method="retrieval", budget_policy="dcut")
        return RolloutEngine.from_pretrained(model, config=cfg, dtype=getattr(torch, dtype))
    from vllm import LLM

    return LLM(model, dtype=dtype, seed=0, enforce_eager=True, speculative_config=spec_for(method), disable_log_stats=False)


def counters(llm, method: str) -> dict:
    """drafts / draft_tokens / accepted_tokens so far. vLLM's Prometheus counters are process-wide and
    read the last-built engine's (vLLM's own proposer is built last); ours and the oracle count for
    themselves (our proposer's counts equal vLLM's: tests/test_vllm.py)."""
    if method.startswith("ours"):
        return {k: proposer_summary(llm)[k] for k in COUNTERS.values()}
    if method.startswith(("oracle", "empty")):
        return llm.collective_rpc(_oracle_counts)[0]
    got = {COUNTERS[m.name]: m.value for m in llm.get_metrics() if m.name in COUNTERS}
    return {k: got.get(k, 0) for k in COUNTERS.values()}
