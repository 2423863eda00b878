"""Replay mode: acceptance studies of retrieval proposers without running the target.

`record` runs the plain path once (`method="ar"`) and stores, for every row, the completion and
the top-k of the target's next-token distribution at every position, from one teacher-forced
forward over prompt + completion. `replay` then steps all rows of the batch at once: each row's
tree is built by a real `RetrievalProposer` exactly as the engine builds it, the walk of
`verify.accept` (`verify.walk`) runs with the recorded tokens as the target's draws, and the index
learns from the recorded distributions by the proposer's own rule (`RetrievalProposer.learn`).

**When replay is exact.** `verify.accept` walks from the root while a child carries the target's
draw, so a step's accepted length is the longest root-to-node path of the tree whose tokens equal
the tokens the target emits next; given those tokens nothing else matters. Replay builds each
tree with the engine's own proposer code, so it reproduces the engine step for step when (1) the
target's draws are the recorded tokens and (2) the index learns the same thing as in the engine:

- (1) holds at greedy (T=0): draws are argmaxes, so the engine emits exactly the recorded plain
  completion (lossless greedy). At T > 0 a sampled engine run draws another continuation, but
  every emitted token is an exact target sample whatever the trees, so recorded completions and
  engine completions have the same law, and replay statistics (MAT, histograms) are exact draws
  of the engine's statistics, not a copy of one particular seeded engine run.
- (2) is the approximation. The engine writes the distribution of **every** verified node into
  the index, rejected (off-path) nodes included. Off-path nodes have no recorded distribution
  (the plain run never saw those contexts), so replay learns only from on-path positions: the
  root and the accepted nodes of each step (none past a stop token), plus the prompt positions,
  as the engine does at `start`. `OnPathRetrievalProposer` is the engine-side twin of this rule;
  with it the engine and replay agree step for step at T=0 (`tests/test_replay.py`). With the
  engine's full rule, the off-path writes fill index rows early, and replay's MAT comes out
  lower: on the embedded tiny target, 2.07 vs 2.93 (2 prompts × 2 samples × 48 tokens, T=0, no
  prior) and 2.81 vs 3.27 (4 × 4 × 128, T=0, prior warmed for 2 rounds). They help variants
  unequally, so replay ranks variants like the engine only where they differ by more than a few
  percent (tiny target, T=0: replay has merge_decay 0.5 at 2.04 vs 0 at 2.02, the engine 2.85
  vs 2.88). At T=1, 12 seeds: replay 2.22 ± 0.01 vs the on-path engine 2.24 ± 0.01 (full: 2.97).

Float noise aside: recorded distributions come from one teacher-forced forward, the engine's from
tree-masked forwards over a KV cache (about 1e-6 apart in fp32, more in bf16, where a near-tie
can flip an argmax). The index keeps only the top-k of each distribution (k ≤ the recorded K), so
the recorded top-K holds all it learns.

Not replayed: D-cut (its choice depends on measured step times) and drafters (method "graft").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rollout_graft.config import EngineConfig, RetrievalConfig, SamplingParams
from rollout_graft.engine import RolloutEngine
from rollout_graft.proposers import RetrievalProposer, StepContext
from rollout_graft.sampling import target_probs, top_k_probs
from rollout_graft.tree import TreeBatch
from rollout_graft.verify import path_nodes, walk

FORMAT = "rollout_graft.replay/1"


@dataclass(slots=True)
class Recording:
    """One recorded rollout batch, flat over rows. A row's distributions cover positions 0..L
    (position j: the distribution of completion token j; position L: after the last token)."""

    prompt_ids: torch.Tensor  # [Σ P_g] int64 distinct prompts, concatenated
    prompt_offsets: torch.Tensor  # [groups + 1] int64
    row_group: torch.Tensor  # [rows] int64 prompt (group) of each row
    completion_ids: torch.Tensor  # [Σ L_r] int64 completions, concatenated
    completion_offsets: torch.Tensor  # [rows + 1] int64
    prompt_top_ids: torch.Tensor  # [Σ (P_g - 1), K] int32 top-K after each prompt token but the last
    prompt_top_probs: torch.Tensor  # [Σ (P_g - 1), K] float32 softmax(logits / T') (T' = T, or 1 if greedy)
    top_ids: torch.Tensor  # [Σ (L_r + 1), K] int32 top-K at each completion position
    top_probs: torch.Tensor  # [Σ (L_r + 1), K] float32 softmax(logits / T'), what the index learns from
    warped_probs: torch.Tensor  # [Σ (L_r + 1), K] float16 the sampler's law (sampling.target_probs) at top_ids
    params: SamplingParams
    model: str
    vocab: int
    finish_reasons: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.row_group.numel()

    @property
    def prompts(self) -> list[list[int]]:
        o = self.prompt_offsets.tolist()
        return [self.prompt_ids[o[g]:o[g + 1]].tolist() for g in range(len(o) - 1)]

    @property
    def completions(self) -> list[list[int]]:
        o = self.completion_offsets.tolist()
        return [self.completion_ids[o[r]:o[r + 1]].tolist() for r in range(len(o) - 1)]

    def dist_offsets(self) -> torch.Tensor:
        """[rows] first row of `top_ids` that belongs to each row (L_r + 1 positions per row)."""
        lens = self.completion_offsets.diff() + 1
        return torch.cat([lens.new_zeros(1), lens.cumsum(0)[:-1]])

    def save(self, path: str | Path) -> None:
        names = ("prompt_ids", "prompt_offsets", "row_group", "completion_ids", "completion_offsets",
                 "prompt_top_ids", "prompt_top_probs", "top_ids", "top_probs", "warped_probs")
        meta = {"format": FORMAT, "params": json.dumps(asdict(self.params)), "model": self.model,
                "vocab": str(self.vocab), "finish_reasons": json.dumps(self.finish_reasons)}
        save_file({n: getattr(self, n).contiguous() for n in names}, str(path), metadata=meta)

    @staticmethod
    def load(path: str | Path) -> Recording:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"{path} is not a replay recording (format {meta.get('format')!r}, want {FORMAT!r}); "
                                 "write one with rollout_graft_tools.replay.record or `lab/replay.py engine record`")
            t = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
        return Recording(**t, params=SamplingParams(**json.loads(meta["params"])), model=meta["model"],
                         vocab=int(meta["vocab"]), finish_reasons=json.loads(meta["finish_reasons"]))


# ---------------------------------------------------------------------- record
@torch.inference_mode()
def teacher_forced_topk(model, ids: list[int], params: SamplingParams, k: int):
    """One forward over `ids`: for every position, the top-k of softmax(logits / T') as the index
    learns it (`sampling.top_k_probs`: ids int32, probs float32) and the sampler's warped
    probability of those ids (float16). [len(ids), k] each."""
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0]
    top_p, top_i = top_k_probs(logits, k, params.temperature)
    warped = target_probs(logits, params).gather(-1, top_i)
    return top_i.int().cpu(), top_p.cpu(), warped.half().cpu()


def _offsets(seqs: list[list[int]]) -> torch.Tensor:
    return torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)


def record(model, tokenizer, prompts: list, group: int, params: SamplingParams, path: str | Path | None = None,
           top_k: int = 8) -> Recording:
    """Run the plain path once on `prompts` × `group` samples and record what replay needs.

    prompts: token-id lists, or strings (tokenized without special tokens). top_k: successors
    stored per position; must be ≥ the `RetrievalConfig.top_k` of the replays. Saves to `path`
    (.safetensors) when given.
    """
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] if isinstance(p, str) else list(p) for p in prompts]
    if top_k < 1 or group < 1 or not prompts:
        raise ValueError("record needs at least one prompt, group >= 1 and top_k >= 1")
    rows = [p for p in prompts for _ in range(group)]
    out = RolloutEngine(model, EngineConfig(method="ar"), tokenizer=tokenizer).generate(rows, params)
    p_ids, p_probs, ids, probs, warped = [], [], [], [], []
    for r, (prompt, completion) in enumerate(zip(rows, out.completion_ids)):
        i, p, w = teacher_forced_topk(model, prompt + completion, params, top_k)
        start = len(prompt) - 1  # position of the last prompt token: the distribution of completion[0]
        if r % group == 0:
            p_ids.append(i[:start])
            p_probs.append(p[:start])
        ids.append(i[start:])
        probs.append(p[start:])
        warped.append(w[start:])
    rec = Recording(
        prompt_ids=torch.tensor([t for p in prompts for t in p], dtype=torch.long), prompt_offsets=_offsets(prompts),
        row_group=torch.arange(len(prompts)).repeat_interleave(group),
        completion_ids=torch.tensor([t for c in out.completion_ids for t in c], dtype=torch.long),
        completion_offsets=_offsets(out.completion_ids),
        prompt_top_ids=torch.cat(p_ids), prompt_top_probs=torch.cat(p_probs),
        top_ids=torch.cat(ids), top_probs=torch.cat(probs), warped_probs=torch.cat(warped),
        params=params, model=str(getattr(model, "name_or_path", "") or type(model).__name__),
        vocab=model.get_output_embeddings().weight.shape[0], finish_reasons=list(out.finish_reasons),
    )
    if path is not None:
        rec.save(path)
    return rec


# ---------------------------------------------------------------------- replay
class OnPathRetrievalProposer(RetrievalProposer):
    """RetrievalProposer that learns only from on-path nodes (root + accepted, none after a stop
    token): replay's learning rule, to run in the engine (`RolloutEngine(..., proposer=...)`) when
    checking replay against it, or to measure what the off-path writes are worth."""

    def __init__(self, cfg: RetrievalConfig, vocab: int, device: torch.device | str, stop_ids=()):
        super().__init__(cfg, vocab, device)
        self.stop_ids = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=self.device)

    def observe(self, ctx, tree, logits, acceptance) -> None:
        path = acceptance.path  # [rows, D+1]; slot j >= 1 carries emitted token j - 1
        stops = torch.isin(acceptance.emitted, self.stop_ids).long().cumsum(1)  # [rows, D+1]
        after_stop = torch.cat([torch.zeros_like(stops[:, :2]), stops[:, :-2]], 1) > 0  # a stop was emitted before
        nodes = path_nodes(path.masked_fill(after_stop, -1), tree.tokens.shape[1])  # [rows, n]
        top_p, top_i = top_k_probs(logits[nodes], self.index.k, self.temperature)
        self.learn(tree, nodes, ctx.prev_token, top_i, top_p)


@dataclass(slots=True)
class ReplayResult:
    """MAT = emitted tokens / row-steps (bonus included), as `RolloutStats.mean_accepted_tokens`."""

    steps: int  # batch steps = target forwards the engine would run
    row_steps: int
    emitted_tokens: int
    verified_tokens: int  # Σ tree nodes incl. roots
    accept_hist: list[int]  # accept_hist[a]: row-steps that emitted a accepted + 1 bonus token
    row_emitted: list[list[int]]  # per row, tokens emitted at each of its steps (after stop truncation)

    @property
    def mean_accepted_tokens(self) -> float:
        return self.emitted_tokens / max(self.row_steps, 1)

    @property
    def verify_tokens_per_step(self) -> float:
        return self.verified_tokens / max(self.steps, 1)

    def as_dict(self) -> dict:
        return {"mat": self.mean_accepted_tokens, "target_forwards": self.steps, "row_steps": self.row_steps,
                "tokens": self.emitted_tokens, "verify_tokens_per_step": self.verify_tokens_per_step,
                "accept_hist": list(self.accept_hist),
                "row_mat": [sum(e) / len(e) for e in self.row_emitted], "row_steps_each": [len(e) for e in self.row_emitted]}


def _as_config(config: EngineConfig | RetrievalConfig | None) -> EngineConfig:
    if isinstance(config, EngineConfig):
        if config.group_lead:
            raise ValueError("replay steps every row at once: set group_lead=0 (staggered waves are not replayed)")
        if config.method != "retrieval" or config.budget_policy != "fixed":
            raise ValueError(f"replay covers method='retrieval' with budget_policy='fixed', got method={config.method!r}, "
                             f"budget_policy={config.budget_policy!r}: D-cut needs step times, graft a drafter")
        return config
    return EngineConfig(method="retrieval", retrieval=config or RetrievalConfig())


@torch.inference_mode()
def replay(recording: Recording | str | Path, config: EngineConfig | RetrievalConfig | None = None,
           proposer: RetrievalProposer | None = None, device: str | torch.device = "cpu") -> ReplayResult:
    """Replay a retrieval proposer against a recording (see the module docstring for exactness).

    config: an `EngineConfig` (method "retrieval"; its budget and max_depth apply) or just the
    `RetrievalConfig` (engine defaults otherwise). proposer: reuse one across replays so that its
    global prior carries over, as it does across `generate` calls (default: a fresh one).
    """
    rec = recording if isinstance(recording, Recording) else Recording.load(recording)
    cfg = _as_config(config)
    if rec.top_ids.shape[1] < cfg.retrieval.top_k:
        raise ValueError(f"the recording stores {rec.top_ids.shape[1]} successors per position but the index keeps "
                         f"top_k={cfg.retrieval.top_k}: record with top_k >= {cfg.retrieval.top_k}")
    dev = torch.device(device)
    params = rec.params
    proposer = proposer or RetrievalProposer(cfg.retrieval, rec.vocab, dev)
    group = rec.row_group.to(dev)
    prompts = rec.prompts
    proposer.start(prompts, group, None, params)
    k = proposer.index.k  # the index keeps the top k ≤ K of each recorded distribution
    proposer.learn_prompts(prompts, group, rec.prompt_top_ids[:, :k].long().to(dev), rec.prompt_top_probs[:, :k].to(dev))

    completions = rec.completions
    lens = torch.tensor([len(c) for c in completions], device=dev)  # [rows]
    width = int(lens.max()) + cfg.max_depth + 2
    cont = torch.full((rec.rows, width), -1, dtype=torch.long, device=dev)  # [rows, width] recorded tokens, -1 after
    for r, c in enumerate(completions):
        cont[r, : len(c)] = torch.tensor(c, device=dev)
    dist0 = rec.dist_offsets().to(dev)  # [rows]
    top_ids, top_probs = rec.top_ids[:, :k].long().to(dev), rec.top_probs[:, :k].to(dev)
    slot = torch.arange(cfg.max_depth + 1, device=dev).view(1, -1)

    active = torch.arange(rec.rows, device=dev)  # original row of each active row
    last = torch.tensor([prompts[g][-1] for g in rec.row_group.tolist()], device=dev)
    prev = torch.tensor([prompts[g][-2] if len(prompts[g]) > 1 else -1 for g in rec.row_group.tolist()], device=dev)
    length = torch.tensor([len(prompts[g]) for g in rec.row_group.tolist()], device=dev)
    done = torch.zeros(rec.rows, dtype=torch.long, device=dev)  # completion tokens emitted so far
    out = ReplayResult(0, 0, 0, 0, [0] * (cfg.max_depth + 1), [[] for _ in range(rec.rows)])
    while active.numel():
        g, n_rows = done[active], active.numel()
        ctx = StepContext(last_token=last, length=length, group=group[active], remaining=params.max_new_tokens - g,
                          budget=cfg.budget, prev_token=prev)
        tree = TreeBatch.from_draft(last, proposer.propose(ctx))
        # the target's draw at level l of the walk is the recorded token g + l (-1 past the end: no match)
        emit = cont[active].gather(1, g.view(-1, 1) + slot)  # [rows, D+1]
        path, _ = walk(tree, lambda level, cur: emit[:, level], min(tree.max_depth, cfg.max_depth))  # [rows, ≤ D+1]
        accepted = (path >= 0).sum(1) - 1  # [rows] (≤ tokens left: no node matches past the end)
        emitted = torch.minimum(accepted + 1, lens[active] - g)  # the engine stops at the stop token

        # learn from the on-path nodes (root + accepted) with their recorded distributions; node indices
        # grow along a path, so the path's row-major order is the nodes' order `learn` expects
        pos = dist0[active].view(-1, 1) + g.view(-1, 1) + slot[:, : path.shape[1]]  # [rows, ≤ D+1]
        proposer.learn(tree, path_nodes(path, tree.tokens.shape[1]), prev, top_ids[pos[path >= 0]], top_probs[pos[path >= 0]])

        out.steps += 1
        out.row_steps += n_rows
        out.verified_tokens += int(tree.valid.sum())
        for r, e in zip(active.tolist(), emitted.tolist()):
            out.row_emitted[r].append(e)
            out.accept_hist[e - 1] += 1
        out.emitted_tokens += int(emitted.sum())

        rows = torch.arange(n_rows, device=dev)
        proposer.advance(emit, emitted.tolist())
        prev = torch.where(accepted > 0, emit[rows, (accepted - 1).clamp(min=0)], last)
        last = emit[rows, accepted]
        length, done[active] = length + accepted + 1, g + emitted
        keep = torch.nonzero(done[active] < lens[active]).flatten()
        if keep.numel() < n_rows:
            active, last, prev, length = active[keep], last[keep], prev[keep], length[keep]
            proposer.select_rows(keep)
    return out
