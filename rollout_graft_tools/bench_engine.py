"""The engine behind the benchmark loop (`scripts/bench.py --backend engine`): named engine
configurations, our plain path `ar` (and its A/A twin `ar-twin`), and Hugging Face `generate`
(`hf`, the peer a user of the engine would pick instead).

One engine per method, kept across cells and repeats as a trainer keeps it (rebuilt when the
temperature changes: the adjacency prior is warmed at the temperature it serves). Methods that
read the prior get one warmed on the train split's first prompts; graft methods get pruning
thresholds τ calibrated on the same prompts.
"""

from __future__ import annotations

import ast
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from rollout_graft import DraftConfig, EngineConfig, RetrievalConfig, RolloutEngine, SamplingParams, calibrate
from rollout_graft.warmup import warm_prior

from .benchmark import Cell
from .prompts import load_prompts

FOLD = "-fold"  # a method's name with this suffix: the same configuration with `fold_gqa=True`
GRAFT_VARIANTS = ("dense-draft", "prune-only", "fixed-split", "graft", "graft+dcut")
WARM_PROMPTS = 8  # train prompts the prior is warmed on (and τ calibrated on)


def variants(budget: int, prior: str | None, draft: str | None = None, thresholds: str | None = None) -> dict[str, EngineConfig]:
    """Named engine configurations (ablations are options of a method, not copies)."""
    # "retrieval…": the adjacency index alone (suffix chains and recall off); "+suffix", "+recall": the
    # engine's defaults add them (recall: run with --revisit)
    r = RetrievalConfig(prior_path=prior, update_prior=False, suffix_depth=0)
    d = DraftConfig(draft_model=draft, thresholds_path=thresholds)
    graft = lambda dc: EngineConfig(method="graft", budget=budget, retrieval=r, draft=dc)  # noqa: E731
    retrieval = lambda **kw: EngineConfig(method="retrieval", budget=budget, **kw)  # noqa: E731
    return {
        "ar": EngineConfig(method="ar"),
        "ar-twin": EngineConfig(method="ar"),  # A/A control: its ratio to "ar" shows the run's noise
        "retrieval": retrieval(retrieval=r),
        "retrieval+dcut": retrieval(retrieval=r, budget_policy="dcut"),
        "retrieval-noshare": retrieval(retrieval=replace(r, share_in_group=False)),
        "retrieval-noprior": retrieval(retrieval=replace(r, use_prior=False)),
        "retrieval-bare": retrieval(retrieval=replace(r, share_in_group=False, use_prior=False)),
        # suffix chains copied from the group's text; recall: completions of the same prompts from
        # earlier rollouts (GRPO epochs: run with --revisit); lead: each group's first row runs first
        "retrieval+suffix": retrieval(retrieval=replace(r, suffix_depth=8)),
        "retrieval+recall": retrieval(retrieval=replace(r, suffix_depth=8, recall=4)),  # the engine's defaults
        "retrieval+recall+dcut": retrieval(retrieval=replace(r, suffix_depth=8, recall=4), budget_policy="dcut"),
        "retrieval+lead": retrieval(group_lead=1, retrieval=replace(r, suffix_depth=8)),
        "dense-draft": graft(replace(d, prune=False, graft=False)),  # EAGLE-like dense drafter tree
        "prune-only": graft(replace(d, graft=False)),  # pruned, freed slots left empty
        "fixed-split": graft(replace(d, prune=False, adaptive_split=False)),  # draft + retrieval, fixed split
        "graft": graft(d),
        "graft+dcut": replace(graft(d), budget_policy="dcut"),
    }


def variant(name: str, budget: int, prior: str | None, draft: str | None = None, thresholds: str | None = None) -> EngineConfig:
    """The configuration called `name`; `name-fold` is it with grouped-query attention folded
    (`EngineConfig.fold_gqa`), `name@N` with budget N, and `name:field=value[:…]` sets fields of its
    `DCutConfig` (ablations: `retrieval+dcut:probe_share=0.05`)."""
    name, *knobs = name.split(":")
    base, _, size = name.partition("@")
    fold = base.endswith(FOLD)
    base = base.removesuffix(FOLD)
    known = variants(budget, prior, draft, thresholds)
    if base not in known:
        raise SystemExit(f"unknown engine method {name!r}; known: hf, {', '.join(known)} (optionally {FOLD}, @<budget>)")
    if size and not size.isdigit():
        raise SystemExit(f"engine method {name!r}: the part after @ is a budget in nodes, e.g. {base}@60")
    cfg = replace(known[base], fold_gqa=fold)
    cfg = replace(cfg, budget=int(size)) if size else cfg
    if knobs:
        fields = {k: ast.literal_eval(v) for k, _, v in (knob.partition("=") for knob in knobs)}
        cfg = replace(cfg, dcut=replace(cfg.dcut, **fields))
    return cfg


class EngineBackend:
    """`RolloutEngine` methods and `hf` on one loaded target."""

    plain = "ar"

    def __init__(self, model_path: str, prompts_path: str, methods: list[str], *, device: str = "cpu",
                 dtype: str = "float32", budget: int = 60, draft_model: str | None = None, prior_rounds: int = 5):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.prompts_path, self.methods, self.budget, self.draft = prompts_path, methods, budget, draft_model
        self.prior_rounds = prior_rounds
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device).eval()
        self.pool = load_prompts(prompts_path, self.tokenizer, "test", len(_split_rows(prompts_path, "test")))
        if not self.pool:
            raise SystemExit(f"{prompts_path} has no 'test' prompts to benchmark on (rows without a `split` count as test)")
        self.offset = 0
        self.engines: dict[str, RolloutEngine] = {}
        self.temperature: float | None = None
        self.prior = tempfile.NamedTemporaryFile(suffix=".safetensors", delete=False).name
        self.setup_s: dict[str, float] = {}  # prior warm-up and τ calibration, per temperature

    # ------------------------------------------------------------------ the loop's interface
    def prompts(self, cell: Cell, count: int) -> list[list[int]]:
        out = [self.pool[(self.offset + i) % len(self.pool)] for i in range(count)]
        self.offset += count
        return out

    def untimed(self, methods: list[str], cell: Cell, prompts: list, seed: int) -> None:
        for m in methods:
            if m != "hf":
                self._engine(m, cell).generate(_rows(prompts, cell.group), self._params(cell, seed))

    def run(self, method: str, cell: Cell, prompts: list, seed: int) -> dict:
        if method == "hf":
            return run_hf(self.model, self.tokenizer, prompts, cell.group, self._params(cell, seed))
        engine = self._engine(method, cell)
        engine.budget_policy()  # D-cut: profile the cost model (or read its disk cache) before the clock starts
        return run_engine(engine, _rows(prompts, cell.group), self._params(cell, seed))

    def close(self) -> None:
        for path in (self.prior, self.prior.replace(".safetensors", ".tau.json")):
            Path(path).unlink(missing_ok=True)

    # ------------------------------------------------------------------ engines
    def _params(self, cell: Cell, seed: int) -> SamplingParams:
        return SamplingParams(temperature=cell.temperature, max_new_tokens=cell.max_new_tokens, seed=seed,
                              ignore_eos=cell.ignore_eos)

    def _engine(self, method: str, cell: Cell) -> RolloutEngine:
        if cell.temperature != self.temperature:  # warm the prior (and τ) at this temperature, rebuild engines
            self._setup(cell)
        if method not in self.engines:
            tau = self.prior.replace(".safetensors", ".tau.json") if self._grafts() else None
            cfg = variant(method, self.budget, self.prior, self.draft, tau)
            self.engines[method] = RolloutEngine(self.model, cfg, tokenizer=self.tokenizer)
        return self.engines[method]

    def _grafts(self) -> bool:
        return any(m.split(":")[0].partition("@")[0] in GRAFT_VARIANTS for m in self.methods)

    def _setup(self, cell: Cell) -> None:
        self.engines.clear()
        self.temperature = cell.temperature
        params = self._params(cell, 20_000)
        warm = load_prompts(self.prompts_path, self.tokenizer, "train", WARM_PROMPTS)
        start = time.perf_counter()
        warm_prior(self.model, warm, self.prior, rounds=self.prior_rounds, group=cell.group, params=params,
                   tokenizer=self.tokenizer, budget=self.budget)
        if self._grafts():
            cfg = EngineConfig(method="graft", retrieval=RetrievalConfig(prior_path=self.prior, update_prior=False),
                               draft=DraftConfig(draft_model=self.draft))
            calibrate(RolloutEngine(self.model, cfg, tokenizer=self.tokenizer), _rows(warm, cell.group), params,
                      path=self.prior.replace(".safetensors", ".tau.json"))
        self.setup_s[str(cell.temperature)] = time.perf_counter() - start


def _split_rows(path: str, split: str) -> list[dict]:
    from rollout_graft.assets import read_jsonl

    return read_jsonl(path, split=split)


def _rows(prompts: list[list[int]], group: int) -> list[list[int]]:
    return [p for p in prompts for _ in range(group)]


def run_engine(engine: RolloutEngine, rows: list[list[int]], params: SamplingParams) -> dict:
    """One timed rollout of an engine."""
    start, cpu = time.perf_counter(), time.process_time()
    out = engine.generate(rows, params)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    s = out.stats
    return {
        "wall_s": wall, "cpu_s": cpu, "tokens": s.emitted_tokens, "mat": s.mean_accepted_tokens,
        "verify_tokens_per_step": s.verify_tokens_per_step,
        "target_forwards": s.target_forwards, "phase_s": s.seconds,
        "propose_share": s.seconds.get("propose", 0.0) / wall,  # drafter + retrieval + merge + D-cut
        "budget_ratio": s.budget_ratio,  # D-cut: mean ρ; the trace shows ρ as the batch drains
        "budget_trace": [(t["rows"], t["ratio"], t["kept"]) for t in s.budget_trace],
        "accept_hist": list(s.accept_hist),
    }


def run_hf(model, tokenizer, prompts: list[list[int]], group: int, params: SamplingParams) -> dict:
    """Plain HF generate on the same batch: left-padded distinct prompts × num_return_sequences."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    kw = dict(max_new_tokens=params.max_new_tokens, pad_token_id=pad, top_k=0, top_p=1.0)
    if params.ignore_eos:
        kw["min_new_tokens"] = params.max_new_tokens
    if params.temperature > 0:
        kw.update(do_sample=True, temperature=params.temperature, num_return_sequences=group)
    else:
        ids, mask = ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0)
        kw.update(do_sample=False)
    torch.manual_seed(params.seed or 0)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, **kw)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    tokens = 0
    for row in out[:, width:].tolist():
        n = len(row)
        if not params.ignore_eos:
            n = next((i + 1 for i, t in enumerate(row) if t in eos), n)
        tokens += n
    return {"wall_s": wall, "cpu_s": cpu, "tokens": tokens, "mat": 1.0,
            "target_forwards": out.shape[1] - width, "phase_s": {}}
