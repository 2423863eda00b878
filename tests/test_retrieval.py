"""AdjacencyIndex, templates and the retrieval proposer, on hand-written tensors."""

import pytest
import torch
from conftest import random_model

from rollout_graft import EngineConfig, RetrievalConfig, RolloutEngine, SamplingParams
from rollout_graft.adjacency import EMPTY, AdjacencyIndex
from rollout_graft.templates import TemplateConfig, best_first, breadth_first, make_template
from rollout_graft.tree import TreeBatch


def probs_row(vocab, mass):  # mass: {token: prob}
    p = torch.zeros(vocab)
    for t, m in mass.items():
        p[t] = m
    return p


def test_update_writes_topk_and_last_writer_wins():
    index = AdjacencyIndex.empty(groups=2, vocab=6, k=2)
    group = torch.tensor([0, 0, 1, 0])
    tokens = torch.tensor([3, 4, 3, 3])
    probs = torch.stack([
        probs_row(6, {1: 0.7, 2: 0.2, 5: 0.1}),  # group 0, token 3 (overwritten below)
        probs_row(6, {0: 0.9, 1: 0.1}),  # group 0, token 4
        probs_row(6, {5: 1.0}),  # group 1, token 3: only one successor with mass
        probs_row(6, {2: 0.6, 4: 0.4}),  # group 0, token 3 again: the last write wins
    ])
    index.update(group, tokens, probs)
    assert index.ids[0, 3].tolist() == [2, 4]
    assert index.ids[0, 4].tolist() == [0, 1]
    assert index.ids[1, 3].tolist() == [5, EMPTY]  # zero-mass successors are not stored
    assert index.ids[1, 4].tolist() == [EMPTY, EMPTY]  # other groups untouched
    assert index.probs[0, 3].float().tolist() == pytest.approx([0.6, 0.4], abs=1e-3)


def test_breadth_first_template_shape():
    t = breadth_first(n_slots=7, depth=3, width=2)
    # level 1: ranks 0,1 of the root; level 2: two children each; level 3: one left
    assert t.parents.tolist() == [-1, -1, 0, 0, 1, 1, 2]
    assert t.ranks.tolist() == [0, 1, 0, 1, 0, 1, 0]
    assert t.depth.tolist() == [1, 1, 2, 2, 2, 2, 3]


def test_best_first_template_is_asymmetric_and_adapts_to_slots():
    acc = (0.6, 0.2, 0.1)
    t = best_first(n_slots=5, depth=4, width=3, rank_acceptance=acc)
    # scores: r0=.6, r00=.36, r000=.216, r1=.2, r0000=.1296 (beats r01=.12 and r2=.1)
    assert t.depth.tolist() == [1, 1, 2, 3, 4]
    assert t.ranks.tolist() == [0, 1, 0, 0, 0]
    assert t.parents.tolist() == [-1, -1, 0, 2, 3]
    small, big = best_first(3, 8, 3, acc), best_first(40, 8, 3, acc)
    assert small.size == 3 and big.size == 40 and int(big.depth.max()) > int(small.depth.max())
    # higher-ranked successors get more children
    kids = lambda tpl, node: int((tpl.parents == node).sum())  # noqa: E731
    assert kids(big, 0) >= kids(big, 1)


def test_lookup_follows_template_and_propagates_validity():
    index = AdjacencyIndex.empty(groups=1, vocab=8, k=2)
    index.update(torch.tensor([0, 0, 0]), torch.tensor([1, 2, 3]), torch.stack([
        probs_row(8, {2: 0.8, 3: 0.2}),  # 1 → 2 (.8), 3 (.2)
        probs_row(8, {4: 1.0}),  # 2 → 4
        probs_row(8, {5: 0.6, 6: 0.4}),  # 3 → 5 (.6), 6 (.4)
    ]))
    tpl = breadth_first(n_slots=6, depth=2, width=2)  # parents [-1,-1,0,0,1,1]
    d = index.lookup(torch.tensor([0, 0]), torch.tensor([1, 7]), tpl)
    d.validate()
    # row 0, root 1: level 1 = [2, 3]; level 2 = children of 2 ([4, empty]) and of 3 ([5, 6])
    assert d.tokens[0].tolist() == [2, 3, 4, 0, 5, 6]
    assert d.valid[0].tolist() == [True, True, True, False, True, True]
    assert d.score[0].tolist() == pytest.approx([0.8, 0.2, 0.8, 0.0, 0.12, 0.08], abs=1e-3)
    assert not d.valid[1].any()  # root 7 has never been seen
    c = d.compacted()
    c.validate()
    assert c.tokens[0, :5].tolist() == [2, 3, 4, 5, 6] and c.parents[0, :5].tolist() == [-1, -1, 0, 1, 1]


def test_trees_respect_budget_and_are_well_formed():
    model = random_model("qwen3")
    engine = RolloutEngine(model, EngineConfig(method="retrieval", budget=10))
    seen = []
    orig = engine.proposer.propose

    def spy(ctx):
        d = orig(ctx)
        d.validate()
        seen.append(d)
        tree = TreeBatch.from_draft(ctx.last_token, d)
        for b in range(d.tokens.shape[0]):  # no duplicate sibling tokens
            for parent in range(-1, d.tokens.shape[1]):
                kids = d.tokens[b][(d.parents[b] == parent) & d.valid[b]].tolist()
                assert len(kids) == len(set(kids))
        assert tree.tokens.shape[1] <= 11
        return d

    engine.proposer.propose = spy
    engine.generate([[5, 6, 7]] * 4, SamplingParams(max_new_tokens=30, seed=0))
    assert seen and all(int(d.valid.sum(1).max()) <= 10 for d in seen)
    assert any(d.valid.any() for d in seen)


def test_group_sharing_feeds_siblings():
    """With sharing, a sibling drafts what another sibling's verification wrote."""
    model = random_model("qwen3")
    params = SamplingParams(temperature=0, max_new_tokens=40)
    prompts = [[5, 6, 7]] * 4
    shared = RolloutEngine(model, EngineConfig(method="retrieval", budget=20,
                                               retrieval=RetrievalConfig(use_prior=False)))
    alone = RolloutEngine(model, EngineConfig(method="retrieval", budget=20,
                                              retrieval=RetrievalConfig(share_in_group=False, use_prior=False)))
    a, b = shared.generate(prompts, params), alone.generate(prompts, params)
    assert a.completion_ids == b.completion_ids  # lossless either way
    assert a.stats.mean_accepted_tokens == pytest.approx(b.stats.mean_accepted_tokens)  # greedy rows move in lockstep


def test_prior_persists_saves_and_loads(tmp_path):
    model = random_model("qwen3")
    alone = RetrievalConfig(suffix_depth=0)  # the prior alone (recall would copy the first rollout)
    engine = RolloutEngine(model, EngineConfig(method="retrieval", budget=20, retrieval=alone))
    params = SamplingParams(temperature=0, max_new_tokens=30)
    first = engine.generate([[5, 6, 7]], params)
    path = tmp_path / "prior.safetensors"
    engine.proposer.save_prior(path)
    second = engine.generate([[5, 6, 7]], params)  # the prior learned the first rollout
    assert second.completion_ids == first.completion_ids
    assert second.stats.mean_accepted_tokens > first.stats.mean_accepted_tokens
    cfg = EngineConfig(method="retrieval", budget=20, retrieval=RetrievalConfig(prior_path=str(path), suffix_depth=0))
    loaded = RolloutEngine(model, cfg).generate([[5, 6, 7]], params)
    assert loaded.stats.mean_accepted_tokens == pytest.approx(second.stats.mean_accepted_tokens)
    with pytest.raises(ValueError, match="vocabulary"):
        RolloutEngine(random_model("qwen3", vocab=32), cfg)


def test_template_config_validation():
    with pytest.raises(ValueError, match="kind"):
        TemplateConfig(kind="8_4_32")
    with pytest.raises(ValueError, match="exceeds"):
        RetrievalConfig(top_k=4, template=TemplateConfig(width=8))
    assert make_template(TemplateConfig(), 60).size == 60


def test_merge_keeps_older_successors_behind_fresh_ones():
    index = AdjacencyIndex.empty(groups=1, vocab=8, k=3)
    g, t = torch.tensor([0]), torch.tensor([1])
    index.update(g, t, probs_row(8, {2: 0.6, 3: 0.3, 4: 0.1}).unsqueeze(0))  # 1 → 2 .6, 3 .3, 4 .1
    index.update(g, t, probs_row(8, {5: 0.9, 3: 0.1}).unsqueeze(0), decay=0.5)  # a sibling saw 1 → 5
    # union: 5 .9 (new), 2 .3 (old .6 × .5), 3 max(.1 new, .15 old) = .15, 4 .05 → top-3
    assert index.ids[0, 1].tolist() == [5, 2, 3]
    assert index.probs[0, 1].float().tolist() == pytest.approx([0.9, 0.3, 0.15], abs=2e-3)
    index.update(g, t, probs_row(8, {6: 1.0}).unsqueeze(0), decay=0.0)  # decay 0 overwrites
    assert index.ids[0, 1].tolist() == [6, EMPTY, EMPTY]


def test_second_order_context_wins_over_first_order():
    index = AdjacencyIndex.empty(groups=1, vocab=8, k=2, context_rows=16)
    g = torch.tensor([0, 0])
    # token 3 seen after 1 → successor 4; token 3 seen after 2 → successor 5 (written last)
    index.update(g, torch.tensor([3, 3]), torch.stack([probs_row(8, {4: 1.0}), probs_row(8, {5: 1.0})]),
                 prev=torch.tensor([1, 2]))
    tpl = breadth_first(n_slots=1, depth=1, width=1)
    root, rows = torch.tensor([3, 3, 3]), torch.tensor([0, 0, 0])
    d = index.lookup(rows, root, tpl, prev_root=torch.tensor([1, 2, 7]))
    # context (1,3) → 4; (2,3) → 5; unseen (7,3) backs off to the first-order row (last write: 5)
    assert d.tokens[:, 0].tolist() == [4, 5, 5]
    first_order = index.lookup(rows, root, tpl)  # no previous token: first order only
    assert first_order.tokens[:, 0].tolist() == [5, 5, 5]


def test_second_order_context_with_prompts_of_one_or_two_tokens():
    """context_order=2 learns (previous token, token) pairs: a step or prompt without any previous
    token merged zero rows (an IndexError from deep inside) instead of none."""
    model = random_model("qwen3")
    plain = RolloutEngine(model)
    params = SamplingParams(temperature=0, max_new_tokens=6)
    for context_rows in (None, 1):
        engine = RolloutEngine(model, EngineConfig(method="retrieval", retrieval=RetrievalConfig(
            context_order=2, context_rows=context_rows)))
        for prompts in ([[3]] * 2, [[3, 4]] * 2, [[3, 4, 5, 6]] * 2):
            assert engine.generate(prompts, params).completion_ids == plain.generate(prompts, params).completion_ids


def test_graft_saves_its_retrieval_prior(tmp_path):
    from rollout_graft import DraftConfig

    model = random_model("qwen3")
    draft = random_model("qwen3", seed=1)
    draft_cfg = DraftConfig(depth=2, checkpoints=(0,), thresholds=(0.3,), split=((0, 8),))
    engine = RolloutEngine(model, EngineConfig(method="graft", budget=12, draft=draft_cfg), draft_model=draft)
    engine.generate([[5, 6, 7]] * 2, SamplingParams(temperature=0, max_new_tokens=8))
    engine.proposer.save_prior(tmp_path / "p.safetensors")
    assert AdjacencyIndex.load(tmp_path / "p.safetensors").vocab == 64
