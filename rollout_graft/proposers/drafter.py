"""Drafter trees from a small LM with the target's tokenizer (DESIGN.md §2 step 1), EAGLE-2-style.

The draft model runs in its own `ModelRunner` (the same class as the target's), whose KV cache
holds every committed token except a short per-row *pending* list: the tokens emitted since the
last `propose` (at the start, the last prompt token; after steps D-cut decoded plainly, every token
they emitted — of which a proposal feeds the last FEED_WINDOW). A step:

1. feeds the pending tokens as one causal block (their KV stays) — the logits at the last one,
   the root, give the root's children: level 0 = top-k of the drafter's distribution;
2. expands level by level in one batched forward per level: the `beam` nodes of the newest level
   with the highest cumulative confidence each get their top-k children. Every query sees the
   committed cache plus its own ancestors' slots of the earlier levels (`past_extra`); those
   scratch slots are cut off the cache once the tree is built;
3. at checkpoint levels, a caller-supplied rule may stop a row's tree (calibrated pruning).

confidence(node) = q(token | path) from the drafter (softmax at the sampling temperature, warped
like the target's); score(node) = Π confidence along the path from the root (prefix product).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from ..config import DraftConfig, SamplingParams
from ..files import local_dir
from ..runner import ModelRunner
from ..sampling import warp_logits
from ..selection import keep_best
from ..tree import DRAFT, Draft
from .base import Proposer, StepContext

FEED_WINDOW = 64
"""Pending tokens a proposal feeds at most. After more plain steps without a proposal than this (D-cut
waiting for an affordable probe), the drafter's cache skips the older ones: its next drafts see the
prompt, the text up to the last proposal and the last FEED_WINDOW tokens (drafts may be a little
worse; the output law does not change, the target verifies every token). Catching up a long plain
stretch in full would cost a share of the skipped steps that no wait between probes could shrink."""

StopRule = Callable[[int, torch.Tensor], torch.Tensor]
"""(checkpoint index, best cumulative confidence [rows]) → [rows] bool: stop this row's tree here."""


@dataclass(slots=True)
class Expansion:
    """Every node the drafter expanded this step, in level order (parents precede children)."""

    nodes: Draft  # [rows, m] all expanded nodes, source DRAFT
    stage: torch.Tensor  # [rows] int64 checkpoint index where the row stopped; n_checkpoints = never
    best: torch.Tensor  # [rows, n_checkpoints] best cumulative confidence at each checkpoint level (0 if not reached)


def load_draft_model(draft: str | Path | PreTrainedModel, device: torch.device, dtype: torch.dtype):
    """(model, tokenizer or None) from a local directory, or (model, None) for a loaded model.

    ValueError for weights that would draft garbage: tensors missing from the checkpoint
    (transformers initialises them at random) or NaN/inf values."""
    if isinstance(draft, PreTrainedModel):
        check_finite_weights(draft, "the draft model passed in")
        return draft.eval(), None
    from transformers import AutoTokenizer

    local_dir(draft, "the draft model's")  # never the hub: a missing directory says so
    model, info = AutoModelForCausalLM.from_pretrained(draft, dtype=dtype, output_loading_info=True, local_files_only=True)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ValueError(f"the draft model in {draft} lacks {len(missing)} weight tensor(s), e.g. {missing[:3]}: "
                         "transformers would initialise them at random and every draft would be rejected; "
                         "save the complete drafter there (model.save_pretrained)")
    check_finite_weights(model, f"the draft model in {draft}")
    model = model.to(device).eval()
    if model.device.type == "cpu":
        # the weights may still be memory-mapped from the checkpoint: a job that rewrites the
        # directory in place (a drafter refresh, `GraftConfig.draft_reload_steps`) would then crash
        # this process with SIGBUS. Own copies cost the drafter's size once.
        with torch.no_grad():
            for tensor in (*model.parameters(), *model.buffers()):
                tensor.data = tensor.data.clone()
    try:
        tokenizer = AutoTokenizer.from_pretrained(draft, local_files_only=True)
    except (OSError, ValueError):  # a model directory without tokenizer files
        tokenizer = None
    return model, tokenizer


def check_finite_weights(model: PreTrainedModel, what: str) -> None:
    """ValueError when a parameter or buffer holds NaN/inf (e.g. a checkpoint with a valid header
    and corrupt data): such a drafter loads, then drafts nothing the target accepts."""
    with torch.no_grad():
        for name, tensor in model.named_parameters():  # not buffers: some models keep -inf masks there
            if not torch.isfinite(tensor).all():
                raise ValueError(f"{what} holds NaN/inf values in {name!r}: the checkpoint is corrupt or was "
                                 "saved after training diverged; save a healthy drafter and load it again")


def check_same_vocabulary(target_vocab: int, draft_vocab: int, target_tokenizer=None, draft_tokenizer=None) -> None:
    """ValueError unless the drafter's token ids mean what the target's mean."""
    fix = "use a draft model trained with the target's tokenizer (e.g. a smaller model of the same family)"
    if target_vocab != draft_vocab:
        raise ValueError(f"the draft model's vocabulary has {draft_vocab} entries but the target's has "
                         f"{target_vocab}: draft tokens are verified by id, so {fix}")
    if target_tokenizer is None or draft_tokenizer is None:
        return
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if t_vocab != d_vocab:
        differ = sorted(t for t in t_vocab.keys() | d_vocab.keys() if t_vocab.get(t) != d_vocab.get(t))
        raise ValueError(f"the draft model's tokenizer maps {len(differ)} tokens differently from the target's "
                         f"(e.g. {differ[:3]}): {fix}")
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        if getattr(target_tokenizer, name, None) != getattr(draft_tokenizer, name, None):
            raise ValueError(f"the draft tokenizer's {name} differs from the target's: {fix}")


class DrafterProposer(Proposer):
    """Dense drafter trees: `propose` keeps the `budget` best nodes of the expanded tree.

    Args:
        cfg: `DraftConfig` (top_k, beam, depth).
        runner: a `ModelRunner` over the draft model (never the target's runner).
        max_depth: the engine's deepest acceptable node.
    """

    def __init__(self, cfg: DraftConfig, runner: ModelRunner, max_depth: int):
        self.cfg = cfg
        self.runner = runner
        self.max_depth = max_depth
        self.params = SamplingParams()
        # tokens not yet in the draft cache, as the steps emitted them: ([rows, T] tokens, host counts)
        # per step since the last propose; the last pending token of a row is its root
        self.pending: list[tuple[torch.Tensor, list[int]]] = []
        self._prompts: list[list[int]] = []
        self._row_prompt: torch.Tensor | None = None  # [rows] prompt of each row until the prompts are prefilled

    # ------------------------------------------------------------------ lifecycle
    def start(self, prompts, row_prompt, prompt_logits, params: SamplingParams) -> None:
        """The prompts are prefilled at the first proposal: a rollout D-cut decodes plainly
        throughout never runs the drafter."""
        self.params = params
        self.runner.release()
        dev = self.runner.device
        self._prompts, self._row_prompt = prompts, row_prompt.to(dev)  # until the prefill
        last = torch.tensor([[prompts[g][-1]] for g in row_prompt.tolist()], dtype=torch.long, device=dev)
        self.pending = [(last, [1] * len(row_prompt))]

    def advance(self, emitted: torch.Tensor, n_emitted: list[int]) -> None:
        """The emitted tokens (accepted candidates + bonus/recovered) become pending. Steps D-cut
        decoded plainly (no `propose`) only add to the list: the next `propose` feeds them all in
        one forward."""
        self.pending.append((emitted, list(n_emitted)))

    def select_rows(self, rows: torch.Tensor) -> None:
        rows = rows.to(self.runner.device)
        if self._row_prompt is None:
            self.runner.select_rows(rows)
        else:  # not prefilled yet
            self._row_prompt = self._row_prompt.index_select(0, rows)
        if len(self.pending) > 1:  # one block, so the next selections index one tensor
            self.pending = [self._pending_block(right=False)]
        keep = rows.tolist()
        self.pending = [(t.index_select(0, rows.to(t.device)), [c[i] for i in keep]) for t, c in self.pending]

    def propose(self, ctx: StepContext) -> Draft:
        nodes = self.expand(ctx).nodes
        return keep_best(nodes, torch.full_like(ctx.last_token, ctx.budget))

    # ------------------------------------------------------------------ drafting
    def _confidence(self, logits: torch.Tensor) -> torch.Tensor:
        """Drafter probabilities [..., V] at the sampling temperature (T=1 when greedy)."""
        if self.params.greedy:
            return logits.float().softmax(-1)
        return warp_logits(logits, self.params).softmax(-1)

    def _feed_pending(self, ctx: StepContext) -> torch.Tensor:
        """Cache the pending tokens (a causal block per row; after a long plain stretch only the
        last FEED_WINDOW of them), prefilling the prompts first at a rollout's first proposal;
        returns the root logits [rows, V]."""
        if self._row_prompt is not None:
            self.runner.prefill([p[:-1] for p in self._prompts], self._row_prompt)
            self._row_prompt = None
        block, _ = self._pending_block()
        rows, width = block.shape
        dev = self.runner.device
        j = torch.arange(width, device=dev)
        real = block >= 0  # [rows, P] right-aligned: every root in the last column
        positions = ((ctx.length.to(dev) - width).view(-1, 1) + j).clamp(min=0)  # the root sits at length - 1
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        mask = (causal & real.unsqueeze(1)) | torch.eye(width, dtype=torch.bool, device=dev)  # padding sees itself
        logits = self.runner.verify(block.clamp(min=0), positions, mask)  # [rows, P, V]
        self.runner.commit(real)
        self.pending = []
        return logits[:, -1]

    def _pending_block(self, right: bool = True) -> tuple[torch.Tensor, list[int]]:
        """The last ≤ FEED_WINDOW pending tokens of each row as one block [rows, P] (-1 = none),
        right-aligned (every root in the last column) or left-aligned (a pending part), and their
        counts (host ints)."""
        dev = self.runner.device
        totals = [sum(c) for c in zip(*(n for _, n in self.pending))]
        kept = [min(t, FEED_WINDOW) for t in totals]
        width = max(kept)
        # where each row's first pending token would go; tokens before the window land left of 0
        first = [(width if right else k) - t for t, k in zip(totals, kept)]
        block = torch.full((len(totals), width + 1), -1, dtype=torch.long, device=dev)  # + a spare column
        offset = torch.tensor(first, dtype=torch.long, device=dev).view(-1, 1)
        for tokens, n in self.pending:
            count = torch.tensor(n, dtype=torch.long, device=dev).view(-1, 1)
            j = torch.arange(tokens.shape[1], device=dev).view(1, -1)
            at = offset + j
            block.scatter_(1, torch.where((j < count) & (at >= 0), at, width), tokens.to(dev))  # else: the spare column
            offset = offset + count
        return block[:, :width], kept

    def expand(self, ctx: StepContext, stop: StopRule | None = None) -> Expansion:
        """Grow every row's tree level by level; `stop` may end a row's tree at a checkpoint."""
        cfg, dev = self.cfg, self.runner.device
        rows = ctx.last_token.shape[0]
        limit = (ctx.remaining.to(dev) - 1).clamp(0, self.max_depth)  # [rows] deepest useful node depth
        # a row keeps at most `budget` nodes, ancestor-closed: no kept node lies deeper than that
        levels = min(cfg.depth, int(limit.max()), ctx.budget)
        stage = torch.full((rows,), len(cfg.checkpoints), dtype=torch.long, device=dev)
        best = torch.zeros(rows, len(cfg.checkpoints), device=dev)
        active = torch.ones(rows, dtype=torch.bool, device=dev)
        root_logits = self._feed_pending(ctx)
        scratch = self.runner.slots  # tree slots appended from here on are cut off at the end
        found: list[_Level] = []
        lvl = self._root_children(root_logits) if levels else None
        for level in range(levels):
            lvl.score = lvl.score.masked_fill(~(active & (level < limit)).view(-1, 1), 0.0)
            found.append(lvl)
            if level in cfg.checkpoints:
                c = cfg.checkpoints.index(level)
                best[:, c] = lvl.score.max(1).values
                if stop is not None:
                    stopped = active & stop(c, best[:, c])
                    stage[stopped] = c
                    active &= ~stopped
            if level + 1 == levels or not bool(((lvl.score > 0).any(1) & active).any()):
                break
            offset = sum(f.tokens.shape[1] for f in found[:-1])  # index of this level's first node
            lvl = self._children(lvl, level, offset, ctx, scratch)
        self.runner.truncate(scratch)
        self.runner.maybe_compact(int(self.runner.slot_valid.sum(1).max()))
        return Expansion(_as_draft(found, rows, dev), stage, best)

    def _root_children(self, root_logits: torch.Tensor) -> "_Level":
        conf, tok = self._confidence(root_logits).topk(self.cfg.top_k, dim=-1)  # [rows, k]
        sees = torch.zeros(*tok.shape, 0, dtype=torch.bool, device=tok.device)  # nothing forwarded yet
        return _Level(tok, conf, torch.full_like(tok, -1), sees)

    def _children(self, lvl: "_Level", level: int, offset: int, ctx: StepContext, scratch: int) -> "_Level":
        """One draft forward over the `beam` best nodes of `lvl` (tree level `level`) → their top-k children."""
        rows, k = lvl.tokens.shape[0], self.cfg.top_k
        f_score, f_idx = lvl.score.topk(min(self.cfg.beam, lvl.score.shape[1]), dim=1)  # [rows, b] the frontier
        b, dev = f_idx.shape[1], f_idx.device
        f_tok = lvl.tokens.gather(1, f_idx)
        f_sees = lvl.sees.gather(1, f_idx.unsqueeze(-1).expand(-1, -1, lvl.sees.shape[2]))
        # each frontier node sees the committed cache, its ancestors' scratch slots and itself
        past_extra = torch.cat([torch.zeros(rows, b, scratch, dtype=torch.bool, device=dev), f_sees], 2)
        eye = torch.eye(b, dtype=torch.bool, device=dev).expand(rows, b, b)
        positions = (ctx.length.to(dev) + level).view(-1, 1).expand(rows, b)  # root at length - 1, depth level + 1
        logits = self.runner.verify(f_tok, positions, eye, past_extra=past_extra)  # [rows, b, V]
        conf, tok = self._confidence(logits).topk(k, dim=-1)  # [rows, b, k]
        return _Level(
            tokens=tok.view(rows, b * k),
            score=(f_score.unsqueeze(-1) * conf).view(rows, b * k),  # prefix product
            parent=(offset + f_idx).repeat_interleave(k, dim=1),
            sees=torch.cat([f_sees, eye], 2).repeat_interleave(k, dim=1),  # the parent's view + its own slot
        )


@dataclass(slots=True)
class _Level:
    """The candidate nodes of one tree level, for every row."""

    tokens: torch.Tensor  # [rows, w]
    score: torch.Tensor  # [rows, w] prefix product of drafter confidences, 0 = not a node
    parent: torch.Tensor  # [rows, w] index of the parent among all nodes (levels concatenated), -1 = root
    sees: torch.Tensor  # [rows, w, scratch] scratch slots of the node's ancestors that were forwarded


def _as_draft(levels: list[_Level], rows: int, device: torch.device) -> Draft:
    """Concatenate the levels (parents precede children) into one Draft of source DRAFT."""
    if not levels:
        return Draft.empty(rows, device)
    tokens = torch.cat([lvl.tokens for lvl in levels], 1)
    score = torch.cat([lvl.score for lvl in levels], 1)
    depth = torch.cat([torch.full_like(lvl.tokens, d + 1) for d, lvl in enumerate(levels)], 1)
    return Draft(tokens, torch.cat([lvl.parent for lvl in levels], 1), depth, score > 0, score,
                 torch.full_like(tokens, DRAFT, dtype=torch.int8))
