"""TokenHistory: per-row text and longest-suffix matching over a group's rows (hand-made buffers)."""

from dataclasses import replace

import torch

from rollout_graft import EngineConfig, RetrievalConfig, RolloutEngine, SamplingParams
from rollout_graft.history import TokenHistory
from rollout_graft.merge import sibling_duplicates


def _history(texts, groups, share=True, width=16, max_rows=16):
    """One distinct prompt per group; rows then append the rest of their text."""
    prompts = [[9]] * (max(groups) + 1)
    h = TokenHistory(prompts, torch.tensor(groups), width, share, "cpu", max_rows)
    for r, t in enumerate(texts):
        h.append(torch.tensor([r]), torch.tensor([t]), torch.tensor([len(t)]))
    return h


def test_append_writes_n_tokens_and_stops_at_width():
    h = _history([[1, 2], [3]], [0, 0], width=4)
    assert h.buf[:, : h.width].tolist() == [[9, 1, 2, -1], [9, 3, -1, -1]]
    h.append(torch.tensor([0, 1]), torch.tensor([[5, 6, 7], [8, 8, 8]]), torch.tensor([3, 1]))
    assert h.buf[:, : h.width].tolist() == [[9, 1, 2, 5], [9, 3, 8, -1]]  # row 0 hit the width: 6, 7 dropped
    assert h.length.tolist() == [4, 3]


def test_match_prefers_the_longest_match_in_a_sibling():
    # row 0 ends with "4 5"; row 1 (sibling) has "3 4 5 6 7", row 2 has "5 8" (a 1-token match)
    h = _history([[3, 4, 5], [1, 3, 4, 5, 6, 7], [5, 8]], [0, 0, 0])
    chain, valid, length = h.match(torch.tensor([0]), max_match=4, depth=3)
    # suffix of row 0 = [9, 3, 4, 5]; row 1 = [9, 1, 3, 4, 5, 6, 7] matches "3 4 5" (3 tokens) → 6 7
    assert length.tolist() == [3]
    assert chain[0, :2].tolist() == [6, 7] and valid.tolist() == [[True, True, False]]


def test_match_never_returns_the_suffix_itself_and_prefers_the_latest():
    # own text [9, 1, 2, 1, 2]: the suffix "1 2" occurs earlier at positions 1-2 → continuation [1, 2]
    h = _history([[1, 2, 1, 2]], [0])
    chain, valid, length = h.match(torch.tensor([0]), max_match=2, depth=2)
    assert length.tolist() == [2] and chain.tolist() == [[1, 2]] and valid.all()
    # text [9, 3, 3, 3, 7, 3, 3]: "3 3" matches ending at positions 2 and 3 (6 is the suffix itself);
    # the latest, 3, continues with 7, 3 (the earlier one would give 3, 7)
    h = _history([[3, 3, 3, 7, 3, 3]], [0])
    chain, valid, length = h.match(torch.tensor([0]), max_match=2, depth=2)
    assert length.tolist() == [2] and chain.tolist() == [[7, 3]]


def test_without_sharing_a_row_reads_only_itself():
    h = _history([[3, 4], [3, 4, 5, 6]], [0, 0], share=False)
    chain, valid, length = h.match(torch.tensor([0]), max_match=2, depth=2)
    assert length.tolist() == [0] and not valid.any()  # "3 4" only in the sibling
    shared = _history([[3, 4], [3, 4, 5, 6]], [0, 0], share=True)
    chain, valid, length = shared.match(torch.tensor([0]), max_match=2, depth=2)
    assert chain.tolist() == [[5, 6]] and valid.all()


def test_groups_do_not_read_each_other_and_max_rows_bounds_readers():
    h = _history([[3, 4], [3, 4, 5, 6], [0], [0]], [0, 1, 0, 0], max_rows=2)
    chain, valid, length = h.match(torch.tensor([0]), max_match=2, depth=2)
    assert not valid.any()  # the match is in another group's row
    assert h.readable.tolist() == [[0, 2], [1, -1], [2, 0], [3, 0]]  # itself, then the group's first other row


def test_min_match_drops_short_matches():
    h = _history([[3, 4], [4, 5]], [0, 0])
    _, valid, length = h.match(torch.tensor([0]), max_match=3, depth=1, min_match=2)
    assert length.tolist() == [0] and not valid.any()


def test_suffix_chain_trees_respect_the_budget_and_are_valid(qwen3_model):
    cfg = EngineConfig(method="retrieval", budget=10, retrieval=RetrievalConfig(suffix_depth=6))
    engine = RolloutEngine(qwen3_model, cfg)
    seen = []
    propose = engine.proposer.propose

    def checked(ctx):
        draft = propose(ctx)
        draft.validate()
        seen.append((int(draft.valid.sum(1).max()), sibling_duplicates(draft)))
        return draft

    engine.proposer.propose = checked
    engine.generate([[5, 6, 7, 5, 6, 7]] * 4, SamplingParams(temperature=1.0, max_new_tokens=24, seed=0))
    assert seen and all(n <= 10 and dup == 0 for n, dup in seen)


def test_group_lead_runs_leaders_first_and_followers_copy_them(qwen3_model):
    """Greedy: every sibling writes the leader's completion, so followers accept whole chains."""
    prompts = [[5, 6, 7]] * 4 + [[8, 9]] * 4
    greedy = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
    ar = RolloutEngine(qwen3_model).generate(prompts, greedy)
    cfg = EngineConfig(method="retrieval", budget=12, group_lead=1,
                       retrieval=RetrievalConfig(suffix_depth=8, use_prior=False))
    out = RolloutEngine(qwen3_model, cfg).generate(prompts, greedy)
    assert out.completion_ids == ar.completion_ids
    assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(ar.logprobs), atol=1e-5)
    # leaders (rows 0, 4) ran alone in the first wave; each of the 6 followers then accepts the
    # leader's chain of 8 + 1 bonus token at least twice in its 24 tokens
    assert out.stats.accept_hist[8] >= 12
    lockstep = RolloutEngine(qwen3_model, replace(cfg, group_lead=0)).generate(prompts, greedy)
    assert lockstep.completion_ids == ar.completion_ids
    assert out.stats.mean_accepted_tokens > lockstep.stats.mean_accepted_tokens + 1.0


def test_recalled_completions_are_read_only_rows_read_first():
    prompts = [[9], [8]]
    h = TokenHistory(prompts, torch.tensor([0, 0, 1]), 12, True, "cpu", max_rows=3, recalled={0: [[1, 2, 3], [4, 5]]})
    assert h.buf[3].tolist()[:4] == [9, 1, 2, 3] and h.buf[4].tolist()[:3] == [9, 4, 5]
    # row 0 reads itself, the two recalled completions of prompt 0, then (no room left) not row 1
    assert h.readable.tolist() == [[0, 3, 4], [1, 3, 4], [2, -1, -1]]
    chain, valid, _ = h.match(torch.tensor([0]), max_match=2, depth=3)
    assert chain.tolist() == [[1, 2, 3]] and valid.all()  # continues like the recalled completion
    h.append(torch.tensor([0, 1]), torch.tensor([[1, 2], [7, 0]]), torch.tensor([2, 1]))
    assert h.completions() == [((9,), [1, 2]), ((9,), [7]), ((8,), [])]


def test_recall_remembers_completions_across_rollouts(qwen3_model):
    """Greedy, same prompts twice: the second rollout copies the remembered completions."""
    prompts = [[5, 6, 7]] * 2 + [[8, 9]] * 2
    greedy = SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)
    ar = RolloutEngine(qwen3_model).generate(prompts, greedy)
    recall = RetrievalConfig(suffix_depth=8, recall=2, use_prior=False)
    engine = RolloutEngine(qwen3_model, EngineConfig(method="retrieval", budget=12, retrieval=recall))
    first, second = engine.generate(prompts, greedy), engine.generate(prompts, greedy)
    assert first.completion_ids == second.completion_ids == ar.completion_ids
    # every row now copies a remembered completion: chains of 8 + 1 bonus, 20 tokens in 3 steps
    assert second.stats.accept_hist[8] >= 8 and second.stats.mean_accepted_tokens > 6.0
    assert engine.proposer.memory[(8, 9)] == [ar.completion_ids[3], ar.completion_ids[2]]  # the 2 latest, newest first

    small = RolloutEngine(qwen3_model, EngineConfig(method="retrieval", budget=12,
                                                    retrieval=replace(recall, recall_prompts=1)))
    small.generate(prompts, greedy)
    small.generate(prompts, greedy)
    assert list(small.proposer.memory) == [(8, 9)]  # recall_prompts=1: the least recently seen prompt was forgotten


def test_recall_needs_suffix_chains():
    import pytest

    with pytest.raises(ValueError, match="suffix_depth"):
        RetrievalConfig(recall=4, suffix_depth=0)
    assert RetrievalConfig(suffix_depth=0).recall == 0  # the default recall follows the suffix chains
    assert RetrievalConfig().recall == 4 and RetrievalConfig().suffix_depth == 8  # GRPO revisits: both on


def test_bad_suffix_and_lead_settings_are_refused(qwen3_model):
    import pytest

    with pytest.raises(ValueError, match="exceeds max_depth"):
        EngineConfig(method="retrieval", max_depth=4, retrieval=RetrievalConfig(suffix_depth=8))
    with pytest.raises(ValueError, match="group_lead needs method='retrieval'"):
        EngineConfig(method="ar", group_lead=1)
    from rollout_graft.proposers import NoProposer

    engine = RolloutEngine(qwen3_model, EngineConfig(method="retrieval", group_lead=1), proposer=NoProposer())
    with pytest.raises(ValueError, match="resume rows"):
        engine.generate([[5, 6]] * 2, SamplingParams(max_new_tokens=4))
