"""`RLDraftProposer`: our RL draft sources and budget policy behind vLLM's `custom_class` hook.

Each `propose` call: rows → requests and groups (`groups.RequestTracker`) → learn (what the last
drafts and shadows earned) → draft (each request's chain from its group's counts or the prior's:
`ngrams.NgramStore.chains`) → cut (`dcut.chains.ChainPolicy`; each chain, sent or cut away, is
kept as a shadow for a policy that learns). The step time is measured from call to call. Why each part is as it is, and what it
costs: docs/DESIGN.md, "The vLLM backend".
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..dcut.chains import ChainDCut, ChainStep, FixedDepth, cut
from ..dcut.roofline import ContextProfile
from ..files import atomic_write_json, is_int, read_json, require_keys
from .config import MAX_MATCH, MAX_PRIOR_CONTEXTS, MIN_MATCH, PROPOSER_CLASS, RECALL_PROMPTS, ChainConfig
from .groups import Request, RequestTracker, catch_up
from .ngrams import NgramStore, read_prior
from .profile import start_profile

logger = logging.getLogger(__name__)


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
    shadows: int = 0  # chains (sent or cut away) matched against the text emitted since (resolved)
    shadow_tokens: int = 0  # their tokens compared (as vLLM counts a draft's: all of it once one was rejected)
    shadow_accepted: int = 0  # their tokens matched (what vLLM would have accepted, in distribution)
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
        plugin.check_request_ids()  # this vLLM's runner holds the request ids the plugin hands us
        self.vllm_config = vllm_config
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        cfg = self.config
        self.store = NgramStore(MAX_MATCH, MIN_MATCH)  # every table: the groups' and the prior
        self.prior = self.store.slot(MAX_PRIOR_CONTEXTS) if cfg.use_prior else -1
        try:
            self.vocab = int(vllm_config.model_config.get_vocab_size())  # the target's vocabulary
        except (AttributeError, TypeError, ValueError):
            self.vocab = None  # this vLLM does not say
        if self.prior >= 0 and cfg.prior_path:
            self.store.load(self.prior, cfg.prior_path, self.vocab)
        self.tracker = RequestTracker(self.store, self.prior, cfg.recall, RECALL_PROMPTS, shared=cfg.share_in_group)
        self.policy = (ChainDCut(self.k) if cfg.budget_policy == "dcut"
                       else FixedDepth(self.k))
        self.stats = ProposerStats()
        self.start_profile = ("no target loaded: the step time is learned online" if isinstance(self.policy, ChainDCut)
                              else "a fixed budget prices no step")  # what D-cut starts from (`load_model`)
        self._last_start: float | None = None  # start of the last propose call (a step's time runs start to start)
        self._pending: ChainStep | None = None  # the step now running (completed at the next call)
        self._shadows: list[Request] = []  # requests holding a shadow chain not resolved yet
        self.scheduled_drafts: list[int] | None = None  # draft tokens vLLM verifies this step per row (`plugin`; None: unknown)
        self._requests: tuple[list, object] | None = None  # this step's request ids and prompt lengths per row

    def set_requests(self, ids: list, prompt_lengths) -> None:
        """The request id and prompt length of each row of the coming `propose` call (our plugin calls
        it from vLLM's model runner each step; a replay calls it itself)."""
        self._requests = (ids, prompt_lengths)

    def load_model(self, model=None, *args, **kwargs) -> None:
        """vLLM hands every drafter the target it loaded: D-cut starts from the roofline of that
        target on this GPU where one models the step (`profile.start_profile`; logged either way)."""
        if isinstance(self.policy, ChainDCut) and model is not None:
            clock, self.start_profile = start_profile(self.vllm_config, model)
            logger.info("rollout_graft's vLLM proposer: %s", self.start_profile)
            if clock is not None:
                self.use_profile(clock)

    def use_profile(self, clock) -> None:
        """D-cut from now on starts from `clock`'s profile (`clock.profile_ms(rows, draft tokens,
        context)`: a `dcut.roofline.Roofline`) at the running rows' mean context (before any step)."""
        self.policy = ChainDCut(self.k, profile=ContextProfile(clock, lambda: self.tracker.num))

    # ------------------------------------------------------------------ the step
    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings=None) -> list[list[int]]:
        start = time.perf_counter()
        if self._requests is None:
            raise RuntimeError("RLDraftProposer.propose needs the rows' request ids first (`set_requests`): vLLM's "
                               "model runner hands them over through rollout_graft's plugin (`plugin.apply`), which "
                               "this runner did not run; build the engine with rollout_graft.vllm.speculative_config")
        (ids, prompt_lens), self._requests = self._requests, None
        # nothing to learn from the last step (it drafted nothing, no shadow waits) and the same requests in
        # the same rows: the tracker logs the step, no Python per row, until this or a later step drafts
        quiet = (not self._shadows and (self._pending is None or not self._pending.drafted)
                 and self.tracker.defer(ids, sampled_token_ids, num_tokens_no_spec))
        if quiet:
            rows, verified, accepted, shadowed = len(self.tracker.num), None, 0, None
            self.scheduled_drafts = None
        else:
            reqs = self.tracker.rows(ids, prompt_lens, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
            active = [reqs[i] for i in self.tracker.active.tolist()]
            verified, accepted = self._learn(active)
            rows, shadowed = len(active), self._resolve_shadows()
        self.stats.rows += rows
        self._observe(start, rows, verified, accepted, shadowed)
        self._last_start = start
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        planned, drafted, decision = self.policy.plan(rows), 0, None
        draft_start = time.perf_counter()
        if planned:
            if quiet:
                active = self.tracker.flush()
            chains, scores = self._draft(active, token_ids_cpu)
            depths, decision = self.policy.cut(chains, scores)
            learns = self.policy.learns
            for j, (i, req, chain, kept) in enumerate(zip(self.tracker.active.tolist(), active, chains, cut(chains, depths))):
                shadowed = learns and bool(chain) and not req.shadow  # one shadow per request at a time
                if shadowed:
                    self._shadow(req, chain, scores[j, : len(chain)])
                if kept:  # its evidence: the shadow's (the whole chain), else what vLLM verifies of it
                    req.draft, req.draft_scores = kept, scores[j, : len(kept)] if learns and not shadowed else None
                    out[i] = kept
                    drafted += len(kept)
            proposed = int((scores > 0).sum())
            self.stats.proposed_tokens += proposed
            self.stats.kept_tokens += drafted
            self.stats.plain_steps += int(proposed > 0 and drafted == 0)
        draft_ms = 1000.0 * (time.perf_counter() - draft_start)
        self._pending = ChainStep(rows=rows, planned=planned, drafted=drafted, draft_ms=draft_ms,
                                  decision=decision, verified=None, ms=None, emitted=0)  # completed by `_observe`
        self.stats.steps += 1
        self.stats.propose_s += time.perf_counter() - start
        return out

    def _observe(self, now: float, rows: int, verified: tuple | None, accepted: int, shadowed: tuple | None) -> None:
        """The budget policy learns from the step since the last call, which verified the drafts
        returned then: what they earned (`verified`: raw scores, depths and accepted tokens of the
        rows that drafted), what the shadows resolved now matched (`shadowed`, alike) and its time
        (from the last call's start: our own time included, a draft's cost is also ours) — not
        timed if it also prefilled (a new request) or is the first."""
        step = self._pending
        if step is None:
            return
        step.verified, step.emitted, step.shadowed = verified, step.rows + accepted, shadowed
        if self._last_start is not None and not self.tracker.created:
            step.ms = 1000.0 * (now - self._last_start)
            self.stats.step_s += step.ms / 1000.0
        self.policy.observe(step)

    def _learn(self, reqs: list[Request]) -> tuple[tuple | None, int]:
        """What the drafts returned last step earned: (raw scores [n, depth], depths [n], accepted [n])
        of the rows whose draft vLLM verified and that teach by themselves (`Request.draft_scores`;
        None: none) — a draft whose whole chain is a shadow teaches when the shadow resolves — and
        the draft tokens the step accepted (every draft's). The plugin tells us how many draft
        tokens vLLM verified per row (`scheduled_drafts`): vLLM drops the draft of a request it
        preempts and cuts one its token budget cannot hold. Without its word (no vLLM runner) every
        draft returned counts whole. (The new tokens were appended to the texts by the tracker.)"""
        scheduled, self.scheduled_drafts = self.scheduled_drafts, None
        if scheduled is None:
            depths = [len(req.draft) for req in reqs]
        else:
            depths = [int(scheduled[row]) if row < len(scheduled) else 0 for row in self.tracker.active.tolist()]
        lens = self.tracker.lens.tolist()
        rows = [j for j, depth in enumerate(depths) if depth]
        if not rows:
            return None, 0
        accepted = sum(lens[j] - 1 for j in rows)
        self.stats.drafts += len(rows)
        self.stats.draft_tokens += sum(depths[j] for j in rows)
        self.stats.accepted_tokens += accepted
        verified = [(reqs[j].draft_scores, depths[j], lens[j] - 1) for j in rows if reqs[j].draft_scores is not None]
        for req in reqs:
            req.draft, req.draft_scores = [], None
        return (_evidence(verified, max(d for _, d, _ in verified)) if verified else None), accepted

    def _shadow(self, req: Request, chain: list[int], scores: np.ndarray) -> None:
        """Keep `chain` (drafted from the request's text as it is now) to match against the tokens
        the request emits next (`_resolve_shadows`)."""
        req.shadow, req.shadow_scores, req.shadow_at = chain, scores, len(req.text)
        self._shadows.append(req)

    def _resolve_shadows(self) -> tuple | None:
        """Shadows whose outcome the emitted text now shows: the first token that differs from the
        chain (the rest of it counts as verified and rejected, as vLLM counts a draft), or the
        whole chain matched. A request that sampled nothing this step (finished, preempted or
        prefilling) resolves with what it emitted so far. Returns raw scores [n, depth], depths
        [n] and accepted [n] as `_learn` does (None: nothing resolved)."""
        if not self._shadows:
            return None
        step, done, left = self.tracker.step, [], []
        for req in self._shadows:
            chain, at = req.shadow, req.shadow_at
            emitted = req.group.texts[req.text_id][at : at + len(chain)]
            m = len(emitted)
            n = m if chain[:m] == emitted else next(j for j, (a, b) in enumerate(zip(chain, emitted)) if a != b)
            if n < m or n == len(chain):
                done.append((req, len(chain), n))
            elif req.seen < step:
                done.append((req, n, n))
            else:
                left.append(req)
        self._shadows = left
        resolved = [(req.shadow_scores, depth, n) for req, depth, n in done if depth]
        for req, _, _ in done:
            req.shadow = []
        if not resolved:
            return None
        scores, depths, accepted = evidence = _evidence(resolved, self.k)
        self.stats.shadows += len(resolved)
        self.stats.shadow_tokens += int(depths.sum())
        self.stats.shadow_accepted += int(accepted.sum())
        return evidence

    def _draft(self, reqs: list[Request], token_ids: np.ndarray) -> tuple[list[list[int]], np.ndarray]:
        """One chain per request and the raw score of each token ([rows, k], 0 past a chain's end):
        the chain from the group's counts or the one from the prior's (`NgramStore.chains_at`, read
        from vLLM's `token_ids` rows, each request's text), whichever expects more accepted tokens
        (the larger sum of scores; suffix decoding chooses between its prompt's tree and its global
        tree so). First every group's new text is counted (`groups.catch_up`)."""
        catch_up(self.tracker.pending)
        room = np.minimum(self.k, self.max_model_len - self.tracker.num - 1)  # the context left (max_model_len)
        return self.store.chains_at([req.group.slot for req in reqs], self.prior, token_ids, self.tracker.active,
                                    self.tracker.num, room, self.k)

    # ------------------------------------------------------------------ state
    def summary(self) -> dict:
        """Counters, plus why the budget policy verifies what it verifies."""
        return {**asdict(self.stats), "mean_accepted_tokens": self.stats.mean_accepted_tokens,
                "policy": self.policy.explain(), "start_profile": self.start_profile}

    def save_state(self, directory: str | Path) -> None:
        """Write the prior (`prior.safetensors`: `NgramStore.save`) and the remembered
        completions per prompt (`recall.json`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tracker.flush()  # the texts of steps it deferred
        if self.prior >= 0:
            catch_up(self.tracker.pending)
            self.store.save(self.prior, directory / "prior.safetensors")
        groups = [{"prompt": g.prompt, "completions": g.completions()[-self.config.recall :]}
                  for g in self.tracker.groups.values()] if self.config.recall else []
        atomic_write_json(directory / "recall.json", groups)

    def load_state(self, directory: str | Path) -> None:
        """Restore what `save_state` wrote (missing files are skipped): the prior starts over from
        the saved one. ValueError naming the file when one is corrupt (nothing is changed then)."""
        directory = Path(directory)
        recall = read_recall(directory / "recall.json", self.vocab) if (directory / "recall.json").exists() else None
        self.tracker.flush()
        if self.prior >= 0 and (directory / "prior.safetensors").exists():
            read_prior(directory / "prior.safetensors", self.vocab)  # checked before the old prior is cleared
            catch_up(self.tracker.pending)
            self.store.clear(self.prior)
            self.store.load(self.prior, directory / "prior.safetensors", self.vocab)
        if recall is not None:
            self.tracker.restore(recall)


def read_recall(path: str | Path, vocab: int | None = None) -> list[tuple[list[int], list[list[int]]]]:
    """(prompt, completions) pairs of a `recall.json` written by `save_state`; ValueError naming the
    file when it is not JSON or not a list of {"prompt": [ids], "completions": [[ids], ...]} with
    token ids in [0, vocab)."""
    data = read_json(path, "the vLLM proposer's recall file")

    def ids_ok(ids) -> bool:
        return isinstance(ids, list) and all(is_int(t) and t >= 0 and (vocab is None or t < vocab) for t in ids)

    if not isinstance(data, list):
        raise ValueError(f"the vLLM proposer's recall file {path} must hold a JSON list, got {type(data).__name__}")
    out = []
    for i, g in enumerate(data):
        require_keys(g, ("prompt", "completions"), path, f"entry {i} of the recall file")
        if not ids_ok(g["prompt"]) or not isinstance(g["completions"], list) or not all(map(ids_ok, g["completions"])):
            raise ValueError(f"the vLLM proposer's recall file {path}: entry {i} must hold lists of token ids in "
                             f"[0, {vocab if vocab is not None else 'vocab'}) (prompt, completions); save it again")
        out.append((g["prompt"], g["completions"]))
    return out


def _evidence(chains: list[tuple[np.ndarray, int, int]], width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw scores [n, width], depths [n], accepted [n]) of chains given as (their raw scores, tokens
    verified, tokens accepted); 0 past a chain's verified tokens."""
    scores = np.zeros((len(chains), width))
    for row, (known, depth, _) in enumerate(chains):
        scores[row, : min(len(known), depth)] = known[:depth]
    return scores, np.array([d for _, d, _ in chains]), np.array([n for _, _, n in chains])


def __getattr__(name: str):
    """`RLDraftProposer__<settings>` (see `config.ChainConfig.class_path`): the proposer with those settings."""
    base = PROPOSER_CLASS.rsplit(".", 1)[1]
    if not name.startswith(base + "__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return type(name, (RLDraftProposer,), {"config": ChainConfig.from_class_name(name)})
