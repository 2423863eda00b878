"""Selection for both shapes of verification, on hand-made score tables: each row's top W (our
padded tree forward) and the batch's global top K (vLLM's ragged chains)."""

import torch

from conftest import draft_with_scores

from rollout_graft.selection import keep_best, keep_global_best
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


def test_global_top_k_keeps_the_batchs_best_nodes():
    # the batch's scores, best first: .9 .8 .7 .5 (row 0) .3 .2 .1 .05 (row 1)
    assert kept_tokens(keep_global_best(draft_with_scores(TREES), 3)) == [[10, 11, 12], []]
    assert kept_tokens(keep_global_best(draft_with_scores(TREES), 6)) == [[10, 11, 12, 13], [10, 11]]
    assert kept_tokens(keep_global_best(draft_with_scores(TREES), 0)) == [[], []]
    # chains (vLLM's shape): a prefix of each chain, i.e. a depth per request
    chains = [[(-1, 0.6), (0, 0.3)], [(-1, 0.5), (0, 0.45), (1, 0.4)]]
    assert keep_global_best(draft_with_scores(chains), 3).valid.sum(1).tolist() == [1, 2]


def test_ties_keep_ancestor_closure():
    # all three nodes tie; node 2 is node 1's child, so the shallower nodes 0 and 1 go first
    kept = keep_best(draft_with_scores([[(-1, 0.5), (-1, 0.5), (1, 0.5)]]), 2)
    assert kept_tokens(kept) == [[10, 11]]
    chain = [[(-1, 0.5), (0, 0.5), (1, 0.5)]]
    assert kept_tokens(keep_best(draft_with_scores(chain), 2)) == [[10, 11]]  # a chain of ties keeps its prefix
    keep_best(draft_with_scores(chain), 2).validate()
    # across rows, a tie goes to the shallower node: row 1's depth-1 node before row 0's depth-2 node
    tied = [[(-1, 0.5), (0, 0.5)], [(-1, 0.5)]]
    assert kept_tokens(keep_global_best(draft_with_scores(tied), 2)) == [[10], [10]]
