"""The vLLM backend's parts without vLLM's engine: group detection from hand-made persistent-batch
arrays, suffix matching, chain D-cut selection and cost fit, settings that travel in the class
name, and the CPU sampling fix's kernel."""

import numpy as np
import pytest
import torch

from rollout_graft.budget import BudgetDecision, FixedBudget
from rollout_graft.chain_budget import ChainDCut, Chains, ChainStep, StepCost
from rollout_graft.vllm.config import PROPOSER_CLASS, ChainConfig, speculative_config
from rollout_graft.vllm.groups import RequestTracker
from rollout_graft.vllm.plugin import expand_kernel_impl
from rollout_graft.vllm.text_index import TextIndex

P1 = [5, 6, 7, 8]  # prompt of group 1
P2 = [5, 6, 9]  # prompt of group 2 (shares a prefix with P1)


class Batch:
    """vLLM's persistent batch as the proposer sees it: token_ids_cpu [rows, len], num_tokens_no_spec."""

    def __init__(self, texts: list[list[int]]):
        self.texts = [list(t) for t in texts]

    def arrays(self):
        width = max(len(t) for t in self.texts) + 8
        ids = np.zeros((len(self.texts) + 2, width), dtype=np.int32)  # spare rows, as vLLM's max_num_reqs
        for i, t in enumerate(self.texts):
            ids[i, : len(t)] = t
        return np.array([len(t) for t in self.texts] + [0, 0]), ids

    def step(self, tracker: RequestTracker, sampled: list[list[int]]):
        for t, new in zip(self.texts, sampled):
            t.extend(new)
        num, ids = self.arrays()
        return tracker.rows(sampled, num, ids)


def test_siblings_share_a_group_other_prompts_do_not():
    tracker = RequestTracker()
    batch = Batch([P1, P1, P2, P1])
    reqs = batch.step(tracker, [[10], [11], [12], [10]])
    groups = [r.group for r in reqs]
    assert groups[0] is groups[1] is groups[3] and groups[2] is not groups[0]
    assert groups[0].prompt == P1 and groups[2].prompt == P2
    assert len({id(r) for r in reqs}) == 4  # four requests, even where two sampled the same token


def test_rows_that_move_keep_their_request_and_text():
    tracker = RequestTracker()
    batch = Batch([P1, P1, P2])
    a, b, c = batch.step(tracker, [[10], [11], [12]])
    batch.step(tracker, [[20, 21], [22], [23]])
    # row 0 finishes; vLLM condenses: the last row moves into slot 0
    batch.texts = [batch.texts[2], batch.texts[1]]
    moved, same = batch.step(tracker, [[30], [31]])
    assert moved is c and same is b
    assert c.text == P2 + [12, 23, 30] and b.text == P1 + [11, 22, 31]
    assert a.text == P1 + [10, 20, 21]  # a finished: its text stays readable by its siblings


def test_prefill_chunk_rows_and_empty_slots_are_skipped():
    tracker = RequestTracker()
    batch = Batch([P1, P2])
    reqs = batch.step(tracker, [[10], []])  # row 1 still prefilling: nothing sampled
    assert reqs[1] is None and len(tracker.groups) == 1


def test_preempted_request_resumes_as_itself():
    tracker = RequestTracker()
    batch = Batch([P1, P1])
    a, b = batch.step(tracker, [[10], [11]])
    batch.step(tracker, [[12], [13]])
    text_a = list(batch.texts[0])
    # a is preempted (leaves the batch), b runs on for a step, then a comes back recomputed in row 1
    batch.texts = [batch.texts[1]]
    batch.step(tracker, [[14]])
    batch.texts = [batch.texts[0], text_a]
    b2, a2 = batch.step(tracker, [[15], [16]])
    assert a2 is a and b2 is b and a.text == P1 + [10, 12, 16]


def test_mixed_rollouts_in_one_batch_keep_their_groups():
    """Requests of two rollouts (different prompts, one arriving later) share the batch."""
    tracker = RequestTracker()
    batch = Batch([P1, P1])
    a, b = batch.step(tracker, [[10], [11]])
    batch.texts.append(list(P2))
    a2, b2, c = batch.step(tracker, [[12], [13], [14]])
    assert (a2, b2) == (a, b) and c.group is not a.group and c.group.prompt == P2


def test_group_text_is_shared_and_recalled_across_rollouts():
    tracker = RequestTracker(recall=2)
    batch = Batch([P1, P1])
    batch.step(tracker, [[10], [11]])
    batch.step(tracker, [[20, 30], [21]])
    lead, follow = batch.step(tracker, [[40], [31]])
    # follow's text ends ... 11 21 31; it matched nothing of lead's; but lead's text holds 20 30 40
    assert lead.group.index.match(follow.text_id, 4).chain == []
    _, follow = batch.step(tracker, [[41], [20]])
    assert follow.group.index.match(follow.text_id, 3).chain == [30, 40, 41]  # a sibling's continuation
    # a later rollout of P1 (no P1 request ran at the previous step) recalls the completions
    batch.texts = [list(P2)]
    batch.step(tracker, [[50]])
    batch.texts = [batch.texts[0], list(P1)]
    _, new = batch.step(tracker, [[51], [10]])
    assert new.group.recalled and new.group.index.match(new.text_id, 3).chain == [20, 30, 40]


def test_text_index_prefers_the_longest_match_and_skips_its_own_end():
    index = TextIndex(1, 3)
    a = index.add([1, 2, 3, 4, 9])
    b = index.add([7, 2, 3, 5, 6])
    c = index.add([8, 8, 2, 3])
    assert index.match(c, 2).chain in ([5, 6], [4, 9])  # "2 3" matched in both: the newest wins
    assert index.match(c, 2).chain == [5, 6] and index.match(c, 2).length == 2
    d = index.add([1, 2, 3])
    assert index.match(d, 2).chain == [4, 9] and index.match(d, 2).length == 3
    assert index.match(a, 2).chain == [] and index.match(b, 2, shared=False).chain == []


def _eager_table(steps: list[list[tuple[int, list[int]]]], texts: list[list[int]], lo: int, hi: int, keep: int) -> dict:
    """The n-gram table built by indexing every token on arrival (reference for TextIndex)."""
    texts, table = [list(t) for t in texts], {}
    for step in steps:
        for tid, tokens in step:
            for tok in tokens:
                texts[tid].append(tok)
                last = tuple(texts[tid][-hi:])
                for n in range(lo, len(last) + 1):
                    table[last[len(last) - n :]] = ((tid, len(texts[tid]) - 1),) + table.get(last[len(last) - n :], ())[: keep - 1]
    return table


def test_text_index_indexes_lazily_and_as_on_arrival():
    """`extend` only appends; the next `match` indexes. Matched every step the table is the one
    indexing on arrival builds (occurrence order included); matched once after many steps it holds
    the same occurrences, and what the unindexed steps wrote is found."""
    rng = np.random.default_rng(0)
    steps = [[(tid, rng.integers(0, 5, int(rng.integers(1, 4))).tolist()) for tid in rng.permutation(3).tolist()]
             for _ in range(40)]
    every, once = TextIndex(1, 3, keep=4), TextIndex(1, 3, keep=1000)
    for index in (every, once):
        for _ in range(3):
            index.add([9, 9], indexed_from=2)
    for step in steps:
        for tid, tokens in step:
            every.extend(tid, tokens)
            once.extend(tid, tokens)
        every.match(0, 2)
        assert once.stale and len(once.table) == 0  # nothing indexed while nothing matches
    assert every.table == _eager_table(steps, [[9, 9]] * 3, 1, 3, 4)
    once.match(0, 2)
    eager = _eager_table(steps, [[9, 9]] * 3, 1, 3, 1000)
    assert {k: sorted(v) for k, v in once.table.items()} == {k: sorted(v) for k, v in eager.items()}
    once.extend(1, [7, 8, 6])
    once.extend(2, [7, 8])
    assert once.match(2, 3).chain == [6]


def test_step_cost_fit_recovers_a_linear_cost():
    cost = StepCost()
    rng = np.random.default_rng(0)
    for _ in range(200):
        rows, draft = int(rng.integers(1, 64)), int(rng.integers(0, 256))
        cost.observe(rows, draft, 5.0 + 0.5 * rows + 0.1 * draft)
    a, b_rows, b_draft = cost.coef
    assert a == pytest.approx(5.0, abs=0.2) and b_rows == pytest.approx(0.5, abs=0.02) and b_draft == pytest.approx(0.1, abs=0.01)


def chains(scores: np.ndarray) -> Chains:
    """Chains of made-up tokens with these raw scores."""
    return Chains([list(range(int((row > 0).sum()))) for row in scores], scores)


def timed(policy, rows: int, drafted: int, ms: float, emitted: int, draft_ms: float = 0.0, verified=None) -> None:
    """The policy observes a step vLLM took (`ms`) after drafting `drafted` tokens."""
    decision = BudgetDecision(0.0, drafted, drafted, float(emitted), probe=False)
    policy.observe(ChainStep(rows, 4, drafted, draft_ms, decision, verified, ms, emitted))


def test_dcut_verifies_drafts_only_where_they_pay():
    scores = np.tile(0.9 ** np.arange(1, 5), (8, 1))  # 8 rows × 4 tokens
    cheap, dear = ChainDCut(4, explore_every=0), ChainDCut(4, explore_every=0)
    for policy, per_draft in ((cheap, 0.01), (dear, 5.0)):  # a row's step: 18 ms / 8 = 2.25 ms
        for i in range(40):
            timed(policy, 8, i % 33, 10.0 + 1.0 * 8 + per_draft * (i % 33), 8 + int(0.9 * (i % 33)))
        # calibrate: the drafts are accepted as their scores say
        timed(policy, 8, 0, None, 8, verified=(np.tile(scores[:1], (500, 1)), np.full(500, 4),
                                               np.random.default_rng(0).binomial(4, 0.9, 500)))
    assert cheap.plan(8) == 4
    cut, decision = cheap.cut(chains(scores))
    assert decision.kept == 32 and cut.depths.tolist() == [4] * 8 and not decision.probe
    cut, decision = dear.cut(chains(scores))
    assert decision.kept == 0 and not decision.probe and cut.tokens == [[]] * 8 and dear.plain


def test_speculative_config_round_trip_and_errors():
    spec = speculative_config(num_speculative_tokens=6, recall=2)
    assert spec["method"] == "custom_class" and spec["num_speculative_tokens"] == 6
    assert spec["model"].startswith(PROPOSER_CLASS + "__") and "." not in spec["model"].rsplit(".", 1)[1]
    assert ChainConfig.from_class_name(spec["model"].rsplit(".", 1)[1]) == ChainConfig(recall=2)
    assert speculative_config()["model"] == PROPOSER_CLASS
    from rollout_graft.vllm import proposer

    cls = getattr(proposer, spec["model"].rsplit(".", 1)[1])
    assert issubclass(cls, proposer.RLDraftProposer) and cls.config.recall == 2
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        speculative_config(num_speculative_tokens=0)
    with pytest.raises(TypeError, match="unknown option"):
        speculative_config(suffix_depth=4)
    with pytest.raises(ValueError, match="budget_policy"):
        speculative_config(budget_policy="tree")
    with pytest.raises(ValueError, match="max_match"):
        speculative_config(min_match=3, max_match=2)
    with pytest.raises(ValueError, match="identity_tokens"):
        speculative_config(identity_tokens=0)
    with pytest.raises(ValueError, match="prior_decay"):
        speculative_config(prior_decay=1.0)


def test_tracker_and_index_take_their_sizes_from_the_config():
    index = TextIndex(1, 2, keep=1)
    index.match(index.add([5, 6, 7, 5, 6, 8]), 1)
    assert index.table[(5, 6)] == ((0, 4),)  # only the newest occurrence kept
    tracker = RequestTracker(tail=4, occurrences=1)
    Batch([[1, 2, 3, 4, 5, 6]]).step(tracker, [[9]])
    assert tracker.slot_tail.shape[1] == 4 and tracker.groups[next(iter(tracker.groups))].index.keep == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32])
def test_cpu_expand_kernel_fix_matches_the_kernel(dtype):
    """vLLM's expand_kernel: output[cu[i-1]:cu[i]] = x[i], replace_from → replace_to."""
    x = torch.tensor([0.6, 1.0, 0.0, 2.5]).to(dtype)
    cu = torch.tensor([2, 5, 5, 6], dtype=torch.int32)
    out = torch.full((6,), -7, dtype=dtype)
    expand_kernel_impl(out, x, cu, -1, 9)
    expected = torch.tensor([0.6, 0.6, 1.0, 1.0, 1.0, 2.5]).to(dtype)
    assert torch.equal(out, expected)
    out = torch.full((3,), -7, dtype=dtype)
    expand_kernel_impl(out, torch.tensor([0, 3]).to(dtype), torch.tensor([1, 3]), 0, 9)
    assert out.tolist() == [9, 3, 3]


def test_identical_siblings_that_move_stay_distinct_requests():
    """Greedy siblings have identical texts; after a condense they must still map to distinct requests."""
    tracker = RequestTracker()
    batch = Batch([P2, P1, P1])
    c, a, b = batch.step(tracker, [[9], [10], [10]])
    batch.texts = [batch.texts[2], batch.texts[1]]  # row 0 (P2) finished; row 2 moves to slot 0
    x, y = batch.step(tracker, [[11], [11]])
    assert {id(x), id(y)} == {id(a), id(b)}


def test_dcut_backs_off_while_plain_decoding_wins():
    """After a plain decision, drafting again (a probe) waits until the probe credit affords the
    proposer's drafting time: probes that find nothing cost ~1 % of the time. A probe D-cut would
    cut to nothing verifies the batch's best `rows` tokens (fresh evidence for the calibration)."""
    dear = ChainDCut(4, explore_every=0)
    for i in range(40):
        timed(dear, 8, i % 33, 18.0 + 5.0 * (i % 33), 8 + (i % 33) // 2)
    scores = np.tile(0.5 ** np.arange(1, 5), (8, 1))
    probes = steps = 0
    for _ in range(400):
        steps += 1
        planned = dear.plan(8)
        if planned:
            probes += 1
            cut, decision = dear.cut(chains(scores))
            assert (decision.kept, decision.probe) == ((8, True) if probes > 1 else (0, False))  # the first: a plain decision
            assert cut.depths.tolist() == [1] * 8 or probes == 1
            dear.observe(ChainStep(8, planned, decision.kept, 2.0, decision, None, 20.0, 8))  # 2 ms beyond a 18 ms step
        else:
            dear.observe(ChainStep(8, 0, 0, 0.0, None, None, 18.0, 8))
    # 1 % of the time, ~2 ms a probe (its step beyond the fitted plain step, which the fit knows only roughly)
    assert 0.75 * 400 * 18.0 * 0.01 / 2.0 <= probes <= 400 * 20.0 * 0.01 / 2.0 + 3
    fixed = FixedBudget(4)  # a fixed depth: the engine's fixed budget, over chains
    assert all(fixed.plan(8) == 4 for _ in range(5))
    cut, decision = fixed.cut(chains(scores))
    assert int(cut.depths.sum()) == 32 and decision.ratio == 1.0


def test_measured_steps_overrule_a_fit_that_says_draft():
    """The fit prices drafts as nearly free, but the steps that drafted emitted fewer tokens per ms
    than plain ones (e.g. the proposer's own time): D-cut decodes plainly."""
    policy = ChainDCut(4, explore_every=0)
    for i in range(40):
        draft = i % 33
        timed(policy, 8, draft, 18.0 + 0.01 * draft, 8)  # drafts cost nothing in the fit, but nothing was accepted
    timed(policy, 8, 32, 30.0, 9)  # a drafting step, measured slower per token
    scores = np.tile(0.9 ** np.arange(1, 5), (8, 1))
    assert not policy.pays(8) and policy.cut(chains(scores))[1].kept == 0
    assert policy.pays(64)  # another batch-size class has not been measured: the fit decides there


@pytest.mark.parametrize("explore_every", [16, 0])
def test_drafting_keeps_measuring_plain_steps(explore_every):
    """Plain steps measured long ago (a slower machine) must not keep D-cut drafting: every 16th
    decision to draft decodes plainly, so when plain steps have become faster per token than
    drafting ones the guard sees it and D-cut decodes plainly; without exploration (0) it drafts on."""
    policy = ChainDCut(4, explore_every=explore_every)
    for i in range(40):  # the past: drafting steps 0.6 tokens/ms, plain ones 0.4; the fit sees drafts as free
        timed(policy, 8, 32 if i % 2 else 0, 20.0, 12 if i % 2 else 8)
    scores = np.tile(0.9 ** np.arange(1, 5), (8, 1))
    drafted = []
    for _ in range(600):  # now plain steps take 10 ms (0.8 tokens/ms), drafting ones still 20
        planned = policy.plan(8)
        decision = policy.cut(chains(scores))[1] if planned else None
        kept = decision.kept if decision else 0
        ms, emitted = (20.0, 12) if kept else (10.0, 8)
        policy.observe(ChainStep(8, planned, kept, 0.0, decision, None, ms, emitted))
        drafted.append(kept > 0 and not decision.probe)
    late = sum(drafted[-100:])
    assert (late <= 10) if explore_every else (late == 100)


def test_prior_chain_is_the_lookup_of_a_chain_template():
    """The proposer's numpy greedy chain gives AdjacencyIndex.lookup's tokens and lengths, and
    scores that are lookup's on the prior with each token's weights normalised (the rank-0 share)."""
    from rollout_graft.adjacency import EMPTY, AdjacencyIndex
    from rollout_graft.templates import chain
    from rollout_graft.vllm.proposer import prior_chain

    gen = torch.Generator().manual_seed(0)
    prior = AdjacencyIndex.empty(1, 50, 4)
    prior.ids[0] = torch.randint(0, 50, (50, 4), generator=gen)
    prior.ids[0, torch.rand(50, generator=gen) < 0.3, 0] = EMPTY  # chains that stop early
    prior.probs[0] = torch.rand(50, 4, generator=gen).half()
    roots = np.arange(50)
    tokens, score, lengths = prior_chain(prior, roots, 6)
    ref = prior.lookup(torch.zeros(50, dtype=torch.long), torch.from_numpy(roots), chain(6))
    assert np.array_equal(tokens, ref.tokens.numpy())
    weights = torch.where(prior.ids[0] != EMPTY, prior.probs[0].float(), 0.0)
    normalised = AdjacencyIndex(prior.ids.clone(), (weights / weights.sum(1, keepdim=True).clamp(min=1e-12)).unsqueeze(0))
    ref_score = normalised.lookup(torch.zeros(50, dtype=torch.long), torch.from_numpy(roots), chain(6)).score.numpy()
    assert np.allclose(score, ref_score, rtol=1e-5, atol=1e-7) and (score[:, 0] < 1).any()
    assert np.array_equal(lengths, ref.valid.sum(1).numpy())
    assert lengths.min() == 0 and lengths.max() == 6 and ((lengths > 0) & (lengths < 6)).any()  # every case seen


@pytest.mark.parametrize("options, expected", [
    ({}, ("c0b3334a0fe2cce0", 62, 2342, 1321)),
    ({"share_in_group": False, "min_match": 2, "recall": 1}, ("870dc96dc3767086", 68, 2597, 1285)),
])
def test_proposer_drafts_the_same_tokens_as_before_the_vectorised_step(options, expected):
    """A replayed persistent batch (scripts/profile_vllm_proposer.py: groups of 8, drafts accepted
    up to their first wrong token, condensed rows, a preempted request every 5 steps, the same
    prompts again in a later rollout) gives the drafts the per-row Python implementation gave
    (its hash, recorded before the tracker, learning and drafting were vectorised; fixed budget)."""
    import hashlib
    import json

    from conftest import load_script
    from rollout_graft.vllm import proposer

    bench = load_script("scripts/profile_vllm_proposer.py")
    cls = type("Replayed", (proposer.RLDraftProposer,), {"config": ChainConfig(budget_policy="fixed", **options)})
    prop = cls(bench.vllm_config(6, 64 + 48 + 10))  # a tight max_model_len: the room shrinks at the end
    history = []
    for seed in (0, 0, 1):
        history += bench.replay(prop, 16, length=48, seed=seed, preempt_every=5)
    digest = hashlib.sha256(json.dumps(history).encode()).hexdigest()[:16]
    assert (digest, len(history), prop.stats.draft_tokens, prop.stats.accepted_tokens) == expected


def test_teach_prior_writes_what_update_topk_writes():
    """The proposer's numpy prior update gives update_topk's tables (one successor of weight 1 per
    pair, older ones decayed), repeated tokens within a call included."""
    from rollout_graft.adjacency import EMPTY, AdjacencyIndex
    from rollout_graft.vllm.config import ChainConfig
    from rollout_graft.vllm.proposer import teach_prior

    PRIOR_K, PRIOR_DECAY = ChainConfig().prior_successors, ChainConfig().prior_decay

    ours, ref = AdjacencyIndex.empty(1, 40, PRIOR_K), AdjacencyIndex.empty(1, 40, PRIOR_K)
    rng = np.random.default_rng(0)
    for _ in range(60):
        prev, nxt = rng.integers(0, 40, 30), rng.integers(0, 12, 30)  # few successors: rows fill and repeat
        teach_prior(ours, prev, nxt, PRIOR_DECAY)
        top_i = torch.full((30, PRIOR_K), EMPTY, dtype=torch.long)
        top_i[:, 0] = torch.from_numpy(nxt)
        top_p = torch.zeros(30, PRIOR_K)
        top_p[:, 0] = 1.0
        tokens = torch.from_numpy(prev)
        ref.update_topk(torch.zeros_like(tokens), tokens, top_i, top_p, PRIOR_DECAY)
    assert torch.equal(ours.ids, ref.ids) and torch.equal(ours.probs, ref.probs)
    assert (ours.ids[0, :, PRIOR_K - 1] != EMPTY).any()  # full rows were merged
