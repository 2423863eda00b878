"""method="graft": drafter trees, calibrated pruning, retrieval grafting — lossless and well-formed."""


import pytest
import torch
from conftest import random_model
from test_lossless import PROMPTS, assert_logprobs_match_recompute, chi2_pvalue, exact_two_token_probs
from transformers import Qwen3Config, Qwen3ForCausalLM

import rollout_graft.proposers.graft as graft_module
from rollout_graft import DraftConfig, EngineConfig, RolloutEngine, SamplingParams, calibrate
from rollout_graft.assets import TINY_DRAFT, TINY_TARGET, load_tiny_prompts
from rollout_graft.dcut.core import BudgetDecision
from rollout_graft.dcut.trees import TreePolicy
from rollout_graft.merge import merge_trees, sibling_duplicates, token_paths
from rollout_graft.proposers.drafter import check_same_vocabulary
from rollout_graft.pruning import draft_quota, fit_thresholds, pruning_stage, separating_thresholds
from rollout_graft.selection import keep_best
from rollout_graft.tree import DRAFT, RETRIEVAL, Draft
from rollout_graft.verify import accepted_along

MAX_NEW = 16
VARIANTS = {  # the ablations are options of the one method
    "dense-draft": DraftConfig(prune=False, graft=False),
    "prune-only": DraftConfig(graft=False),
    "fixed-split": DraftConfig(prune=False, adaptive_split=False),
    "graft": DraftConfig(),
}


def small_draft(vocab: int = 64, seed: int = 1, sharp: float = 4.0):
    """A 1-layer random drafter with the target's vocabulary (a *wrong* drafter)."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                      eos_token_id=1, pad_token_id=0, bos_token_id=2, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharp)
    return model


def graft_engine(target, draft, dcfg=None, budget=60, **kw):
    return RolloutEngine(target, EngineConfig(method="graft", budget=budget, draft=dcfg or DraftConfig(), **kw),
                         draft_model=draft)


# ---------------------------------------------------------------------- losslessness
@pytest.mark.parametrize("drafter", ["perfect", "wrong"])
def test_greedy_graft_variants_equal_ar(qwen3_model, drafter):
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    ar = RolloutEngine(qwen3_model).generate(PROMPTS, greedy)
    draft = qwen3_model if drafter == "perfect" else small_draft()
    for name, dcfg in VARIANTS.items():
        out = graft_engine(qwen3_model, draft, dcfg).generate(PROMPTS, greedy)
        assert out.completion_ids == ar.completion_ids, name
        assert out.finish_reasons == ar.finish_reasons, name
        if drafter == "perfect" and name == "dense-draft":  # the target drafts itself: its greedy chain is in the tree
            assert out.stats.mean_accepted_tokens > 2.0


@pytest.mark.parametrize("params,drafter", [
    (SamplingParams(temperature=1.0, max_new_tokens=2, ignore_eos=True, seed=1), "wrong"),
    (SamplingParams(temperature=0.7, top_k=6, max_new_tokens=2, ignore_eos=True, seed=2), "perfect"),
    (SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=2, ignore_eos=True, seed=3), "wrong"),
], ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}" if isinstance(p, SamplingParams) else p)
def test_graft_sampling_matches_target_distribution(params, drafter):
    model = random_model("qwen3", vocab=16, seed=7, sharp=5.0)
    prompt, n = [3, 4, 5, 3, 4, 6, 5, 3], 4000
    probs = exact_two_token_probs(model, prompt, params)
    draft = model if drafter == "perfect" else small_draft(16, seed=3, sharp=5.0)
    dcfg = DraftConfig(thresholds=(0.5, 0.3, 0.05))  # prune often so retrieval nodes are verified too
    out = graft_engine(model, draft, dcfg, budget=30).generate([prompt] * n, params)
    assert out.stats.mean_accepted_tokens > 1.1  # the trees were actually used
    assert chi2_pvalue([tuple(c) for c in out.completion_ids], probs) > 1e-4


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_graft_logprobs_equal_full_recompute(qwen3_model, temperature):
    params = SamplingParams(temperature=temperature, top_k=20, max_new_tokens=16, seed=11)
    out = graft_engine(qwen3_model, small_draft(), budget=20).generate(PROMPTS, params)
    assert_logprobs_match_recompute(qwen3_model, PROMPTS, out, temperature)


def test_graft_seeded_runs_repeat(qwen3_model):
    prompts = [[5, 6, 7]] * 6 + [[9, 10]] * 2
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=123)
    draft = small_draft()
    a = graft_engine(qwen3_model, draft).generate(prompts, params)
    b = graft_engine(qwen3_model, draft).generate(prompts, params)
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert len({tuple(c) for c in a.completion_ids[:6]}) > 1  # siblings are independent samples
    c = graft_engine(qwen3_model, draft).generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16, seed=124))
    assert c.completion_ids != a.completion_ids


# ---------------------------------------------------------------------- pruning and split
def test_pruning_stage_from_confidence_table():
    tau = (0.3, 0.15, 0.05)  # checkpoints at levels 0, 1, 5
    best = torch.tensor([
        [0.20, 0.10, 0.01],  # unsure at the root: stops at checkpoint 0
        [0.90, 0.10, 0.01],  # sure at level 0, unsure at level 1: stops at checkpoint 1
        [0.90, 0.60, 0.04],  # stops at the deep checkpoint (level 5)
        [0.90, 0.60, 0.30],  # never pruned
        [0.30, 0.15, 0.05],  # exactly at τ is not below it: never pruned
    ])
    assert pruning_stage(best, tau).tolist() == [0, 1, 2, 3, 3]


def test_draft_quota_follows_the_paper_split_and_scales():
    stage = torch.tensor([0, 1, 2, 3])
    assert draft_quota(stage, DraftConfig(), 60).tolist() == [8, 24, 40, 60]  # retrieval: 52 / 36 / 20 / 0
    assert draft_quota(stage, DraftConfig(), 30).tolist() == [4, 12, 20, 30]
    fixed = DraftConfig(prune=False, adaptive_split=False, fixed_draft_nodes=40)
    assert draft_quota(stage, fixed, 60).tolist() == [40, 40, 40, 40]


def test_fit_thresholds_maximises_accepted_tokens():
    # one checkpoint; columns: tokens accepted by the pruned+grafted tree, by the dense tree.
    # Unsure rows (best < 0.5) do better grafted, sure rows do better dense: τ = 0.5 separates them.
    best = torch.tensor([[0.9], [0.8], [0.6], [0.5], [0.4], [0.3], [0.2], [0.1]]).repeat(3, 1)
    accepted = torch.tensor([[1, 4], [0, 3], [2, 3], [1, 2], [2, 1], [1, 0], [3, 0], [1, 1]]).repeat(3, 1)
    assert fit_thresholds(best, accepted, (0.7,)) == (pytest.approx(0.5),)
    assert fit_thresholds(best[:4], accepted[:4], (0.7,)) == (0.7,)  # too few observations: keep τ
    never = torch.tensor([[0, 2]]).repeat(24, 1)  # pruning never helps: τ = 0
    assert fit_thresholds(best, never, (0.7,)) == (0.0,)


def test_separating_thresholds_split_accepted_from_rejected_rows():
    # checkpoint level 0: rows with best ≥ 0.5 got ≥ 1 draft token accepted by the dense tree, the others none
    best = torch.tensor([[0.9], [0.8], [0.6], [0.5], [0.4], [0.3], [0.2], [0.1]]).repeat(3, 1)
    dense_accepted = torch.tensor([2, 1, 3, 1, 0, 0, 0, 0]).repeat(3)
    assert separating_thresholds(best, dense_accepted, (0,), (0.7,)) == (pytest.approx(0.5),)
    assert separating_thresholds(best, torch.zeros(24, dtype=torch.long), (0,), (0.7,)) == (1.0,)  # always rejected


def test_accepted_along_counts_the_walk_prefix_in_a_tree():
    tree = Draft.from_lists([[(5, -1), (6, 0), (7, 1), (8, -1)], [(3, -1)]])
    walk = torch.tensor([[5, 6, 9, -1], [4, 3, -1, -1]])  # row 0 walked 5 → 6, then drew 9; row 1 drew 4
    assert accepted_along(tree, walk, torch.tensor([3, 1])).tolist() == [2, 0]


def test_drafter_stops_at_checkpoints(qwen3_model):
    """τ = 1 stops every tree at level 0 (≤ top_k draft nodes); τ = 0 never stops."""
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=0)
    # budget 4: no node deeper than 4 can be kept, so the drafter expands no deeper (not 7 levels)
    for tau, stage, max_depth, budget in (((1.0, 1.0, 1.0), 0, 1, 60), ((0.0, 0.0, 0.0), 3, 7, 60),
                                          ((0.0, 0.0, 0.0), 3, 4, 4)):
        engine = graft_engine(qwen3_model, qwen3_model, DraftConfig(thresholds=tau, graft=False), budget=budget)
        seen = []
        expand = engine.proposer.drafter.expand
        engine.proposer.drafter.expand = lambda ctx, stop=None: seen.append(expand(ctx, stop)) or seen[-1]
        engine.generate([[5, 6, 7], [8, 9]], params)
        for ex in seen:
            drafted = ex.best[:, 0] > 0  # a row with one token left drafts nothing and reaches no checkpoint
            assert ex.stage[drafted].tolist() == [stage] * int(drafted.sum())
            assert ex.stage[drafted].tolist() == pruning_stage(ex.best, tau)[drafted].tolist()
        assert max(ex.nodes.max_depth for ex in seen) == max_depth


# ---------------------------------------------------------------------- tree surgery
def test_merge_trees_unions_identical_paths():
    # draft tree: root → 5 → 6 → 7 ; root → 8
    draft = Draft.from_lists([[(5, -1), (6, 0), (7, 1), (8, -1)]])
    draft.score = torch.tensor([[0.5, 0.4, 0.2, 0.3]])
    # retrieval tree: root → 5 → 6 → 9 ; root → 5 → 4 ; root → 3
    retr = Draft.from_lists([[(5, -1), (3, -1), (6, 0), (4, 0), (9, 2)]])
    retr.score = torch.tensor([[0.7, 0.1, 0.6, 0.05, 0.3]])
    retr.source.fill_(RETRIEVAL)
    merged = merge_trees(draft, retr)
    merged.validate()
    assert sibling_duplicates(merged) == 0
    assert token_paths(merged, 0) == {(5,), (5, 6), (5, 6, 7), (8,), (5, 6, 9), (5, 4), (3,)}
    assert int(merged.valid.sum()) == 7  # 4 draft + 5 retrieval − 2 shared paths
    by_path = {}
    for i in range(7):
        path = next(p for p in token_paths(Draft(merged.tokens, merged.parents, merged.depth,
                                                     torch.arange(7).view(1, -1) <= i, merged.score, merged.source), 0)
                    if len(p) == int(merged.depth[0, i]) and p[-1] == int(merged.tokens[0, i]))
        by_path[path] = (float(merged.score[0, i]), int(merged.source[0, i]))
    assert by_path[(5,)] == (pytest.approx(0.7), DRAFT)  # merged: draft source, larger score
    assert by_path[(5, 6, 9)] == (pytest.approx(0.3), RETRIEVAL)


def test_graft_trees_within_budget_superset_and_well_formed(qwen3_model, monkeypatch):
    pairs = []
    finish = graft_module.GraftProposer._finish

    def spy(self, ctx, nodes, quota):
        out = finish(self, ctx, nodes, quota)
        pairs.append((keep_best(nodes, quota), out))  # (the pruned draft tree, the grafted tree)
        return out

    monkeypatch.setattr(graft_module.GraftProposer, "_finish", spy)
    budget = 20
    engine = graft_engine(qwen3_model, small_draft(), DraftConfig(thresholds=(0.5, 0.3, 0.05)), budget=budget)
    engine.generate([[5, 6, 7]] * 4 + [[8, 9]] * 2, SamplingParams(temperature=1.0, max_new_tokens=30, seed=0))
    assert pairs
    grafted = 0
    for pruned, merged in pairs:
        merged.validate()
        assert sibling_duplicates(merged) == 0
        assert int(merged.valid.sum(1).max()) <= budget
        for r in range(merged.tokens.shape[0]):
            assert token_paths(pruned, r) <= token_paths(merged, r)  # grafted ⊇ pruned draft tree
        grafted += int((merged.valid & (merged.source == RETRIEVAL)).sum())
    assert grafted > 0  # retrieval actually filled freed slots


class Scripted(TreePolicy):
    """Decodes plainly without proposing where `skips` says True, else verifies the whole draft."""

    def __init__(self, budget: int, skips: list[bool]):
        self.budget, self.skips = budget, iter(skips)

    def plan(self, rows: int) -> int:
        return 0 if next(self.skips) else self.budget

    def cut(self, draft):
        return draft, BudgetDecision(1.0 if draft.tokens.shape[1] else 0.0)


@pytest.mark.parametrize("window", [64, 2])
def test_drafter_catches_up_after_steps_dcut_skipped(qwen3_model, monkeypatch, window):
    """A budget policy may decode plainly without proposing (`plan` → 0): the drafter then feeds the skipped
    tokens on its next proposal, at most FEED_WINDOW of them. With the target as its own drafter,
    greedy, and the whole skipped span fed (window 64), every proposing step accepts its whole
    chain — a drafter whose cache fell out of step would not. With a window shorter than the span
    (2) its cache has gaps: drafts may be worse, the output is the same."""
    import rollout_graft.proposers.drafter as drafter_module

    monkeypatch.setattr(drafter_module, "FEED_WINDOW", window)
    fed = []  # width of every block a proposal fed
    block = drafter_module.DrafterProposer._pending_block

    def spy(self, right=True):
        out = block(self, right)
        if right:  # a block fed to the drafter (left-aligned ones only collapse pending steps)
            fed.append(out[0].shape[1])
        return out

    monkeypatch.setattr(drafter_module.DrafterProposer, "_pending_block", spy)

    greedy = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    prompts = [[5, 6, 7]] * 2 + [[9, 10]] * 2
    ar = RolloutEngine(qwen3_model).generate(prompts, greedy)
    engine = graft_engine(qwen3_model, qwen3_model, DraftConfig(prune=False, graft=False, top_k=1, beam=1, depth=6),
                          budget=8)
    engine.policy = Scripted(8, ([True] * 3 + [False] * 2) * 100)  # 3 plain steps, then 2 proposing steps, …
    out = engine.generate(prompts, greedy)
    assert out.completion_ids == ar.completion_ids
    spec = [t for t in out.stats.budget_trace if t["ratio"] > 0]
    plain = [t for t in out.stats.budget_trace if t["candidates"] == 0]  # skipped: nothing proposed
    assert len(spec) >= 4 and len(plain) >= len(spec)
    assert max(fed) == min(window, 7 + 3)  # after 3 plain steps: the last proposal's 7 tokens + 3
    if window == 64:  # each proposing step emits the drafter's 6-token chain + the bonus token (the last may be cut short)
        assert all(t["actual"] == 7 * t["rows"] for t in spec[:-1]), [t["actual"] for t in spec]


def test_drafter_pending_steps_collapse_when_rows_leave_and_prefill_waits_for_a_proposal(qwen3_model, monkeypatch):
    from rollout_graft.proposers.drafter import DrafterProposer
    from rollout_graft.runner import ModelRunner

    drafter = DrafterProposer(DraftConfig(), ModelRunner(small_draft()), max_depth=8)
    drafter.start([[5, 6, 7], [9, 10]], torch.tensor([0, 0, 1]), None, SamplingParams())
    drafter.advance(torch.tensor([[11, 12, 0], [13, 0, 0], [14, 15, 16]]), [2, 1, 3])
    drafter.advance(torch.tensor([[17, 0], [18, 19], [20, 0]]), [1, 2, 1])
    block, n = drafter._pending_block()  # right-aligned
    assert block.tolist() == [[-1, 7, 11, 12, 17], [-1, 7, 13, 18, 19], [10, 14, 15, 16, 20]] and n == [4, 4, 5]
    drafter.select_rows(torch.tensor([0, 2]))  # row 1 finished: the steps collapse into one block
    assert len(drafter.pending) == 1
    block, n = drafter._pending_block()
    assert block.tolist() == [[-1, 7, 11, 12, 17], [10, 14, 15, 16, 20]] and n == [4, 5]
    assert drafter.runner.cache is None and drafter._row_prompt.tolist() == [0, 1]  # nothing prefilled yet

    # a rollout whose budget policy decodes plainly throughout never runs the drafter
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    engine = graft_engine(qwen3_model, small_draft())
    engine.policy = Scripted(8, [True] * 1000)
    out = engine.generate(PROMPTS, greedy)
    assert out.completion_ids == RolloutEngine(qwen3_model).generate(PROMPTS, greedy).completion_ids
    assert engine.proposer.drafter.runner.cache is None


def test_graft_with_suffix_chains_is_exact_and_matches_once_per_step(qwen3_model, monkeypatch):
    """Suffix chains in the grafted retrieval: greedy output unchanged, and the suffix match runs
    once per step although graft builds retrieval trees of several sizes."""
    from rollout_graft.config import RetrievalConfig
    from rollout_graft.history import TokenHistory

    calls = []
    match = TokenHistory.match
    monkeypatch.setattr(TokenHistory, "match", lambda self, *a, **k: calls.append(1) or match(self, *a, **k))
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    ar = RolloutEngine(qwen3_model).generate(PROMPTS, greedy)
    engine = graft_engine(qwen3_model, small_draft(), DraftConfig(thresholds=(0.5, 0.3, 0.05)), budget=30,
                          retrieval=RetrievalConfig(suffix_depth=6))
    out = engine.generate(PROMPTS, greedy)
    assert out.completion_ids == ar.completion_ids
    assert len(calls) == out.stats.target_forwards


def test_group_index_learns_during_graft(qwen3_model):
    engine = graft_engine(qwen3_model, small_draft())
    before = int((engine.proposer.retrieval.prior.ids >= 0).sum())
    engine.generate([[5, 6, 7]] * 4, SamplingParams(temperature=1.0, max_new_tokens=20, seed=0))
    assert int((engine.proposer.retrieval.prior.ids >= 0).sum()) > before
    assert int((engine.proposer.retrieval.index.ids >= 0).sum()) > before


# ---------------------------------------------------------------------- calibration, config, errors
def test_calibrate_fits_saves_and_loads(qwen3_model, tmp_path):
    engine = graft_engine(qwen3_model, qwen3_model)
    path = tmp_path / "tau.json"
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=0)
    taus = calibrate(engine, [[5, 6, 7]] * 4 + [[9, 10]] * 4, params, path=path)
    assert len(taus) == 3 and all(0.0 <= t <= 1.0 for t in taus)
    with pytest.raises(ValueError, match="objective"):
        calibrate(engine, [[5, 6, 7]], objective="youden")
    assert engine.proposer.thresholds == taus
    loaded = graft_engine(qwen3_model, qwen3_model, DraftConfig(thresholds_path=str(path)))
    assert loaded.proposer.thresholds == pytest.approx(taus)
    with pytest.raises(ValueError, match="checkpoints"):
        graft_engine(qwen3_model, qwen3_model, DraftConfig(checkpoints=(0, 2), thresholds=(0.1, 0.1),
                                                           split=((0, 8), (2, 24)), thresholds_path=str(path)))


def test_bad_drafter_is_refused(qwen3_model):
    with pytest.raises(ValueError, match="vocabulary has 32 entries"):
        graft_engine(qwen3_model, small_draft(vocab=32))
    with pytest.raises(ValueError, match="needs a draft model"):
        RolloutEngine(qwen3_model, EngineConfig(method="graft"))

    class Tok:
        def __init__(self, vocab, eos=1):
            self.vocab, self.eos_token_id, self.bos_token_id, self.pad_token_id = vocab, eos, None, None

        def get_vocab(self):
            return self.vocab

    same = {"a": 0, "b": 1}
    check_same_vocabulary(64, 64, Tok(same), Tok(dict(same)))
    with pytest.raises(ValueError, match="maps 2 tokens differently"):
        check_same_vocabulary(64, 64, Tok(same), Tok({"a": 1, "b": 0}))
    with pytest.raises(ValueError, match="eos_token_id"):
        check_same_vocabulary(64, 64, Tok(same), Tok(same, eos=0))


@pytest.mark.skipif(not (TINY_TARGET / "config.json").exists(), reason="embedded tiny models not built")
def test_tiny_pair_from_pretrained_greedy_equals_ar():
    prompts = [row["prompt"] for row in load_tiny_prompts("test")[:1]]
    engine = RolloutEngine.from_pretrained(TINY_TARGET, EngineConfig(method="graft"), draft_model=TINY_DRAFT)
    rows = [ids for ids in engine.tokenizer(prompts, add_special_tokens=False)["input_ids"] for _ in range(2)]
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    out = engine.generate(rows, greedy)
    assert out.completion_ids == RolloutEngine(engine.model).generate(rows, greedy).completion_ids
    assert out.stats.mean_accepted_tokens > 2.0  # the trained drafter agrees with the target most of the time


def test_draft_config_validation():
    with pytest.raises(ValueError, match="one threshold"):
        DraftConfig(thresholds=(0.1,))
    with pytest.raises(ValueError, match="nothing to graft"):
        DraftConfig(prune=False)
    with pytest.raises(ValueError, match="checkpoints"):
        DraftConfig(depth=4)  # checkpoint level 5 is never reached
    assert EngineConfig(method="graft").draft == DraftConfig()
