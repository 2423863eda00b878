"""`RLDraftProposer`: our RL draft sources and budget policy behind vLLM's `custom_class` hook.

Each `propose` call: rows → requests and groups (`groups.RequestTracker`) → learn (what the last
drafts and shadows earned: `inflight.InFlight`) → draft (each request's chain from its group's
counts or the prior's: `ngrams.NgramStore.chain_arrays`) → cut (`dcut.chains.ChainPolicy`; each
chain, sent or cut away, is kept as a shadow for a policy that learns). The step time is measured
from call to call. Why each part is as it is, and what it costs: docs/DESIGN.md, "The vLLM backend".
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..dcut.chains import ChainDCut, ChainStep, FixedDepth
from ..dcut.roofline import ContextProfile
from ..files import atomic_write_json, is_int, read_json, require_keys
from .config import MAX_MATCH, MAX_PRIOR_CONTEXTS, MIN_MATCH, PROPOSER_CLASS, RECALL_PROMPTS, ChainConfig
from .groups import RequestTracker
from .inflight import InFlight
from .ngrams import NgramStore, read_prior
from .profile import start_profile

BESIDE_TOKENS = 128
"""A call that does not draft hands the text waiting to be counted to the store's helper thread,
counted beside vLLM's next forward (`NgramStore.teach(beside=True)`), once this many tokens wait
and the next call may draft (`ChainPolicy.drafts_next`) or `BESIDE_BATCH` wait: fewer cost less to
count in the next draft than the hand-over (tens of µs on this machine, as for
`ngrams.PARALLEL_ROWS`, the same figure)."""

BESIDE_BATCH = 2048
"""Tokens a plain spell hands to the helper thread at once while no draft comes (`_hands_over`;
`RLDraftProposer.beside_batch`). A hand-over costs a call about the same whatever it carries: with
batches a quiet call takes 0.67–0.71× the time of one handing over at every call once
`BESIDE_TOKENS` wait at 256 rows (its A/A twin 0.94× apart; at 64 and 1,024 rows 0.73–0.96×, within
the twins' spread: `docs/bench/vllm_beside_batch.json`, rows leaving at a GRPO rollout's rate;
docs/DESIGN.md, "Modelled clocks"). 2,048 tokens take the
helper 1.8–2.2 ms at this machine's 0.87–1.06 µs a token counted at 256–1,024 rows (the fixed arm's
counting over its MAT: `docs/bench/vllm_proposer_vs_ngram.json`), under the shortest forward the
rooflines model for an 8B target (~5.5 ms: `rollout_graft_tools.clocks`)."""

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
    finished: int = 0  # requests dropped as vLLM reported them finished (their groups' tables cleared once idle)
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
    count_beside = True  # a call that does not draft counts the deferred text beside the next forward (the lab's A/B)
    beside_batch = BESIDE_BATCH  # tokens a plain spell hands to the helper thread at once (the lab's A/B)

    def __init__(self, vllm_config):
        from . import plugin

        plugin.apply()  # exact rejection sampling on vLLM's CPU backend; the plain path for undrafted steps
        plugin.check_request_ids()  # this vLLM's runner holds the request ids the plugin hands us
        self.vllm_config = vllm_config
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        cfg = self.config
        self.store = NgramStore(MAX_MATCH, MIN_MATCH)  # every table: the groups' and the prior
        self.prior = self.store.slot(MAX_PRIOR_CONTEXTS, apart=True) if cfg.use_prior else -1  # counted and walked beside the groups
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
        self.profile_note = ("no target loaded: the step time is learned online" if isinstance(self.policy, ChainDCut)
                             else "a fixed budget prices no step")  # what D-cut starts from, and why (`load_model`)
        self._last_start: float | None = None  # start of the last propose call (a step's time runs start to start)
        self._arrived = False  # the last call started a request (the step after it is not timed: `_observe`)
        self._pending: ChainStep | None = None  # the step now running (completed at the next call)
        self._count_ms = 0.0  # this call's counting of the text since the last draft (`_draft`)
        self.inflight = InFlight(self.k)  # each request's draft sent and shadow chain, by slot
        self.scheduled_drafts: list[int] | None = None  # draft tokens vLLM verifies this step per row (`plugin`; None: unknown)
        self._requests: tuple[list, object] | None = None  # this step's request ids and prompt lengths per row
        self._finished: list = []  # ids of requests vLLM reported finished, for the coming call

    def set_requests(self, ids: list, prompt_lengths, finished=()) -> None:
        """The request id and prompt length of each row of the coming `propose` call, and the ids of
        requests that finished since the last step (vLLM's `finished_req_ids`: they will not return;
        `groups.RequestTracker.finish`). Our plugin calls it from vLLM's model runner each step; a
        replay calls it itself."""
        self._requests = (ids, prompt_lengths)
        self._finished.extend(finished)

    def load_model(self, model=None, *args, **kwargs) -> None:
        """vLLM hands every drafter the target it loaded: D-cut starts from the roofline of that
        target on this GPU where one models the step (`profile.start_profile`; logged either way)."""
        if isinstance(self.policy, ChainDCut) and model is not None:
            clock, self.profile_note = start_profile(self.vllm_config, model)
            logger.info("rollout_graft's vLLM proposer: %s", self.profile_note)
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
        # the same rows: the tracker appends the step (array work) and nothing is learned
        quiet = (not self.inflight.shadows and (self._pending is None or not self._pending.drafted)
                 and self.tracker.defer(ids, sampled_token_ids, num_tokens_no_spec, token_ids_cpu))
        if quiet:
            verified, accepted, shadowed = None, 0, None
            self.scheduled_drafts = None
        else:
            self.tracker.rows(ids, prompt_lens, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
            self.inflight.start(self.tracker.slot_capacity, self.tracker.started)
            verified, accepted = self._learn()
            shadowed = self._resolve_shadows()
        if self._finished:
            self.stats.finished += self.tracker.finish(self._finished)
            self._finished = []
        rows = len(self.tracker.num)
        self.stats.rows += rows
        self._observe(start, rows, verified, accepted, shadowed)
        self._last_start = start
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        planned, drafted, decision = self.policy.plan(rows), 0, None
        draft_start = time.perf_counter()
        if planned:
            tokens, scores, lengths = self._draft(token_ids_cpu)
            depths, decision = self.policy.cut(tokens, scores)
            # every chain a shadow where its request holds none; a sent draft's evidence: its shadow's (the
            # whole chain), else what vLLM verifies of it
            kept = self.inflight.send(self.tracker.slots, tokens, scores, lengths, depths, self.tracker.num,
                                      self.policy.learns)
            for i, draft, n in zip(self.tracker.active.tolist(), tokens.tolist(), kept.tolist()):
                if n:
                    del draft[n:]
                    out[i] = draft
            drafted = int(kept.sum())
            proposed = int((scores > 0).sum())
            self.stats.proposed_tokens += proposed
            self.stats.kept_tokens += drafted
            self.stats.plain_steps += int(proposed > 0 and drafted == 0)
        elif self.count_beside and self._hands_over(rows):
            # the text a spell of plain decisions defers, counted in the helper thread beside vLLM's next
            # forward rather than all at once by the next draft: the same tables when it walks
            self.tracker.count(beside=True)
            self._count_ms = 1000.0 * (time.perf_counter() - draft_start)
        draft_ms = 1000.0 * (time.perf_counter() - draft_start) - self._count_ms  # the counting is not the draft's
        self._count_ms = 0.0
        self._pending = ChainStep(rows=rows, planned=planned, drafted=drafted, draft_ms=draft_ms,
                                  decision=decision, verified=None, ms=None, emitted=0)  # completed by `_observe`
        self.stats.steps += 1
        self.stats.propose_s += time.perf_counter() - start
        return out

    def _hands_over(self, rows: int) -> bool:
        """Whether a call that does not draft hands the text waiting to the helper thread: once
        `BESIDE_TOKENS` wait, where the next call may draft (its walk then finds them counted) or
        `beside_batch` wait."""
        waiting = self.tracker.waiting()
        return waiting >= BESIDE_TOKENS and (waiting >= self.beside_batch or self.policy.drafts_next(rows))

    def _observe(self, now: float, rows: int, verified: tuple | None, accepted: int, shadowed: tuple | None) -> None:
        """The budget policy learns from the step since the last call, which verified the drafts
        returned then: what they earned (`verified`: raw scores, depths and accepted tokens of the
        rows that drafted), what the shadows resolved now matched (`shadowed`, alike) and its time
        (from the last call's start: our own time included, a draft's cost is also ours) — not
        timed if it also prefilled (a new request), if the last call started one (that call counted
        its prompt, a one-off that is not a draft's cost: charged to drafting, it held a profiled
        D-cut plain through a rollout), or if it is the first."""
        step, arrived = self._pending, self._arrived
        self._arrived = self.tracker.created
        if step is None:
            return
        step.verified, step.emitted, step.shadowed = verified, step.rows + accepted, shadowed
        if self._last_start is not None and not self.tracker.created and not arrived:
            step.ms = 1000.0 * (now - self._last_start)
            self.stats.step_s += step.ms / 1000.0
        self.policy.observe(step)

    def _learn(self) -> tuple[tuple | None, int]:
        """What the drafts returned last step earned: (raw scores [n, depth], depths [n], accepted [n])
        of the rows whose draft vLLM verified and that teach by themselves (`InFlight.teaches`;
        None: none) — a draft whose whole chain is a shadow teaches when the shadow resolves — and
        the draft tokens the step accepted (every draft's). The plugin tells us how many draft
        tokens vLLM verified per row (`scheduled_drafts`): vLLM drops the draft of a request it
        preempts and cuts one its token budget cannot hold. Without its word (no vLLM runner) every
        draft returned counts whole. (The new tokens were appended to the texts by the tracker.)"""
        scheduled, self.scheduled_drafts = self.scheduled_drafts, None
        slots, active = self.tracker.slots, self.tracker.active
        if scheduled is None:
            depths = self.inflight.draft_len[slots]
        else:
            scheduled, depths = np.asarray(scheduled, dtype=np.int64), np.zeros(len(active), np.int64)
            inside = active < len(scheduled)
            depths[inside] = scheduled[active[inside]]
        verified, rows, tokens, accepted = self.inflight.verified(slots, depths, self.tracker.lens)
        self.stats.drafts += rows
        self.stats.draft_tokens += tokens
        self.stats.accepted_tokens += accepted
        return verified, accepted

    def _resolve_shadows(self) -> tuple | None:
        """Shadows whose outcome the emitted text now shows (`InFlight.resolve`): raw scores [n, depth],
        depths [n] and accepted [n] as `_learn` gives them (None: nothing resolved)."""
        t = self.tracker
        evidence = self.inflight.resolve(t.slots, t.active, t.num, t.token_ids, t)
        if evidence is not None:
            _, depths, accepted = evidence
            self.stats.shadows += len(depths)
            self.stats.shadow_tokens += int(depths.sum())
            self.stats.shadow_accepted += int(accepted.sum())
        return evidence

    def _draft(self, token_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One chain per active row's request: tokens [rows, k], the raw score of each token [rows, k]
        (0 past a chain's end) and lengths [rows]: the chain from the group's counts or the one from
        the prior's (`NgramStore.chain_arrays`, read from vLLM's `token_ids` rows, each request's
        text), whichever expects more accepted tokens (the larger sum of scores; suffix decoding
        chooses between its prompt's tree and its global tree so). First the new text is counted
        (`groups.RequestTracker.count`; its time, `_count_ms`, is not charged to the draft: see
        `ChainStep.draft_ms`)."""
        start = time.perf_counter()
        self.tracker.count()
        self._count_ms = 1000.0 * (time.perf_counter() - start)
        return self._walk(token_ids)

    def _walk(self, token_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_draft`'s chains over the tables as they stand (the counting done or not)."""
        t = self.tracker
        room = np.minimum(self.k, self.max_model_len - t.num - 1)  # the context left (max_model_len)
        return self.store.chain_arrays(t.tables, self.prior, token_ids, t.active, t.num, room, self.k)

    # ------------------------------------------------------------------ state
    def summary(self) -> dict:
        """Counters, plus why the budget policy verifies what it verifies."""
        return {**asdict(self.stats), "mean_accepted_tokens": self.stats.mean_accepted_tokens,
                "uncounted_tokens": self.tracker.dropped_tokens,  # text past `groups.MAX_BACKLOG` deferred
                "requests_held": len(self.tracker.by_slot),  # in the batch, or left it unreported (preempted: may return)
                "tables_mb": self.store.nbytes() / 1e6,  # host memory of the count tables (the prior's included)
                "policy": self.policy.explain(), "start_profile": self.profile_note}

    def save_state(self, directory: str | Path) -> None:
        """Write the prior (`prior.safetensors`: `NgramStore.save`) and the remembered
        completions per prompt (`recall.json`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tracker.count()  # the texts of steps it deferred, counted
        if self.prior >= 0:
            self.store.save(self.prior, directory / "prior.safetensors")
        groups = [{"prompt": g.prompt, "completions": g.completions()[-self.config.recall :]}
                  for g in self.tracker.groups.values()] if self.config.recall else []
        atomic_write_json(directory / "recall.json", groups)

    def load_state(self, directory: str | Path) -> None:
        """Restore what `save_state` wrote (missing files are skipped): the prior starts over from
        the saved one. ValueError naming the file when one is corrupt (nothing is changed then)."""
        directory = Path(directory)
        recall = read_recall(directory / "recall.json", self.vocab) if (directory / "recall.json").exists() else None
        if self.prior >= 0 and (directory / "prior.safetensors").exists():
            read_prior(directory / "prior.safetensors", self.vocab)  # checked before the old prior is cleared
            self.tracker.count()  # what the old prior has still to count, before it is replaced
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


def __getattr__(name: str):
    """`RLDraftProposer__<settings>` (see `config.ChainConfig.class_path`): the proposer with those settings."""
    base = PROPOSER_CLASS.rsplit(".", 1)[1]
    if not name.startswith(base + "__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return type(name, (RLDraftProposer,), {"config": ChainConfig.from_class_name(name)})
