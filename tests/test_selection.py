"""Selection for both shapes of verification, on hand-made score tables: each row's top W (our
padded tree forward) and the batch's global top K (vLLM's ragged chains)."""

import numpy as np
import pytest
import torch
from conftest import draft_with_scores

from rollout_graft.selection import global_top_k_depths, keep_best
from rollout_graft.tree import Draft


def kept_tokens(d: Draft) -> list[list[int]]:
    return [[t for t, v in zip(row, valid) if v] for row, valid in zip(d.tokens.tolist(), d.valid.tolist())]


# row 0: a confident chain; row 1: a poor bushy tree
TREES = [
    [(-1, 0.9), (0, 0.8), (1, 0.7), (2, 0.5)],
    [(-1, 0.3), (-1, 0.2), (0, 0.1), (1, 0.05)],
]


def test_per_row_top_w_keeps_each_rows_best_nodes():
    assert kept_tokens(keep_best(draft_with_scores(TREES), 2)) == [[10, 11], [10, 11]]  # .9 .8 | .3 .2
    assert kept_tokens(keep_best(draft_with_scores(TREES), torch.tensor([3, 1]))) == [[10, 11, 12], [10]]
    assert kept_tokens(keep_best(draft_with_scores(TREES), 0)) == [[], []]


def test_ties_keep_ancestor_closure():
    # all three nodes tie; node 2 is node 1's child, so the shallower nodes 0 and 1 go first
    kept = keep_best(draft_with_scores([[(-1, 0.5), (-1, 0.5), (1, 0.5)]]), 2)
    assert kept_tokens(kept) == [[10, 11]]
    chain = [[(-1, 0.5), (0, 0.5), (1, 0.5)]]
    assert kept_tokens(keep_best(draft_with_scores(chain), 2)) == [[10, 11]]  # a chain of ties keeps its prefix
    keep_best(draft_with_scores(chain), 2).validate()
    # across rows (chains, vLLM's shape), a tie goes to the shallower token: row 1's first token before
    # row 0's second
    assert global_top_k_depths(np.array([[0.5, 0.5], [0.5, 0.0]]), 2).tolist() == [1, 1]


def test_global_top_k_is_a_depth_per_row():
    # scores non-increasing along each chain; 0 = no token
    scores = np.array([[0.9, 0.8, 0.1, 0.0],
                       [0.7, 0.6, 0.5, 0.4],
                       [0.0, 0.0, 0.0, 0.0]])
    assert global_top_k_depths(scores, 0).tolist() == [0, 0, 0]
    assert global_top_k_depths(scores, 3).tolist() == [2, 1, 0]  # 0.9 0.8 0.7
    assert global_top_k_depths(scores, 6).tolist() == [2, 4, 0]  # … 0.6 0.5 0.4
    assert global_top_k_depths(scores, 100).tolist() == [3, 4, 0]  # every token, never a missing one
    ties = np.array([[0.5, 0.5, 0.5]])
    assert global_top_k_depths(ties, 2).tolist() == [2]


def test_a_ranking_of_its_own_chooses_the_nodes_and_the_drafts_scores_break_its_ties():
    """`keep_best` by a ranking other than the draft's scores (D-cut's calibrated acceptance): the
    ranking decides, the draft's own scores break its ties, and the kept nodes keep their own scores."""
    draft = draft_with_scores([[(-1, 0.9), (-1, 0.5), (1, 0.4), (-1, 0.3)]])
    ranking = torch.tensor([[0.2, 0.7, 0.7, 0.2]])  # node 1's path is likelier; nodes 0 and 3 tie
    kept = keep_best(draft, 3, ranking)
    assert kept_tokens(kept) == [[10, 11, 12]]  # 11 and its child 12, then 10 (0.9) before 13 (0.3) on the tie
    assert kept.score.tolist() == [[pytest.approx(0.9), pytest.approx(0.5), pytest.approx(0.4)]]


def test_path_min_bounds_every_node_by_its_ancestors():
    """A node is accepted only where its parent is: `Draft.path_min` lowers a value above an ancestor's
    to that ancestor's, so a ranking by it keeps the kept nodes ancestor-closed."""
    draft = draft_with_scores([[(-1, 0.9), (0, 0.8), (1, 0.7), (-1, 0.5)]])
    values = torch.tensor([[0.3, 0.9, 0.6, 0.5]])  # node 1 above its parent; node 2 above its grandparent
    assert draft.path_min(values).tolist() == [[pytest.approx(0.3)] * 3 + [pytest.approx(0.5)]]
    keep_best(draft, 2, draft.path_min(values)).validate()
