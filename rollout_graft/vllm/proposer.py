"""`RLDraftProposer`: our RL draft sources and budget policy behind vLLM's `custom_class` hook.

Each step vLLM calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` with one row
per request of its persistent batch and takes back one draft chain per row, which its rejection
sampler verifies losslessly (drafts without draft probabilities: exact at any temperature). A
step here:

    rows → requests and groups (`groups.RequestTracker`, from the text alone)
         → learn   (what the last drafts earned: acceptance for D-cut's calibration and counters;
                    the new tokens extend the group's text and teach the global prior)
         → draft   (each request: the continuation of its longest suffix match in its group's
                    text — siblings, prompt, a previous epoch's completions — extended from the
                    global adjacency prior)
         → cut     (D-cut: one batch-wide budget of draft tokens, a depth per request)

The step time vLLM spends around us (schedule, forward, sample) is measured between calls and
fitted by the budget policy, which is the engine's interface over chains (`chain_budget`): each
step `plan` (how deep to draft; 0: not at all), `cut` (the depths verified) and, at the next call,
`observe` (what the step verified, accepted and took: `_observe`).

Cost per step: numpy over the batch for finding requests, acceptance, scores and the prior (its
update, `teach_prior`, and its chains, `prior_chain`: `AdjacencyIndex.update_topk` and `lookup` for
this case without torch's fixed cost per call); Python per row only for extending its text's
n-gram index and its suffix match (dict walks of a few n-grams each), never a pass over a row's
history. `scripts/profile_vllm_proposer.py` measures it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..adjacency import EMPTY, AdjacencyIndex
from ..budget import FixedBudget
from ..chain_budget import ChainDCut, Chains, ChainStep
from .config import PROPOSER_CLASS, ChainConfig
from .groups import Request, RequestTracker

@dataclass
class ProposerStats:
    """Counters since the proposer was built (`RLDraftProposer.stats`). drafts / draft_tokens /
    accepted_tokens count what vLLM verified (a draft is counted when its request's next step
    shows how much of it was accepted), as vLLM's spec-decode counters do."""

    steps: int = 0  # propose calls
    rows: int = 0  # request-steps seen (rows that sampled)
    drafts: int = 0  # verified drafts (requests with ≥ 1 draft token)
    draft_tokens: int = 0  # verified draft tokens
    accepted_tokens: int = 0  # accepted draft tokens
    proposed_tokens: int = 0  # draft tokens found before the budget cut
    kept_tokens: int = 0  # draft tokens returned to vLLM
    plain_steps: int = 0  # steps where drafts existed but the budget kept none
    propose_s: float = 0.0  # time spent in propose
    step_s: float = 0.0  # time between propose calls (vLLM's steps, idle gaps excluded)

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens emitted per request-step (1 = plain decoding)."""
        return 1.0 + self.accepted_tokens / max(self.rows, 1)


class RLDraftProposer:
    """vLLM `custom_class` proposer (build its config with `rollout_graft.vllm.speculative_config`)."""

    config = ChainConfig()
    plain_when_undrafted = True  # a step where no request drafted takes vLLM's plain sampler (`plugin`)

    def __init__(self, vllm_config):
        from . import plugin

        plugin.apply()  # exact rejection sampling on vLLM's CPU backend; the plain path for undrafted steps
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.vocab = vllm_config.model_config.get_vocab_size()
        cfg = self.config
        self.tracker = RequestTracker(cfg.min_match, cfg.max_match, cfg.recall, cfg.recall_prompts,
                                      occurrences=cfg.occurrences, tail=cfg.identity_tokens)
        self.policy = (ChainDCut(self.k, cfg.explore_every, probe_share=cfg.probe_share) if cfg.budget_policy == "dcut"
                       else FixedBudget(self.k))
        self.prior = AdjacencyIndex.empty(1, self.vocab, cfg.prior_successors) if cfg.use_prior else None
        if cfg.use_prior and cfg.prior_path:
            self.load_prior(cfg.prior_path)
        self.stats = ProposerStats()
        self._last_start: float | None = None  # start of the last propose call (a step's time runs start to start)
        self._pending: ChainStep | None = None  # the step now running (completed at the next call)

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's CPU runner hands every drafter the target model; ours needs none."""

    # ------------------------------------------------------------------ the step
    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings=None) -> list[list[int]]:
        start = time.perf_counter()
        reqs = self.tracker.rows(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        active = [reqs[i] for i in self.tracker.active.tolist()]
        verified, accepted = self._learn(active, token_ids_cpu)
        self._observe(start, len(active), verified, accepted)
        self._last_start = start
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        planned, drafted, decision = self.policy.plan(len(active)), 0, None
        draft_start = time.perf_counter()
        if planned:
            draft = self._draft(active)
            chains, decision = self.policy.cut(draft)
            for i, req, tokens, scores in zip(self.tracker.active.tolist(), active, chains.tokens, chains.scores):
                if tokens:
                    req.draft, req.draft_scores = tokens, scores[: len(tokens)]
                    out[i] = tokens
                    drafted += len(tokens)
            proposed = int(draft.depths.sum())
            self.stats.proposed_tokens += proposed
            self.stats.kept_tokens += drafted
            self.stats.plain_steps += int(proposed > 0 and drafted == 0)
        draft_ms = 1000.0 * (time.perf_counter() - draft_start)
        self._pending = ChainStep(rows=len(active), planned=planned, drafted=drafted, draft_ms=draft_ms,
                                  decision=decision, verified=None, ms=None, emitted=0)  # completed by `_observe`
        self.stats.steps += 1
        self.stats.propose_s += time.perf_counter() - start
        return out

    def _observe(self, now: float, rows: int, verified: tuple | None, accepted: int) -> None:
        """The budget policy learns from the step since the last call, which verified the drafts
        returned then: what they earned (`verified`: raw scores, depths and accepted tokens of the
        rows that drafted) and its time (from the last call's start: our own time included, a
        draft's cost is also ours) — not timed if it also prefilled (a new request) or is the first."""
        step = self._pending
        if step is None:
            return
        step.verified, step.emitted = verified, step.rows + accepted
        if self._last_start is not None and not self.tracker.created:
            step.ms = 1000.0 * (now - self._last_start)
            self.stats.step_s += step.ms / 1000.0
        self.policy.observe(step)

    def _learn(self, reqs: list[Request], token_ids: np.ndarray) -> tuple[tuple | None, int]:
        """Acceptance of the drafts returned last step, and the new tokens into the prior (numpy over
        the batch; a Python pass only over the rows that drafted). Returns the acceptance for the
        policy (raw scores [n, depth], depths [n], accepted [n]; None when nothing was drafted) and
        the draft tokens the step accepted."""
        tr = self.tracker
        self.stats.rows += len(reqs)
        drafted = [j for j, req in enumerate(reqs) if req.draft]
        acceptance, accepted_total = None, 0
        if drafted:
            depths = np.array([len(reqs[j].draft) for j in drafted])
            accepted = tr.lens[drafted] - 1
            scores = np.zeros((len(drafted), int(depths.max())))
            for row, j in enumerate(drafted):
                req = reqs[j]
                scores[row, : len(req.draft_scores)] = req.draft_scores
                req.draft = []
            acceptance = (scores, depths, accepted)
            accepted_total = int(accepted.sum())
            self.stats.drafts += len(drafted)
            self.stats.draft_tokens += int(depths.sum())
            self.stats.accepted_tokens += accepted_total
        if self.prior is not None and len(tr.flat):
            # (token before, token) for each new token: the first one's predecessor is the row's
            # last committed token (the tracker matched it to the request's text)
            starts = np.cumsum(tr.lens) - tr.lens
            before = tr.num - tr.lens
            prev = np.empty_like(tr.flat)
            prev[1:] = tr.flat[:-1]
            prev[starts] = token_ids[tr.active, np.maximum(before - 1, 0)]
            keep = np.ones(len(prev), dtype=bool)
            keep[starts[before == 0]] = False  # an empty prompt: its first token has no predecessor
            self._teach_prior(prev[keep], tr.flat[keep])
        return acceptance, accepted_total

    def _teach_prior(self, prev_tok: np.ndarray, next_tok: np.ndarray) -> None:
        teach_prior(self.prior, prev_tok, next_tok, self.config.prior_decay)

    def _draft(self, reqs: list[Request]) -> Chains:
        """One chain per request and the raw score of each token ([rows, k], 0 past a chain's end):
        suffix-match tokens score (n / (n + 1))^depth for a match of n tokens, prior tokens the
        prior's confidence (`prior_chain`), multiplied along the chain (D-cut calibrates them
        against acceptance). The
        suffix match is one dict walk per request (`TextIndex.match`); the scores and the prior's
        extension are numpy over the batch."""
        room = self._room(self.tracker.num)
        shared = self.config.share_in_group
        chains: list[list[int]] = []
        matched = np.zeros(len(reqs))
        for j, (req, r) in enumerate(zip(reqs, room.tolist())):
            if r <= 0:
                chains.append([])
                continue
            match = req.group.index.match(req.text_id, r, shared=shared)
            chains.append(match.chain)
            matched[j] = match.length
        have = np.fromiter(map(len, chains), dtype=np.int64, count=len(chains))
        conf = matched / (matched + 1.0)
        scores = conf.reshape(-1, 1) ** np.arange(1, self.k + 1)
        scores[np.arange(self.k) >= have.reshape(-1, 1)] = 0.0
        if self.prior is not None:
            self._extend_from_prior(chains, scores, have, room)
        return Chains(chains, scores)

    def _extend_from_prior(self, chains: list[list[int]], scores: np.ndarray, have: np.ndarray, room: np.ndarray) -> None:
        """Chains shorter than their room continue with the prior's most likely successors (its greedy
        chain, `prior_chain`), their weights multiplied into the scores."""
        todo = np.flatnonzero(have < room)
        if not len(todo):
            return
        tr = self.tracker
        last = tr.flat[np.cumsum(tr.lens) - 1]  # each row's last token
        roots = np.array([chains[j][-1] if chains[j] else last[j] for j in todo.tolist()], dtype=np.int64)
        tokens, score, lengths = prior_chain(self.prior, roots, self.k)
        h = have[todo]
        add = np.minimum(room[todo] - h, lengths)
        for j, row, a in zip(todo.tolist(), tokens.tolist(), add.tolist()):
            chains[j].extend(row[:a])
        base = np.where(h > 0, scores[todo, np.maximum(h - 1, 0)], 1.0)
        src = np.arange(self.k) - h.reshape(-1, 1)  # column → position in the prior's chain
        put = (src >= 0) & (src < add.reshape(-1, 1))
        r, c = np.nonzero(put)
        scores[todo[r], c] = base[r] * score[r, src[r, c]].astype(np.float64)

    def _room(self, length: np.ndarray) -> np.ndarray:
        """Draft tokens each request may take: the depth, and the context left (vLLM's max_model_len)."""
        return np.minimum(self.k, self.max_model_len - length - 1)

    # ------------------------------------------------------------------ state
    def summary(self) -> dict:
        """Counters, plus why the budget policy verifies what it verifies."""
        return {**asdict(self.stats), "mean_accepted_tokens": self.stats.mean_accepted_tokens,
                "policy": self.policy.explain()}

    def save_state(self, directory: str | Path) -> None:
        """Write the prior (`prior.safetensors`, the engine's format) and the remembered
        completions per prompt (`recall.json`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.prior is not None:
            self.prior.save(directory / "prior.safetensors")
        groups = [{"prompt": g.prompt, "completions": g.completions()[-self.config.recall :]}
                  for g in self.tracker.groups.values()] if self.config.recall else []
        (directory / "recall.json").write_text(json.dumps(groups))

    def load_state(self, directory: str | Path) -> None:
        """Restore what `save_state` wrote (missing files are skipped)."""
        directory = Path(directory)
        if self.prior is not None and (directory / "prior.safetensors").exists():
            self.load_prior(directory / "prior.safetensors")
        if (directory / "recall.json").exists():
            self.tracker.restore([(g["prompt"], g["completions"]) for g in json.loads((directory / "recall.json").read_text())])

    def load_prior(self, path: str | Path) -> None:
        prior = AdjacencyIndex.load(path)
        if prior.vocab != self.vocab:
            raise ValueError(f"the prior {path} has {prior.vocab} rows but the model's vocabulary has {self.vocab}: "
                             "use a prior saved for this model")
        # keep our k: the engine's prior keeps 8 successors per token from logits
        k = self.config.prior_successors
        self.prior = AdjacencyIndex(prior.ids[:, :, :k].contiguous(), prior.probs[:, :, :k].contiguous())


def prior_chain(prior: AdjacencyIndex, roots: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The prior's greedy chain from each root, in numpy for group 0 (`prior.lookup(zeros, roots,
    templates.chain(depth))`'s tokens without torch's per-level overhead, ~3 ms a call here): the
    rank-0 successor chain. A token's confidence is its rank-0 successor's share of the weights of
    its successors: the weights this proposer teaches (`teach_prior`: the newest successor 1, older
    ones halved) are recency weights, not probabilities, so the rank-0 weight alone is always 1;
    its share is 1 for a token always followed by the same token and falls as successors vary (a
    recency-weighted frequency, as suffix decoding's count(child) / count(node)). On the replay of
    `scripts/replay_vllm.py` (tiny target, T = 1) ranking by the share instead of the weight raised
    MAT at 2.2 draft tokens per step from below 1.36 (every cut of the weight drafted more) to 1.65
    (docs/BENCHMARKS.md, "Chains by replay"). Returns tokens [rows, depth] (int64, 0 past the end),
    scores [rows, depth] (float32 products of the confidences, 0 past the end) and each chain's length."""
    ids = prior.ids[0].numpy()
    weights = prior.probs[0].numpy()
    rows = len(roots)
    tokens = np.zeros((rows, depth), dtype=np.int64)
    score = np.zeros((rows, depth), dtype=np.float32)
    tok, valid, acc = roots, np.ones(rows, dtype=bool), np.ones(rows, dtype=np.float32)
    lengths = np.zeros(rows, dtype=np.int64)  # valid levels are a prefix: a chain stops at its first unknown successor
    for d in range(depth):
        succ, w = ids[tok], weights[tok].astype(np.float32)
        nxt = succ[:, 0]
        valid = valid & (nxt != EMPTY)
        total = np.where(succ != EMPTY, w, 0.0).sum(1)
        acc = acc * np.where(valid, w[:, 0] / np.maximum(total, 1e-12), 0.0)
        tok = np.where(valid, nxt, 0)
        tokens[:, d] = tok
        score[:, d] = np.where(valid, acc, 0.0)
        lengths += valid
    return tokens, score, lengths


def teach_prior(prior: AdjacencyIndex, prev: np.ndarray, nxt: np.ndarray, decay: float) -> None:
    """`prior.update_topk` for group 0 with one successor of weight 1 per pair (`nxt` follows
    `prev`), in numpy on the tables' memory, without torch's fixed cost (~1 ms a call here): the
    last pair of each token wins; its row becomes the successor with weight 1, then the row's
    other successors in their order by weight, × decay, the lightest dropped. Same tables as
    `update_topk` except the order of successors of equal weight, which torch's unstable sort
    leaves open (rows this proposer writes never have two: weights are distinct powers of
    `decay`)."""
    ids = prior.ids[0].numpy()  # [V, k] views: writes land in the prior's tensors
    probs = prior.probs[0].numpy()
    k = ids.shape[1]
    rows, last = np.unique(prev[::-1], return_index=True)
    succ = nxt[::-1][last]
    old_i = ids[rows]
    old_p = np.where((old_i != EMPTY) & (old_i != succ.reshape(-1, 1)),
                     probs[rows].astype(np.float32) * np.float32(decay), np.float32(-1.0))
    order = np.argsort(-old_p, axis=1, kind="stable")[:, : k - 1]
    kept_i = np.take_along_axis(old_i, order, 1)
    kept_p = np.take_along_axis(old_p, order, 1)
    new_i = np.concatenate([succ.reshape(-1, 1), np.where(kept_p < 0, EMPTY, kept_i)], 1)
    new_p = np.concatenate([np.ones((len(rows), 1), dtype=np.float32), np.maximum(kept_p, 0.0)], 1)
    ids[rows] = new_i
    probs[rows] = new_p.astype(probs.dtype)


def __getattr__(name: str):
    """`RLDraftProposer__<settings>` (see `config.ChainConfig.class_path`): the proposer with those settings."""
    base = PROPOSER_CLASS.rsplit(".", 1)[1]
    if not name.startswith(base + "__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return type(name, (RLDraftProposer,), {"config": ChainConfig.from_class_name(name)})
