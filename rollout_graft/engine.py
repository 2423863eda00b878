"""RolloutEngine: the step loop (DESIGN.md §2).

    propose → verify (one target forward over every row's tree) → accept (lossless) → commit → learn

`generate` takes GRPO-shaped batches: identical prompt rows form a group, prefilled once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from .attention import folded
from .config import EngineConfig, SamplingParams
from .cost import CostModel
from .dcut.core import BudgetDecision
from .dcut.trees import DCut, FixedBudget, StepRecord, TreePolicy
from .files import local_dir
from .proposers import GraftProposer, NoProposer, Proposer, RetrievalProposer, StepContext
from .runner import ModelRunner
from .sampling import check_finite, row_keys, uniforms
from .stats import RolloutStats, StepTimer
from .tree import Draft, TreeBatch
from .verify import Acceptance, accept


@dataclass(slots=True)
class RolloutOutput:
    completion_ids: list[list[int]]  # one per prompt row, EOS included when hit
    logprobs: list[list[float]]  # log_softmax(logits / T)[token] of the target, per completion token
    finish_reasons: list[str]  # "stop" | "length"
    stats: RolloutStats = field(default_factory=RolloutStats)
    seed: int | None = None  # the call's sampling seed (drawn when SamplingParams.seed was None): pass it to repeat the call


@dataclass(slots=True)
class _Rows:
    """Active rows: device tensors for the step, host lists for the output."""

    index: list[int]  # original row index of each active row
    last_token: torch.Tensor  # [rows]
    prev_token: torch.Tensor  # [rows] the token before last_token (-1: none)
    length: torch.Tensor  # [rows] committed tokens incl. the uncached root
    group: torch.Tensor  # [rows]
    generated: torch.Tensor  # [rows] completion tokens so far = completion position of the next token
    key: torch.Tensor  # [rows] int64 sampling key of the row (`sampling.row_keys` of its index in the call)
    seen: torch.Tensor | None = None  # [rows, V + 1] bool: the tokens of the row's prompt and completion
    # (column V: where the -1 of rows that emitted fewer land), for the repetition penalty; None without one

    def select(self, keep: list[int]) -> None:
        idx = torch.tensor(keep, dtype=torch.long, device=self.last_token.device)
        self.index = [self.index[i] for i in keep]
        for name in ("last_token", "prev_token", "length", "group", "generated", "key", "seen"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).index_select(0, idx))

    def see(self, tokens: torch.Tensor) -> None:
        """Mark `tokens` [rows, m] (-1: none) as seen by their rows (where a penalty asks for it)."""
        if self.seen is not None:
            vocab = self.seen.shape[1] - 1
            self.seen.scatter_(1, tokens.masked_fill(tokens < 0, vocab), True)


@dataclass(slots=True)
class _Run:
    """One `generate` call: what it samples and what it returns so far (indexed by original row)."""

    params: SamplingParams
    stop_ids: set[int]
    stats: RolloutStats
    completions: list[list[int]]
    logprobs: list[list[float]]
    reasons: list[str]


def _eos_ids(model: PreTrainedModel) -> set[int]:
    ids: set[int] = set()
    for cfg in (getattr(model, "generation_config", None), model.config):
        eos = getattr(cfg, "eos_token_id", None) if cfg is not None else None
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else list(eos))
    return ids


def _prompt_rows(prompt_ids) -> list[list[int]]:
    """`generate`'s prompts as lists of ids: a list of id lists, a 2-D integer tensor or numpy array,
    or a tokenizer's output (`BatchEncoding` / dict with `input_ids`; its `attention_mask`, when
    present, drops the padding)."""
    if hasattr(prompt_ids, "keys") and not isinstance(prompt_ids, (list, tuple, torch.Tensor)):  # BatchEncoding, dict
        if "input_ids" not in prompt_ids:
            raise TypeError(f"prompt_ids is a {type(prompt_ids).__name__} without 'input_ids' (keys {list(prompt_ids.keys())}): "
                            "pass a tokenizer's output or its ['input_ids']")
        rows, mask = _prompt_rows(prompt_ids["input_ids"]), prompt_ids.get("attention_mask")
        if mask is None:
            return rows
        mask = _prompt_rows(mask)
        if [len(m) for m in mask] != [len(r) for r in rows]:
            raise ValueError("prompt_ids' attention_mask and input_ids differ in shape: pass the tokenizer's output unchanged")
        return [[t for t, keep in zip(r, m) if keep] for r, m in zip(rows, mask)]
    if isinstance(prompt_ids, torch.Tensor) or type(prompt_ids).__module__ == "numpy":
        dtype = prompt_ids.dtype
        integer = (not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
                   if isinstance(prompt_ids, torch.Tensor) else dtype.kind in "iu")
        if prompt_ids.ndim != 2 or not integer:
            raise TypeError(f"prompt_ids is a {prompt_ids.ndim}-D {dtype} {type(prompt_ids).__name__}: token ids are "
                            "integers, pass a 2-D integer array, one row per prompt (e.g. a torch.long tensor "
                            "tokenizer(..., return_tensors='pt')['input_ids'])")
        prompt_ids = prompt_ids.tolist()
    if not isinstance(prompt_ids, (list, tuple)) or not prompt_ids:
        raise ValueError(f"prompt_ids must be a non-empty list of token-id lists (one per row), a 2-D integer tensor or "
                         f"array, or a tokenizer's output; got {type(prompt_ids).__name__}")
    return [_token_row(i, p) for i, p in enumerate(prompt_ids)]


def _token_row(i: int, row) -> list[int]:
    """Prompt row `i` as a list of ints; TypeError for strings, dicts, floats and bools."""
    if isinstance(row, (str, bytes)):
        raise TypeError(f"prompt row {i} is a string ({row!r}): pass token ids, e.g. tokenizer(text)['input_ids'] "
                        "(a string would be read as one id per character)")
    if isinstance(row, torch.Tensor) or type(row).__module__ == "numpy":  # a tensor / ndarray row
        row = row.tolist()
    if not isinstance(row, (list, tuple)):
        hint = " (from a tokenizer, pass its ['input_ids'])" if isinstance(row, dict) or hasattr(row, "keys") else ""
        raise TypeError(f"prompt_ids must hold one list of integer token ids per row; row {i} is "
                        f"{type(row).__name__}{hint}; for a single prompt pass [[id, id, ...]]")
    if all(type(t) is int for t in row):  # the common case, checked fast
        return list(row)
    for t in row:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"prompt row {i} holds {type(t).__name__} {t!r}: token ids must be ints "
                            "(tokenize with the model's tokenizer; cast float tensors with .long())")
    return [int(t) for t in row]


PLAIN_COMPACT_SLACK = 0.05
"""A step the budget policy chose to decode plainly (ρ = 0) compacts the KV cache when invalid slots
exceed this fraction (the rejected nodes of its probes and earlier trees would slow every plain
forward after them: +20 % per forward for +50 % slots on the tiny target)."""


class RolloutEngine:
    """Generates GRPO rollouts from a Hugging Face causal LM, speculatively and losslessly.

    Args:
        model: the target (policy) model; used in place (no copy), so a trainer's live
            module can be passed.
        config: `EngineConfig`.
        tokenizer: optional; when given, its vocabulary must fit the model's.
        proposer: override the proposer built from `config` (tests, research).
        draft_model: method "graft": the draft model (a loaded model or a local directory; else
            `config.draft.draft_model`). It must share the target's tokenizer.
    """

    def __init__(self, model: PreTrainedModel, config: EngineConfig | None = None, tokenizer=None, proposer: Proposer | None = None,
                 draft_model: str | Path | PreTrainedModel | None = None):
        if config is not None and not isinstance(config, EngineConfig):
            raise TypeError(f"config must be a rollout_graft.EngineConfig, got {type(config).__name__} (the arguments are "
                            "RolloutEngine(model, config, tokenizer): pass the tokenizer as tokenizer=...)")
        if not isinstance(model, torch.nn.Module):
            hint = (f"for a model directory use RolloutEngine.from_pretrained({str(model)!r})" if isinstance(model, (str, Path))
                    else "e.g. AutoModelForCausalLM.from_pretrained(directory), or RolloutEngine.from_pretrained(directory)")
            raise TypeError(f"model must be a loaded causal LM (a transformers PreTrainedModel), got "
                            f"{type(model).__name__}: {hint}")
        self.config = config or EngineConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.runner = ModelRunner(model, compact_slack=self.config.compact_slack)
        if tokenizer is not None and len(tokenizer) > self.runner.vocab_size:
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary has {self.runner.vocab_size}: "
                "pass the tokenizer that was trained with this model"
            )
        if proposer is None and self.config.method != "ar" and self.config.retrieval.top_k > self.runner.vocab_size:
            raise ValueError(f"RetrievalConfig.top_k={self.config.retrieval.top_k} exceeds the model's vocabulary of "
                             f"{self.runner.vocab_size} tokens (the index stores top_k successors per token): use a "
                             f"top_k <= {self.runner.vocab_size}, e.g. the default 8")
        self.proposer = proposer or self._build_proposer(draft_model)
        self.policy: TreePolicy | None = None  # built on first use: D-cut's profiling takes a few seconds
        self.speculative_share = 1.0  # share of the last rollout's steps that verified a tree (`_waves`)
        self.eos_ids = _eos_ids(model)
        self._lock = threading.Lock()  # one rollout at a time: the runner's cache and the proposer's state are per call

    @classmethod
    def from_pretrained(cls, path_or_model: str | Path | PreTrainedModel, config: EngineConfig | None = None,
                        device: str | torch.device = "cpu", dtype: torch.dtype | None = None, **kwargs) -> "RolloutEngine":
        """Load a target from a local directory (never from a hub: FileNotFoundError when the directory
        does not exist) or wrap a model. A draft model (`draft_model=` or `config.draft.draft_model`)
        is a local directory too."""
        if isinstance(path_or_model, PreTrainedModel):
            model = path_or_model
        else:
            local_dir(path_or_model, "the target model's")
            model = AutoModelForCausalLM.from_pretrained(path_or_model, dtype=dtype or torch.float32, local_files_only=True)
            model.to(device).eval()
        tokenizer = kwargs.pop("tokenizer", None)
        if tokenizer is None and not isinstance(path_or_model, PreTrainedModel):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(path_or_model, local_files_only=True)
        return cls(model, config=config, tokenizer=tokenizer, **kwargs)

    def _build_proposer(self, draft_model=None) -> Proposer:
        if self.config.method == "ar":
            return NoProposer()
        if self.config.method == "graft":
            return GraftProposer.build(self.config, self.runner, draft_model, self.tokenizer)
        return RetrievalProposer(self.config.retrieval, self.runner.vocab_size, self.runner.device)

    def reload_draft_model(self, draft_model: str | Path | PreTrainedModel) -> None:
        """Method "graft": replace the drafter's weights (directory or model) before the next rollout,
        so a drafter that drifted from the policy can be refreshed; ValueError for other methods or
        a drafter whose vocabulary differs from the target's."""
        with self._lock:  # not while another thread's rollout drafts with the old one
            self.proposer.reload_drafter(draft_model, self.runner, self.tokenizer)

    def budget_policy(self) -> TreePolicy:
        """The budget policy of `config.budget_policy` (D-cut profiles its cost model on first call)."""
        if self.policy is None:
            if self.config.budget_policy == "dcut":
                with self._attention():  # the table times the forward the rollouts run
                    cost = CostModel.profile(self.model, refresh=self.config.cost_profile_refresh)
                self.policy = DCut(cost, self.config.budget, self.config.dcut)
            else:
                self.policy = FixedBudget(self.config.budget)
        return self.policy

    def _sync(self) -> None:
        torch.cuda.synchronize(self.runner.device)

    # ------------------------------------------------------------------ input checks
    def _check_prompts(self, prompt_ids, params: SamplingParams) -> list[list[int]]:
        rows = _prompt_rows(prompt_ids)
        vocab, max_pos = self.runner.vocab_size, self.runner.max_positions
        bad = [t for t in params.stop_token_ids or [] if t >= vocab]
        if bad:
            raise ValueError(f"stop_token_ids {bad} lie outside the model's vocabulary [0, {vocab}): such a token can "
                             "never be sampled; pass ids from the model's own tokenizer")
        for i, p in enumerate(rows):
            if not p:
                raise ValueError(f"prompt row {i} is empty: give every row at least one token (e.g. a BOS token)")
            bad = [t for t in p if not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"prompt row {i} has token id {bad[0]} outside the model's vocabulary [0, {vocab}): "
                    "tokenize with the model's own tokenizer"
                )
            if max_pos is not None and len(p) + params.max_new_tokens > max_pos:
                raise ValueError(
                    f"prompt row {i} has {len(p)} tokens; with max_new_tokens={params.max_new_tokens} it exceeds "
                    f"the model's context of {max_pos}: shorten the prompt or lower max_new_tokens"
                )
        return rows

    # ------------------------------------------------------------------ generation
    @torch.inference_mode()
    def generate(self, prompt_ids, params: SamplingParams | None = None) -> RolloutOutput:
        """Sample one completion per prompt row. Rows with identical prompts form a group.

        The token at completion position t of row r (its index in `prompt_ids`) is drawn with the
        uniform hash(seed, r, t) (`SamplingParams.seed`), so every method and budget returns the
        completions of plain "ar" sampling with that seed. Calls from several threads run one
        after another (the engine holds one KV cache and one proposer state)."""
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            hint = "SamplingParams(**params)" if isinstance(params, dict) else "SamplingParams(temperature=1.0, max_new_tokens=128)"
            raise TypeError(f"params must be a rollout_graft.SamplingParams, e.g. {hint}; got {type(params).__name__}")
        params = dataclasses.replace(params)  # validated again: its fields may have been set after it was built
        rows = self._check_prompts(prompt_ids, params)
        with self._lock, self._attention():
            return self._generate(rows, params)

    def _attention(self):
        """The target's attention for a rollout or a profile: folded where `config.fold_gqa` asks."""
        return folded(self.model) if self.config.fold_gqa else contextlib.nullcontext()

    def _generate(self, rows: list[list[int]], params: SamplingParams) -> RolloutOutput:
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        run = _Run(params, (set() if params.ignore_eos else set(self.eos_ids)) | set(params.stop_token_ids or []),
                   RolloutStats(), [[] for _ in rows], [[] for _ in rows], ["length"] * len(rows))
        stats = run.stats
        device = self.runner.device
        self.budget_policy()

        distinct: dict[tuple[int, ...], int] = {}
        row_group = [distinct.setdefault(tuple(p), len(distinct)) for p in rows]
        prompts = [list(p) for p in distinct]
        group = torch.tensor(row_group, dtype=torch.long, device=device)
        keys = row_keys(seed, len(rows), device)  # [rows]: row r's stream, the same in every wave
        waves = self._waves(row_group)
        if len(waves) > 1 and not self.proposer.resumes_rows:
            raise ValueError(f"group_lead needs a proposer that can resume rows (Proposer.activate); "
                             f"{type(self.proposer).__name__} cannot: set group_lead=0")
        try:
            for i, wave in enumerate(waves):
                with stats.timed("prefill"):
                    prompt_logits = self.runner.prefill([p[:-1] for p in prompts], group[wave])
                    if i == 0:  # the proposer sees every row once; later waves resume it
                        if prompt_logits is not None:
                            check_finite(prompt_logits)
                        self.proposer.start(prompts, group, prompt_logits, params)
                    self.proposer.activate(torch.tensor(wave, dtype=torch.long, device=device))
                state = _Rows(
                    index=list(wave),
                    last_token=torch.tensor([rows[r][-1] for r in wave], dtype=torch.long, device=device),
                    prev_token=torch.tensor([rows[r][-2] if len(rows[r]) > 1 else -1 for r in wave], dtype=torch.long,
                                            device=device),
                    length=torch.tensor([len(rows[r]) for r in wave], dtype=torch.long, device=device),
                    group=group[wave],
                    generated=torch.zeros(len(wave), dtype=torch.long, device=device),
                    key=keys[wave],
                )
                if params.repetition_penalty != 1.0:
                    state.seen = torch.zeros(len(wave), self.runner.vocab_size + 1, dtype=torch.bool, device=device)
                    state.see(torch.nn.utils.rnn.pad_sequence(
                        [torch.tensor(rows[r], dtype=torch.long) for r in wave], batch_first=True, padding_value=-1).to(device))
                while state.index:
                    self._step(state, run)
        finally:
            self.runner.release()
        stats.emitted_tokens = sum(len(c) for c in run.completions)
        if stats.drafted_share is not None:
            self.speculative_share = stats.drafted_share
        return RolloutOutput(run.completions, run.logprobs, run.reasons, stats, seed)

    def _waves(self, row_group: list[int]) -> list[list[int]]:
        """Rows in the order they run: all at once, or each group's first `group_lead` rows first
        (only while the previous rollout verified trees in at least half of its steps: the waves add
        target forwards that only speculation can repay; a D-cut that decodes plainly stops them)."""
        lead = self.config.group_lead
        if lead <= 0 or self.speculative_share < 0.5:
            return [list(range(len(row_group)))]
        seen: dict[int, int] = {}
        rank = []  # position of each row within its group
        for g in row_group:
            rank.append(seen.get(g, 0))
            seen[g] = rank[-1] + 1
        waves = [[r for r, k in enumerate(rank) if k < lead], [r for r, k in enumerate(rank) if k >= lead]]
        return [w for w in waves if w]

    def _step(self, state: _Rows, run: _Run) -> None:
        """propose → cut → verify → accept → commit → learn → advance → observe."""
        rows, policy, params = len(state.index), self.policy, run.params
        timer = StepTimer(run.stats, self._sync if policy.timed and self.runner.device.type == "cuda" else None)
        ctx = StepContext(last_token=state.last_token, length=state.length, group=state.group,
                          remaining=params.max_new_tokens - state.generated, budget=policy.plan(rows),
                          prev_token=state.prev_token)
        with timer.phase("propose"):
            draft = self.proposer.propose(ctx) if ctx.budget else Draft.empty(rows, state.last_token.device)
            draft, decision = policy.cut(draft)
            tree = TreeBatch.from_draft(state.last_token, draft)
            tree.max_depth = min(tree.max_depth, self.config.max_depth)
            positions = (state.length - 1).unsqueeze(1) + tree.depth  # [rows, n]
            mask = tree.ancestor_mask()
        with timer.phase("verify"):
            logits = self.runner.verify(tree.tokens, positions, mask)
        with timer.phase("accept"):
            check_finite(logits)
            levels = torch.arange(tree.max_depth + 1, device=state.key.device)  # level l emits completion position generated + l
            u = None if params.greedy else uniforms(state.key.unsqueeze(1), state.generated.unsqueeze(1) + levels)
            acc = accept(tree, logits, params, u, state.seen)
            kept = acc.kept_nodes(tree.tokens.shape[1])
            self.runner.commit(kept)
        with timer.phase("learn"):
            if ctx.budget:  # a step that proposed nothing has nothing to learn from
                self.proposer.observe(ctx, tree, logits, acc)
        with timer.phase("bookkeeping"):
            emitted = self._advance(state, tree, acc, decision, run)
        policy.observe(StepRecord(rows, ctx.budget, draft, kept[:, 1:], tree.tokens.shape[1], emitted, decision,
                                  timer.timing))

    def _advance(self, state: _Rows, tree: TreeBatch, acc: Acceptance, decision: BudgetDecision, run: _Run) -> int:
        """Host bookkeeping of one step: count it, append the emitted tokens, stop finished rows, move
        the state on. Returns the tokens the step emitted (all rows, before stop tokens and length cut them)."""
        rows, width = len(state.index), acc.emitted.shape[1]
        # one host transfer for the integers of the step: n_emitted, emitted tokens, verified-node count
        ints = torch.cat([acc.n_emitted, acc.emitted.flatten(), tree.valid.sum().view(1)]).tolist()
        n_emit, flat, n_verified = ints[:rows], ints[rows:-1], ints[-1]
        stats = run.stats
        stats.target_forwards += 1
        stats.row_steps += rows
        stats.verified_tokens += n_verified
        kept = n_verified - rows  # candidate nodes verified (the roots excluded)
        stats.budget_trace.append({"rows": rows, "ratio": decision.ratio, "kept": kept,
                                   "candidates": kept if decision.candidates is None else decision.candidates,
                                   "expected": decision.expected_emitted, "actual": sum(n_emit),
                                   "break_even_mat": decision.break_even_mat, "expected_mat": decision.expected_mat})
        emitted = [flat[r * width : (r + 1) * width][: n_emit[r]] for r in range(rows)]
        appended, keep = self._append(state, emitted, acc.logprobs.tolist(), run)
        self.proposer.advance(acc.emitted, appended)
        self._move_on(state, acc, keep, plain=tree.tokens.shape[1] == 1 and decision.ratio == 0.0)
        return sum(n_emit)

    def _append(self, state: _Rows, emitted: list[list[int]], lps: list[list[float]], run: _Run) -> tuple[list[int], list[int]]:
        """Append each row's emitted tokens to its completion, up to a stop token or max_new_tokens.
        Returns the tokens each row took and the rows that go on."""
        keep: list[int] = []
        appended: list[int] = []
        limit = run.params.max_new_tokens
        for r, row in enumerate(state.index):
            out = run.completions[row]
            before, done = len(out), False
            for j, token in enumerate(emitted[r][: limit - before]):
                out.append(token)
                run.logprobs[row].append(lps[r][j])
                if token in run.stop_ids:
                    run.reasons[row], done = "stop", True
                    break
            run.stats.count_emitted(len(out) - before)
            appended.append(len(out) - before)
            if not done and len(out) < limit:
                keep.append(r)
        return appended, keep

    def _move_on(self, state: _Rows, acc: Acceptance, keep: list[int], plain: bool) -> None:
        """Advance the rows' device state past the emitted tokens; drop finished rows (`keep`: the
        rows that go on); compact the KV cache. plain: the budget policy chose to decode plainly."""
        rows = torch.arange(len(state.index), device=acc.n_emitted.device)
        before_last = acc.emitted[rows, (acc.n_emitted - 2).clamp(min=0)]
        state.prev_token = torch.where(acc.n_emitted > 1, before_last, state.last_token)
        state.last_token = acc.emitted[rows, acc.n_emitted - 1]
        state.length = state.length + acc.n_emitted
        state.generated = state.generated + acc.n_emitted
        state.see(acc.emitted)
        if len(keep) < len(state.index):
            state.select(keep)
            rows_t = torch.tensor(keep, dtype=torch.long, device=state.length.device)
            self.runner.select_rows(rows_t)
            self.proposer.select_rows(rows_t)
        if state.index:
            # a plain step reads every cached slot and adds no garbage: the rejected nodes of earlier
            # trees cost each such step, so compact once at a small slack
            max_cached = int(state.length.max()) - 1
            if plain:
                self.runner.maybe_compact(max_cached, PLAIN_COMPACT_SLACK, margin=0)
            else:
                self.runner.maybe_compact(max_cached)
