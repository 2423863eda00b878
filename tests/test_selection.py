"""Selection for both shapes of verification, on hand-made score tables: each row's top W (our
padded tree forward) and the batch's global top K (vLLM's ragged chains)."""

import numpy as np
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
