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
fitted by the budget policy.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..adjacency import EMPTY, AdjacencyIndex
from ..templates import chain
from ..chain_budget import ChainDCut, FixedChains
from .config import PROPOSER_CLASS, ChainConfig
from .groups import Request, RequestTracker

PRIOR_K = 4
"""Successors per token in the global prior (the engine keeps 8 from logits; text gives fewer)."""

PRIOR_DECAY = 0.5
"""Older successors' weight when a token's row is rewritten (the engine's merge decay)."""


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

    def __init__(self, vllm_config):
        from . import plugin

        plugin.apply()  # exact rejection sampling on vLLM's CPU backend (a no-op elsewhere)
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.vocab = vllm_config.model_config.get_vocab_size()
        cfg = self.config
        self.tracker = RequestTracker(cfg.min_match, cfg.max_match, cfg.recall, cfg.recall_prompts)
        self.policy = ChainDCut(cfg.explore_every) if cfg.budget_policy == "dcut" else FixedChains()
        self.prior = AdjacencyIndex.empty(1, self.vocab, PRIOR_K) if cfg.use_prior else None
        if cfg.use_prior and cfg.prior_path:
            self.load_prior(cfg.prior_path)
        self.stats = ProposerStats()
        self._last_start: float | None = None  # start of the last propose call (a step's time runs start to start)
        self._pending: tuple[int, int] | None = None  # (rows, draft tokens) of the step now running

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's CPU runner hands every drafter the target model; ours needs none."""

    # ------------------------------------------------------------------ the step
    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings=None) -> list[list[int]]:
        start = time.perf_counter()
        reqs = self.tracker.rows(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        new_requests, accepted = self._learn(reqs, sampled_token_ids)
        self._time_step(start, new_requests, accepted)
        self._last_start = start
        active = [r for r in reqs if r is not None]
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        drafted = 0
        if not self.policy.skip():  # D-cut backing off: a plain step, no chains drafted or scored
            chains, scores = self._draft(active)
            decision = self.policy.decide(scores)
            rows = [i for i, req in enumerate(reqs) if req is not None]
            for j, (i, req) in enumerate(zip(rows, active)):
                depth = int(decision.depths[j])
                req.draft, req.draft_scores = chains[j][:depth], scores[j, :depth].tolist()
                out[i] = req.draft
                drafted += depth
            self.stats.proposed_tokens += decision.proposed
            self.stats.kept_tokens += decision.kept
            self.stats.plain_steps += int(decision.proposed > 0 and decision.kept == 0)
        self._pending = (len(active), drafted)
        self.stats.steps += 1
        self.stats.propose_s += time.perf_counter() - start
        return out

    def _time_step(self, now: float, new_requests: bool, accepted: int) -> None:
        """The step since the last call verified the drafts returned then: feed its time (from the last
        call's start: our own time included, a draft's cost is also ours) and the tokens it emitted to
        the policy, unless it also prefilled (a new request)."""
        if self._last_start is None or self._pending is None or new_requests:
            return
        ms = 1000.0 * (now - self._last_start)
        self.stats.step_s += ms / 1000.0
        rows, drafted = self._pending
        self.policy.observe_step(rows, drafted, ms, rows + accepted)

    def _learn(self, reqs: list[Request | None], sampled: list[list[int]]) -> tuple[bool, int]:
        """Acceptance of the drafts returned last step, and the new tokens into the prior. Returns
        whether a request appeared for the first time (its prefill ran in this step) and the draft
        tokens the step accepted."""
        new_requests, accepted_total = False, 0
        verified: list[tuple[list[float], int, int]] = []  # (raw scores, depth, accepted)
        prev_tok, next_tok = [], []
        for req, new in zip(reqs, sampled):
            if req is None:
                continue
            self.stats.rows += 1
            new_requests |= req.created == self.tracker.step
            if req.draft:
                accepted = len(new) - 1
                verified.append((req.draft_scores, len(req.draft), accepted))
                self.stats.drafts += 1
                self.stats.draft_tokens += len(req.draft)
                self.stats.accepted_tokens += accepted
                accepted_total += accepted
                req.draft = []
            text = req.text
            start = max(len(text) - len(new) - 1, 0)
            prev_tok.extend(text[start:-1])
            next_tok.extend(text[start + 1 :])
        if verified:
            depth = max(d for _, d, _ in verified)
            scores = np.zeros((len(verified), depth))
            for i, (s, _, _) in enumerate(verified):
                scores[i, : len(s)] = s
            self.policy.observe_acceptance(scores, np.array([d for _, d, _ in verified]),
                                           np.array([a for _, _, a in verified]))
        if self.prior is not None and prev_tok:
            self._teach_prior(prev_tok, next_tok)
        return new_requests, accepted_total

    def _teach_prior(self, prev_tok: list[int], next_tok: list[int]) -> None:
        tokens = torch.tensor(prev_tok, dtype=torch.long)
        top_i = torch.full((len(prev_tok), PRIOR_K), EMPTY, dtype=torch.long)
        top_i[:, 0] = torch.tensor(next_tok, dtype=torch.long)
        top_p = torch.zeros(len(prev_tok), PRIOR_K)
        top_p[:, 0] = 1.0
        self.prior.update_topk(torch.zeros_like(tokens), tokens, top_i, top_p, PRIOR_DECAY)

    def _draft(self, reqs: list[Request]) -> tuple[list[list[int]], np.ndarray]:
        """One chain per request and the raw score of each token ([rows, k], 0 past a chain's end):
        suffix-match tokens score (n / (n + 1))^depth for a match of n tokens, prior tokens the
        prior's weight, multiplied along the chain (D-cut calibrates them against acceptance)."""
        chains, scores = [], np.zeros((len(reqs), self.k))
        for j, req in enumerate(reqs):
            room = self._room(req)
            if room <= 0:
                chains.append([])
                continue
            match = req.group.index.match(req.text_id, room, shared=self.config.share_in_group)
            conf = match.length / (match.length + 1.0)
            chains.append(match.chain)
            scores[j, : len(match.chain)] = conf ** np.arange(1, len(match.chain) + 1)
        if self.prior is not None:
            self._extend_from_prior(reqs, chains, scores)
        return chains, scores

    def _extend_from_prior(self, reqs: list[Request], chains: list[list[int]], scores: np.ndarray) -> None:
        """Chains shorter than their room continue with the prior's most likely successors (its greedy
        chain, `AdjacencyIndex.lookup`), their weights multiplied into the scores."""
        todo = [j for j, req in enumerate(reqs) if len(chains[j]) < self._room(req)]
        if not todo:
            return
        roots = torch.tensor([(chains[j] or reqs[j].text)[-1] for j in todo], dtype=torch.long)
        found = self.prior.lookup(torch.zeros_like(roots), roots, chain(self.k))  # [len(todo), k], valid a prefix
        tokens, lengths, score = found.tokens.tolist(), found.valid.sum(1).tolist(), found.score.numpy()
        for row, j in enumerate(todo):
            have = len(chains[j])
            add = min(self._room(reqs[j]) - have, lengths[row])
            base = scores[j, have - 1] if have else 1.0
            chains[j].extend(tokens[row][:add])
            scores[j, have : have + add] = base * score[row, :add]

    def _room(self, req: Request) -> int:
        """Draft tokens this request may take: the depth, and the context left (vLLM's max_model_len)."""
        return min(self.k, self.max_model_len - req.length - 1)

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
        self.prior = AdjacencyIndex(prior.ids[:, :, :PRIOR_K].contiguous(), prior.probs[:, :, :PRIOR_K].contiguous())


def __getattr__(name: str):
    """`RLDraftProposer__<settings>` (see `config.ChainConfig.class_path`): the proposer with those settings."""
    base = PROPOSER_CLASS.rsplit(".", 1)[1]
    if not name.startswith(base + "__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return type(name, (RLDraftProposer,), {"config": ChainConfig.from_class_name(name)})
