"""NgramCounts: how often each token followed each context of 1…order tokens, for draft chains.

The draft sources of our vLLM proposer are count tables over text: one per GRPO group (its
prompt, every sibling's completion so far, a previous epoch's completions: `TextIndex`) and one
global table over every completion this proposer has seen, kept across rollouts (the prior). A
chain continues a request's text greedily: each next token is the most frequent successor (ties:
the lower token id — tokenizers number frequent tokens first) of the longest context (the last
`order` tokens or fewer, of the text and the chain so far) that the table has seen. Its
confidence is

    count / (total + 0.5) · n / (n + 1)

for a successor seen `count` times among the `total` successors of a context of n tokens: the
successor's share, shrunk for contexts seen rarely (seen once: 2/3, not 1) and for short
contexts (a match of one token says less than a match of four). A chain's scores are the prefix
products: the raw scores the budget policy calibrates against acceptance and ranks by. This is
suffix decoding's estimate (Arctic Inference: count(child) / count(node) along a path of its
suffix tree, whose drafts its `max_spec_factor` bounds by the match length), with contexts of at
most `order` tokens that back off to shorter ones within a chain. By replay
(`scripts/replay_vllm.py`, docs/BENCHMARKS.md "Chains by replay") the two shrink factors raised
MAT at equal draft tokens on every recording; without them the ranking was below suffix decoding's.

Counts do not depend on the order they are made in, and neither does a chain (the tie rule reads
counts and token ids only).

The tables are numba typed dicts, and a step's work is two compiled calls over the whole batch
(`NgramStore.teach`: every new token of every group; `NgramStore.chains`: every request's chains),
because a Python dict update per token and context length cost 45–60 µs per request-step at
batch 256 (docs/BENCHMARKS.md, "The proposer's own time"). A context of at most `MAX_ORDER`
tokens is packed exactly, two tokens (id + 1) per int64 word, right-aligned: `KEY`. The tables of
one proposer live in one `NgramStore` (typed lists of dicts, a slot per table), so a compiled call
reaches every group's table; a table's slot is emptied and reused when its `NgramCounts` is
garbage-collected. `tests/ngram_reference.py` is the same rule in plain Python, which the tests
compare every table and chain with.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np
from numba import njit, types
from numba.typed import Dict, List

SHRINK = 0.5
"""Added to a context's total in a confidence: count / (total + SHRINK)."""

MAX_ORDER = 8
"""Longest context: four int64 words of two tokens each."""

KEY = types.UniTuple(types.int64, 4)  # a context: tokens + 1, two per word, right-aligned (0: no token)
ENTRY = types.UniTuple(types.int64, 3)  # a context's most frequent successor, its count, the context's total
PAIR = types.UniTuple(types.int64, 5)  # (context words, successor) → count, for contexts with ≥ 2 successors


# ---------------------------------------------------------------------- compiled kernels
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
def _add(best, pairs, key, tok: int, c: int) -> None:
    """Count `tok` after context `key` `c` times; the context's best successor stays the most
    frequent (ties: the lower id). `pairs` holds every successor's count once a context has two."""
    hit = best.get(key)
    if hit is None:
        best[key] = (tok, c, c)
        return
    b_tok, b_c, total = hit
    if tok == b_tok:
        best[key] = (tok, b_c + c, total + c)
        if total != b_c:  # other successors were seen: their counts are kept
            pairs[(key[0], key[1], key[2], key[3], tok)] = b_c + c
        return
    if total == b_c:  # the context's second successor: keep the first one's count too
        pairs[(key[0], key[1], key[2], key[3], b_tok)] = b_c
    pk = (key[0], key[1], key[2], key[3], tok)
    n = pairs.get(pk, 0) + c
    pairs[pk] = n
    if n > b_c or (n == b_c and tok < b_tok):
        best[key] = (tok, n, total + c)
    else:
        best[key] = (b_tok, b_c, total + c)


@njit(cache=True)
def _teach(best, pairs, dst, also, tokens, seg_lo, seg_from, seg_end, lo: int, hi: int) -> None:
    """Segment s: `tokens[seg_lo[s]:seg_end[s]]` is a text's end; count each position in
    [seg_from[s], seg_end[s]) as the successor of its contexts of lo…hi tokens (as far back as the
    segment reaches) in table dst[s], and in table also[s] too where ≥ 0."""
    for s in range(len(dst)):
        b, p = best[dst[s]], pairs[dst[s]]
        a = also[s]
        for i in range(seg_from[s], seg_end[s]):
            avail = min(i - seg_lo[s], hi)
            if avail < lo:
                continue
            tok = tokens[i]
            w0 = w1 = w2 = w3 = 0
            for n in range(1, avail + 1):
                w0, w1, w2, w3 = _put(w0, w1, w2, w3, n - 1, tokens[i - n])
                if n >= lo:
                    key = (w0, w1, w2, w3)
                    _add(b, p, key, tok, 1)
                    if a >= 0:
                        _add(best[a], pairs[a], key, tok, 1)


@njit(cache=True)
def _walk(b, win, depth: int, lo: int, hi: int, tok_out, score_out) -> int:
    """The chain continuing `win` (the last `hi` tokens, right-aligned, -1 before the text; it is
    shifted along the chain): the most frequent successor of the longest known context, at most
    `depth` tokens. Contexts are looked up shortest first: a table that knows a context knows its
    shorter suffixes (every position counts all of its lengths), so the first unknown one ends the
    search. Returns the chain's length."""
    m = 0
    score = 1.0
    while m < depth:
        w0 = w1 = w2 = w3 = 0
        found, tok, c, total = 0, 0, 0, 0
        for n in range(1, hi + 1):
            t = win[hi - n]
            if t < 0:
                break
            w0, w1, w2, w3 = _put(w0, w1, w2, w3, n - 1, t)
            if n >= lo:
                hit = b.get((w0, w1, w2, w3))
                if hit is None:
                    break
                found = n
                tok, c, total = hit
        if found == 0:
            break
        score *= c / (total + SHRINK) * found / (found + 1)
        tok_out[m] = tok
        score_out[m] = score
        m += 1
        for j in range(hi - 1):
            win[j] = win[j + 1]
        win[hi - 1] = tok
    return m


@njit(cache=True)
def _chains(best, slots, prior: int, windows, room, lo: int, hi: int, tok_out, score_out, lens) -> None:
    """Row j: the chain of table slots[j] continuing windows[j] (at most room[j] tokens), or the
    prior's where its scores sum to more (prior ≥ 0). Scores past a chain's end stay 0."""
    k = tok_out.shape[1]
    other_tok = np.zeros(k, np.int64)
    other_score = np.zeros(k, np.float64)
    win = np.empty(hi, np.int64)
    for j in range(len(slots)):
        depth = min(room[j], k)
        if depth <= 0:
            continue
        win[:] = windows[j]
        m = _walk(best[slots[j]], win, depth, lo, hi, tok_out[j], score_out[j])
        if prior >= 0:
            win[:] = windows[j]
            m2 = _walk(best[prior], win, depth, lo, hi, other_tok, other_score)
            mine, theirs = 0.0, 0.0
            for i in range(m):
                mine += score_out[j, i]
            for i in range(m2):
                theirs += other_score[i]
            if theirs > mine:
                tok_out[j, :m2] = other_tok[:m2]
                score_out[j, :m2] = other_score[:m2]
                score_out[j, m2:] = 0.0
                m = m2
        lens[j] = m


@njit(cache=True)
def _export(b, p):
    """Every (context words, successor, count) of one table."""
    n = 0
    for key, hit in b.items():
        if hit[1] == hit[2]:
            n += 1
    n += len(p)
    keys = np.empty((n, 4), np.int64)
    succ = np.empty(n, np.int64)
    cnt = np.empty(n, np.int64)
    i = 0
    for key, hit in b.items():
        if hit[1] == hit[2]:  # one successor only: no pairs entries
            keys[i, 0], keys[i, 1], keys[i, 2], keys[i, 3] = key
            succ[i], cnt[i] = hit[0], hit[1]
            i += 1
    for pk, c in p.items():
        keys[i, 0], keys[i, 1], keys[i, 2], keys[i, 3] = pk[0], pk[1], pk[2], pk[3]
        succ[i], cnt[i] = pk[4], c
        i += 1
    return keys, succ, cnt


@njit(cache=True)
def _import(b, p, keys, succ, cnt) -> None:
    for i in range(len(succ)):
        _add(b, p, (keys[i, 0], keys[i, 1], keys[i, 2], keys[i, 3]), succ[i], cnt[i])


def _pack(contexts: np.ndarray) -> np.ndarray:
    """Contexts [n, width ≤ MAX_ORDER] (right-aligned, -1 before a shorter one) → KEY words [n, 4]."""
    full = np.full((len(contexts), MAX_ORDER), -1, dtype=np.int64)
    if contexts.shape[1]:
        full[:, -contexts.shape[1] :] = contexts
    t = (full + 1).reshape(-1, 4, 2)  # two tokens per word: the earlier in the high half
    return (t[:, :, 0] << 32) | t[:, :, 1]


def _unpack(words: np.ndarray, order: int) -> np.ndarray:
    """Inverse of `_pack`: [n, order] tokens, -1 before a shorter context."""
    t = np.stack([words >> 32, words & 0xFFFFFFFF], axis=2).reshape(-1, MAX_ORDER) - 1
    return t[:, MAX_ORDER - order :]


# ---------------------------------------------------------------------- tables
class NgramStore:
    """The count tables of one proposer (a typed list of dicts; a slot per table), and the
    batch-wide compiled calls over them. Contexts of `min_order`…`order` tokens."""

    def __init__(self, order: int = 4, min_order: int = 1):
        if not 1 <= min_order <= order <= MAX_ORDER:
            raise ValueError(f"contexts of min_match={min_order} … max_match={order} tokens: need "
                             f"1 <= min_match <= max_match <= {MAX_ORDER} (a context is packed in four int64 words)")
        self.order, self.min_order = order, min_order
        self.best = List.empty_list(types.DictType(KEY, ENTRY))
        self.pairs = List.empty_list(types.DictType(PAIR, types.int64))
        self.free: list[int] = []  # slots of collected tables, to reuse

    def slot(self) -> int:
        """A new empty table's slot."""
        if self.free:
            return self.free.pop()
        self.best.append(Dict.empty(KEY, ENTRY))
        self.pairs.append(Dict.empty(PAIR, types.int64))
        return len(self.best) - 1

    def clear(self, slot: int) -> None:
        self.best[slot], self.pairs[slot] = Dict.empty(KEY, ENTRY), Dict.empty(PAIR, types.int64)

    def release(self, slot: int) -> None:
        """The table of `slot` is gone: free its memory, reuse the slot."""
        self.clear(slot)
        self.free.append(slot)

    def teach(self, work: list[tuple[NgramCounts, NgramCounts | None, list[int], int, int]]) -> None:
        """For each (table, also, text, start, end): count text[i] after its contexts, i in
        [start, end), in `table` and in `also` (None: not). One compiled call; then a table past
        its `max_contexts` starts over."""
        if not work:
            return
        hi = self.order
        flat: list[int] = []
        lo_, from_, end_, dst, also = [], [], [], [], []
        for table, other, text, start, end in work:
            base = len(flat)
            first = max(start - hi, 0)
            flat.extend(text[first:end])
            lo_.append(base)
            from_.append(base + start - first)
            end_.append(base + end - first)
            dst.append(table.slot)
            also.append(-1 if other is None else other.slot)
        _teach(self.best, self.pairs, np.array(dst, np.int64), np.array(also, np.int64), np.array(flat, np.int64),
               np.array(lo_, np.int64), np.array(from_, np.int64), np.array(end_, np.int64), self.min_order, hi)
        bounded = {id(t): t for t, other, *_ in work for t in (t, other) if t is not None and t.max_contexts is not None}
        for table in bounded.values():
            if len(table) > table.max_contexts:
                table.reset()

    def chains(self, tables: list[NgramCounts], prior: NgramCounts | None, contexts: list[list[int]],
               room: np.ndarray, k: int) -> tuple[list[list[int]], np.ndarray]:
        """Row j: the chain of tables[j] continuing contexts[j] (its last `order` tokens are read;
        at most room[j] ≤ k tokens), or the prior's where its scores sum to more. Returns the
        chains and their scores [rows, k] (prefix products; 0 past a chain's end)."""
        rows, hi = len(tables), self.order
        windows = np.full((rows, hi), -1, dtype=np.int64)
        tails = [c[-hi:] for c in contexts]
        sizes = np.fromiter(map(len, tails), dtype=np.int64, count=rows)
        if rows and sizes.sum():
            r = np.repeat(np.arange(rows), sizes)
            col = hi - np.repeat(sizes, sizes) + (np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes))
            windows[r, col] = [t for tail in tails for t in tail]
        tok = np.zeros((rows, k), dtype=np.int64)
        score = np.zeros((rows, k), dtype=np.float64)
        lens = np.zeros(rows, dtype=np.int64)
        _chains(self.best, np.fromiter((t.slot for t in tables), dtype=np.int64, count=rows),
                -1 if prior is None else prior.slot, windows, np.asarray(room, dtype=np.int64),
                self.min_order, hi, tok, score, lens)
        return [row[:m] for row, m in zip(tok.tolist(), lens.tolist())], score


class NgramCounts:
    """context (`min_order`…`order` tokens) → successor counts, and each context's most frequent
    successor (ties: the lower token id): one table of an `NgramStore` (its own one if none is
    given). `max_contexts`: when the table holds more contexts after a step's counting, it starts
    over from empty (a bound on memory for a table that learns forever)."""

    def __init__(self, order: int = 4, min_order: int = 1, max_contexts: int | None = None,
                 store: NgramStore | None = None):
        store = NgramStore(order, min_order) if store is None else store
        if (store.order, store.min_order) != (order, min_order):
            raise ValueError(f"a table of contexts of {min_order}…{order} tokens cannot live in a store of "
                             f"{store.min_order}…{store.order}")
        self.store, self.order, self.min_order, self.max_contexts = store, order, min_order, max_contexts
        self.slot = store.slot()
        self.resets = 0  # times the table started over (max_contexts)
        weakref.finalize(self, store.release, self.slot).atexit = False

    def __len__(self) -> int:
        """Contexts known."""
        return len(self.store.best[self.slot])

    def clear(self) -> None:
        """Forget every count."""
        self.store.clear(self.slot)

    def reset(self) -> None:
        """Start over past `max_contexts`."""
        self.clear()
        self.resets += 1

    def teach(self, text: list[int], start: int, end: int | None = None, also: NgramCounts | None = None) -> None:
        """Count text[i] as the successor of its preceding contexts, for i in [start, end); `also`
        (a table of the same store) counts them too."""
        if also is not None and also.store is not self.store:
            raise ValueError("`also` must be a table of the same NgramStore")
        self.store.teach([(self, also, text, start, len(text) if end is None else end)])

    def chain(self, context: list[int], depth: int) -> tuple[list[int], list[float]]:
        """Up to `depth` tokens continuing `context` (its last `order` tokens are read) and their
        scores (prefix products of the confidences); stops where no context is known."""
        if depth <= 0:
            return [], []
        chains, scores = self.store.chains([self], None, [context], np.array([depth]), depth)
        return chains[0], scores[0, : len(chains[0])].tolist()

    # ------------------------------------------------------------------ contents and persistence
    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One row per (context, successor): contexts [n, order] (right-aligned, -1 before a
        shorter context), successors [n], counts [n]."""
        words, succ, cnt = _export(self.store.best[self.slot], self.store.pairs[self.slot])
        return _unpack(words, self.order), succ, cnt

    def table(self) -> dict[tuple[int, ...], dict[int, int]]:
        """context → {successor: count} (for tests and inspection)."""
        out: dict[tuple[int, ...], dict[int, int]] = {}
        contexts, succ, cnt = self.rows()
        for row, tok, c in zip(contexts.tolist(), succ.tolist(), cnt.tolist()):
            out.setdefault(tuple(t for t in row if t >= 0), {})[tok] = c
        return out

    def save(self, path: str | Path) -> None:
        """The counts as safetensors: `contexts` [n, order] (right-aligned, -1 before a shorter
        context), `successors` [n] and `counts` [n], one row per (context, successor)."""
        from safetensors.numpy import save_file

        contexts, succ, cnt = self.rows()
        save_file({"contexts": np.ascontiguousarray(contexts), "successors": succ, "counts": cnt,
                   "order": np.array([self.order, self.min_order], dtype=np.int64)}, str(path))

    def load(self, path: str | Path) -> None:
        """Add the counts `save` wrote to this table (same context lengths)."""
        from safetensors.numpy import load_file

        data = load_file(str(path))
        if "contexts" not in data:
            raise ValueError(f"{path} is not an n-gram prior saved by the vLLM backend (keys {sorted(data)}): "
                             "pass the prior.safetensors that `save_state` (or TRL's graft_vllm_state) wrote; "
                             "the engine's adjacency prior (graft_prior.safetensors) is a different table")
        order, min_order = data["order"].tolist()
        if (order, min_order) != (self.order, self.min_order):
            raise ValueError(f"{path} counts contexts of {min_order}…{order} tokens but this table counts "
                             f"{self.min_order}…{self.order}: set min_match={min_order}, max_match={order}")
        _import(self.store.best[self.slot], self.store.pairs[self.slot], _pack(data["contexts"].astype(np.int64)),
                data["successors"].astype(np.int64), data["counts"].astype(np.int64))
