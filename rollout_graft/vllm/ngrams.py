"""NgramStore: how often each token followed each context of `min_order`…`order` tokens, in
count tables (slots of one store: a group's, the prior), and greedy draft chains over them.

A chain token is the most frequent successor (ties: the lower token id) of the longest context
the table has seen; its confidence is count / (total + 0.5) · n / (n + 1) for a context of n
tokens, a chain's scores the prefix products. Counts, and so chains, do not depend on the order
they are made in. The tables are compiled hash tables in numpy arrays (`_kernels`): keys are
(slot, generation, context packed two tokens per int64 word); a cleared or released slot takes
a new generation, whose old rows go at the next rebuild. A table made `apart` (the proposer's
prior, which every completion teaches beside its group's table) lives in a second pair of hash
tables (`Shard`), so a big call counts and walks the two at once, in two threads. Rationale and measurements:
docs/DESIGN.md, "The vLLM backend" (step 3 and the proposer's own time); `tests/ngram_reference.py`
is the same rule in plain Python, which the tests compare every table and chain with.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np

MAX_ORDER = 8
"""Longest context: four int64 words of two tokens each."""


def _pack(contexts: np.ndarray) -> np.ndarray:
    """Contexts [n, width ≤ MAX_ORDER] (right-aligned, -1 before a shorter one) → words [n, 4]."""
    full = np.full((len(contexts), MAX_ORDER), -1, dtype=np.int64)
    if contexts.shape[1]:
        full[:, -contexts.shape[1] :] = contexts
    t = (full + 1).reshape(-1, 4, 2)  # two tokens per word: the earlier in the high half
    return (t[:, :, 0] << 32) | t[:, :, 1]


def _unpack(words: np.ndarray, order: int) -> np.ndarray:
    """Inverse of `_pack`: [n, order] tokens, -1 before a shorter context."""
    t = np.stack([words >> 32, words & 0xFFFFFFFF], axis=2).reshape(-1, MAX_ORDER) - 1
    return t[:, MAX_ORDER - order :]


def _rows(capacity: int) -> np.ndarray:
    """An empty hash table [capacity, 8] whose rows start on 64-byte cache lines (numpy's large
    arrays start 16 bytes past one: every row then spans two lines, and a lookup misses twice)."""
    buf = np.zeros(8 * capacity + 8, np.int64)
    at = (-buf.ctypes.data % 64) // 8
    return buf[at : at + 8 * capacity].reshape(capacity, 8)


SPARE = 4
"""Rows of a hash table per key it holds, at least: a table is rebuilt larger before it is a quarter
full. The chains' walks mostly look up contexts a table lacks (their bisections), and a miss
probes to the next empty row: the fuller the table, the longer. Chosen on the proposer's
micro-benchmark (`lab/profile_vllm_proposer.py --compare`, `SPARE` set by hand: 2, 4 and 8 tried),
not kept; see docs/DESIGN.md."""


def _capacity(rows: int) -> int:
    """Rows of a table holding `rows` keys with `SPARE` rows a key at least (a power of two, at least 1024)."""
    return max(1024, 1 << int(SPARE * rows - 1).bit_length())


def _settled(method):
    """A store method that first waits for the counting a `teach(beside=True)` runs (`settle`)."""

    @functools.wraps(method)
    def settled(self, *args, **kwargs):
        if threading.get_ident() not in self._helper_ident:  # (see `settle`)
            self.settle()
        return method(self, *args, **kwargs)

    return settled


PARALLEL_ROWS = 128
"""A `teach` of at least this many texts (a walk of at least this many rows) runs its two shards'
parts at once, the second in a helper thread (numba releases the GIL). The hand-over costs tens of
µs on this 2-core machine. On the micro-benchmark's batches (`lab/profile_vllm_proposer.py
--compare`, arms `fixed-2threads` against `fixed-1thread`, interleaved in one process, calls 4 ms
apart, rows leaving at a GRPO rollout's rate, wall clock: docs/bench/vllm_proposer_threads.json,
RESULTS) calls of 32 rows took 1.51× as long in two threads as in one, of 64 and 128 rows 0.99×
and 0.96× (the twin's spread in that run: 0.93–1.06×), of 256, 512 and 1,024 rows 0.85×, 0.65×
and 0.71×. The crossover lies between 64 and 256 rows here, unresolved within."""


@dataclass
class Shard:
    """One pair of hash tables (`_kernels`: contexts and successor pairs) and the rows each has taken,
    dead generations included. A store has two: its tables in one, those made `apart` (the prior)
    in the other, so the two can be counted and walked at once."""

    ctx: np.ndarray = field(default_factory=lambda: _rows(1024))
    pairs: np.ndarray = field(default_factory=lambda: _rows(1024))
    used: np.ndarray = field(default_factory=lambda: np.zeros(2, np.int64))


@dataclass
class TextRows:
    """Texts `NgramStore.teach` counts where they are held, in an array (vLLM's `token_ids_cpu`):
    row j counts positions [starts[j], ends[j]) of token_ids[rows[j]] in the table of slots[j] and
    in that of `also` (-1: none)."""

    token_ids: np.ndarray
    rows: np.ndarray
    slots: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    also: int = -1


# ---------------------------------------------------------------------- tables
class NgramStore:
    """The count tables of one proposer, in one pair of hash tables: a table is a slot (an int) of
    the store, holding context (`min_order`…`order` tokens) → successor counts and each context's
    most frequent successor (ties: the lower token id). Every method reads or writes tables by slot;
    `teach` and `chains` are the batch-wide compiled calls."""

    def __init__(self, order: int = 4, min_order: int = 1):
        if not 1 <= min_order <= order <= MAX_ORDER:
            raise ValueError(f"contexts of min_match={min_order} … max_match={order} tokens: need "
                             f"1 <= min_match <= max_match <= {MAX_ORDER} (a context is packed in four int64 words)")
        from . import _kernels  # imported on first use: see there why not before

        self.order, self.min_order = order, min_order
        self.kern = _kernels
        self.shards = [Shard(), Shard()]  # the tables' hash tables; the second: those made `apart`
        self.shard_of = np.zeros(0, np.int64)  # slot → its shard
        self.gens = np.zeros(0, np.int64)  # slot → its table's generation
        self.sizes = np.zeros(0, np.int64)  # slot → contexts its table holds
        self.bounds: dict[int, int] = {}  # slot → contexts past which its table starts over (a bound on memory)
        self.resets: dict[int, int] = {}  # slot → times its table started over past its bound
        self.free: list[int] = []  # released slots, to reuse
        self._helper: ThreadPoolExecutor | None = None  # runs the second shard's part (`_both`)
        self.parallel_rows = PARALLEL_ROWS  # calls this big use the helper (the lab's A/B sets it)
        self._helper_ident: list[int] = []  # the helper thread's (its initializer appends it: `_helper_pool`)
        self._running: tuple[Future, np.ndarray] | None = None  # a `teach(beside=True)` and its segments
        self._warm()

    def _warm(self) -> None:
        """Compile (or load from numba's cache) every kernel now: compiling one in a step vLLM times
        (the first growth of the table, seconds on a fresh install) would feed D-cut's step-cost
        fit and guard an outlier of that size."""
        none = np.zeros(0, np.int64)
        self._teach_shard(0, np.zeros((0, 4), np.int64), none)  # (a teach of no table runs no pass)
        for ids in (np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int32)):  # lists' tokens; the tracker's texts
            self.teach([], TextRows(ids, none, none, none, none))
        for ids in (np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int32)):  # lists' tokens; vLLM's token_ids_cpu
            self.chains_at([], -1, ids, none, none, none, 1)
        empty = np.zeros((0, 1))
        self.kern._prefer(np.zeros((0, 1), np.int64), empty, none, np.zeros((0, 1), np.int64), empty, none)
        sh = self.shards[0]
        for rows, wide in ((sh.ctx, False), (sh.pairs, True)):
            self.kern._rehash(rows, self.kern._live(rows, self.gens), np.zeros_like(rows), wide)
            self.kern._compact(np.zeros_like(rows), np.zeros(len(rows), np.bool_), wide)
        self.kern._import(sh.ctx, sh.pairs, sh.used, self.sizes, 0, 0, np.zeros((0, 4), np.int64), *np.zeros((2, 0), np.int64))

    @_settled
    def slot(self, max_contexts: int | None = None, apart: bool = False) -> int:
        """A new empty table's slot; past `max_contexts` contexts after a `teach` it starts over
        from empty (None: never). `apart`: its hash tables are the store's second shard (the
        prior's: counted and walked beside the others, at once)."""
        slot = self.free.pop() if self.free else len(self.gens)
        if slot == len(self.gens):
            self.gens = np.append(self.gens, 0)
            self.sizes = np.append(self.sizes, 0)
            self.shard_of = np.append(self.shard_of, 0)
        self.shard_of[slot] = int(apart)
        if max_contexts is not None:
            self.bounds[slot], self.resets[slot] = max_contexts, 0
        return slot

    @_settled
    def owner(self, slot: int) -> int:
        """The key prefix of the table of `slot` now."""
        return (slot + 1) << 32 | int(self.gens[slot])

    @_settled
    def clear(self, slot: int) -> None:
        """Empty the table of `slot` (a new generation; the old rows go at the next rebuild)."""
        self._clear(slot)

    def _clear(self, slot: int) -> None:
        self.gens[slot] += 1
        self.sizes[slot] = 0

    @_settled
    def release(self, slot: int) -> None:
        """The table of `slot` is gone: reuse the slot."""
        self._clear(slot)
        self.bounds.pop(slot, None)
        self.resets.pop(slot, None)
        self.free.append(slot)

    @_settled
    def reserve(self, contexts: int, pairs: int, shard: int = 0) -> None:
        """Room for this many new rows in each hash table of `shard` (rebuilt without dead generations)."""
        self._reserve(contexts, pairs, shard)

    def _reserve(self, contexts: int, pairs: int, shard: int, doubling: bool = False) -> None:
        """`reserve`; `doubling`: a table rebuilt takes room for at least as many new keys as it
        holds live (`_grow`). A table never shrinks: where its dead generations make the room, they
        are emptied in place (`_compact`), its memory kept; else it is rebuilt larger."""
        sh = self.shards[shard]
        for i, (name, extra) in enumerate((("ctx", contexts), ("pairs", pairs))):
            rows = getattr(sh, name)
            if SPARE * (int(sh.used[i]) + extra) <= len(rows):
                continue
            live = self.kern._live(rows, self.gens)
            n = int(live.sum())
            room = max(extra, n) if doubling else extra
            if _capacity(n + room) <= len(rows):
                self._compact(shard, i, live)
            else:
                setattr(sh, name, self.kern._rehash(rows, live, _rows(_capacity(n + room)), i == 1))
                sh.used[i] = n

    def _compact(self, shard: int, table: int, live: np.ndarray | None = None) -> None:
        """The dead generations of hash table `table` (0: contexts, 1: pairs) of `shard` emptied in
        place (`_kernels._compact`), its live keys kept: its size and its memory stay. Rebuilt to its
        live keys instead, a table shrank and regrew through every size into memory never touched:
        the groups' tables at each rollout's start, the prior after each start over (scratch timings
        on this VM: 1.1–3.4 s a doubling of the prior from 4M rows up; docs/DESIGN.md, the vLLM backend)."""
        sh = self.shards[shard]
        rows = (sh.ctx, sh.pairs)[table]
        live = self.kern._live(rows, self.gens) if live is None else live
        self.kern._compact(rows, live, table == 1)
        sh.used[table] = int(live.sum())

    @_settled
    def nbytes(self) -> int:
        """Bytes of every hash table."""
        return sum(sh.ctx.nbytes + sh.pairs.nbytes for sh in self.shards)

    @_settled
    def teach(self, work: list[tuple[int, int, list[int], int, int]], rows: TextRows | None = None,
              beside: bool = False) -> None:
        """For each (slot, also, text, start, end): count text[i] after its contexts, i in
        [start, end), in the table of `slot` and in that of `also` (-1: none); and the same for
        texts held in an array (`rows`: no Python per text). One compiled pass per shard (both at
        once: `_both`), which stops where a hash table would pass 1 / `SPARE` full: it is rebuilt
        for twice the keys it holds and the pass goes on (so a table's rows follow what it holds,
        not a pass's worst case). Then a table taught past its bound starts over. `beside`: the
        passes run in the helper thread while the caller goes on (the texts are read now); the
        store's next call waits for them (`settle`), so every call sees the same tables."""
        hi = self.order
        meta = np.fromiter(chain.from_iterable((w[0], w[1], w[3], w[4]) for w in work),
                           dtype=np.int64, count=4 * len(work)).reshape(-1, 4)
        tokens = np.fromiter(chain.from_iterable(w[2][max(w[3] - hi, 0) : w[4]] for w in work), dtype=np.int64)
        if rows is not None:
            more, text = self.kern._gather(rows.token_ids, rows.rows, rows.slots, rows.also, rows.starts, rows.ends, hi)
            meta, tokens = np.concatenate([meta, more]), np.concatenate([tokens, text])
        if beside:  # the texts are read: the rest runs in the helper thread, one shard after the other
            self._running = (self._helper_pool().submit(self._teach_shards, meta, tokens, False), meta)
            return
        self._teach_shards(meta, tokens, len(meta) >= self.parallel_rows)
        self._bound(meta)

    def _teach_shards(self, meta: np.ndarray, tokens: np.ndarray, big: bool) -> None:
        """`teach`'s compiled passes, a shard's each (`_both`; in the helper thread only where both
        shards have work: a hand-over for nothing costs tens of µs)."""
        groups, prior = (self._on_shard(meta, i) for i in range(2))

        def part(shard: int, on: np.ndarray | None):
            return lambda: None if on is None else self._teach_shard(shard, on, tokens)

        self._both(part(0, groups), part(1, prior), big=big and groups is not None and prior is not None)

    def _bound(self, meta: np.ndarray) -> None:
        """A bounded table that `meta`'s segments taught past its bound starts over."""
        slots = meta[:, :2]
        for slot in [s for s, bound in self.bounds.items() if self.sizes[s] > bound]:
            if (slots == slot).any():  # taught by these segments
                self._clear(slot)  # and its dead rows emptied now, in place: its memory stays (`_compact`)
                for table in range(2):
                    self._compact(int(self.shard_of[slot]), table)
                self.resets[slot] += 1

    def settle(self) -> None:
        """Wait for the counting a `teach(beside=True)` runs in the helper thread (its error raised
        here); then a bounded table it took past its bound starts over. Every other method of the
        store calls it first, but in the helper thread itself: a garbage collection there may run
        a group's finalizer (`release`), which would wait for itself."""
        if self._running is not None:
            (done, meta), self._running = self._running, None
            done.result()
            self._bound(meta)

    def _on_shard(self, meta: np.ndarray, shard: int) -> np.ndarray | None:
        """`meta` with the slots of other shards as -1 (their segments are skipped), or None where
        no segment teaches a table of `shard`."""
        on = (meta[:, :2] >= 0) & (self.shard_of[meta[:, :2]] == shard)
        if not on.any():
            return None
        out = meta.copy()
        out[:, :2] = np.where(on, meta[:, :2], -1)
        return out

    def _teach_shard(self, shard: int, meta: np.ndarray, tokens: np.ndarray) -> None:
        sh, orders = self.shards[shard], self.order - self.min_order + 1
        at = np.zeros(3, np.int64)
        while True:
            self.kern._teach(sh.ctx, sh.pairs, sh.used, self.sizes, self.gens, meta, tokens, self.min_order, self.order,
                             at, SPARE, self.kern.AHEAD)
            if at[0] == len(meta):
                return
            self._grow(shard, 2 * orders, 4 * orders)

    def _both(self, first, second, big: bool):
        """first() and second(), the second in the helper thread while the first runs where `big`;
        their results."""
        if not big:
            return first(), second()
        done = self._helper_pool().submit(second)
        try:
            out = first()
        except BaseException:
            wait([done])  # the second part still writes its tables: nothing may touch them before it ends
            raise
        return out, done.result()

    def _helper_pool(self) -> ThreadPoolExecutor:
        """The helper thread's pool. Its initializer holds the list it notes the thread in, not the
        store: the thread lives as long as its pool, and a store it held could not be collected."""
        if self._helper is None:
            ident = self._helper_ident
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="rollout_graft-ngrams",
                                              initializer=lambda: ident.append(threading.get_ident()))
        return self._helper

    def _grow(self, shard: int, contexts: int, pairs: int) -> None:
        """Each hash table of `shard` that `contexts` / `pairs` more keys would fill past 1 /
        `SPARE`, rebuilt without dead generations for twice the live keys it holds (at least): a
        table that filled with dead ones (the groups' of finished rollouts) keeps its size; sized by
        the rows it had taken, dead ones included, it doubled at every rebuild."""
        self._reserve(contexts, pairs, shard, doubling=True)

    def chains(self, slots: list[int], prior: int, contexts: list[list[int]], room: np.ndarray,
               k: int) -> tuple[list[list[int]], np.ndarray]:
        """Row j: the chain of table slots[j] continuing contexts[j] (its last `order` tokens are
        read; at most room[j] ≤ k tokens), or the prior's (-1: none) where its scores sum to more.
        Returns the chains and their scores [rows, k] (prefix products; 0 past a chain's end)."""
        hi = self.order
        tails = np.full((len(contexts), hi), -1, np.int64)  # right-aligned: -1 before a short text
        for j, c in enumerate(contexts):
            if len(c):
                tails[j, -min(len(c), hi) :] = c[-hi:]
        n = len(contexts)
        return self.chains_at(slots, prior, tails, np.arange(n), np.full(n, hi), room, k)

    def chains_at(self, slots, prior: int, token_ids: np.ndarray, rows: np.ndarray, lens: np.ndarray,
                  room: np.ndarray, k: int) -> tuple[list[list[int]], np.ndarray]:
        """`chains` over texts held in an array (vLLM's `token_ids_cpu`): row j's text is
        token_ids[rows[j], :lens[j]]."""
        tok, score, m = self.chain_arrays(slots, prior, token_ids, rows, lens, room, k)
        return [row[:n] for row, n in zip(tok.tolist(), m.tolist())], score

    def chain_arrays(self, slots, prior: int, token_ids: np.ndarray, rows: np.ndarray, lens: np.ndarray,
                     room: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`chains_at` as arrays: tokens [rows, k], scores [rows, k] and each chain's length [rows].
        The walks in the tables of `slots` and those in the prior's run at once (`_both`)."""
        slots, rows = np.asarray(slots, dtype=np.int64), np.asarray(rows, dtype=np.int64)
        lens, room = np.asarray(lens, dtype=np.int64), np.ascontiguousarray(room, dtype=np.int64)
        def walks(tables):
            return lambda: None if tables is None else self._walks(tables, token_ids, rows, lens, room, k)

        priors = np.full(len(slots), prior, np.int64) if prior >= 0 else None
        self.settle()
        (tok, score, m), walked = self._both(walks(slots), walks(priors), big=prior >= 0 and len(slots) >= self.parallel_rows)
        if walked is not None:  # the prior's chain where its scores sum to more
            self.kern._prefer(tok, score, m, *walked)
        return tok, score, m

    def _walks(self, slots: np.ndarray, token_ids, rows, lens, room, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row j's chain in the table of slots[j] (`_kernels._chains`; the tables of one shard)."""
        shard = int(self.shard_of[slots[0]]) if len(slots) else 0
        if (self.shard_of[slots] != shard).any():
            raise ValueError("one call walks the tables of one shard: pass the prior (a table made apart) as `prior`")
        sh = self.shards[shard]
        return self.kern._chains(sh.ctx, self.gens, slots, token_ids, rows, lens, room, k, self.min_order, self.order)[:3]

    def chain(self, slot: int, context: list[int], depth: int) -> tuple[list[int], list[float]]:
        """Up to `depth` tokens of the table of `slot` continuing `context` and their scores (prefix
        products of the confidences); stops where no context is known."""
        if depth <= 0:
            return [], []
        chains, scores = self.chains([slot], -1, [context], np.array([depth]), depth)
        return chains[0], scores[0, : len(chains[0])].tolist()

    # ------------------------------------------------------------------ contents and persistence
    @_settled
    def rows(self, slot: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The table of `slot`, one row per (context, successor), sorted by context and successor (the
        same table gives the same rows): contexts [n, order] (right-aligned, -1 before a shorter
        context), successors [n], counts [n]."""
        k, owner, sh = self.kern, self.owner(slot), self.shards[int(self.shard_of[slot])]
        one = sh.ctx[(sh.ctx[:, k.OWNER] == owner) & (sh.ctx[:, k.BEST_COUNT] == sh.ctx[:, k.TOTAL])]  # no pairs rows
        many = sh.pairs[sh.pairs[:, k.OWNER] == owner]
        # words, successor, count: columns WORD…COUNT of both tables (BEST, BEST_COUNT are SUCC, COUNT's columns)
        rows = np.concatenate([one[:, k.WORD : k.COUNT + 1], many[:, k.WORD : k.COUNT + 1]])
        rows = rows[np.lexsort(rows[:, ::-1][:, 1:].T)]  # by words, then successor
        return _unpack(rows[:, :4], self.order), np.ascontiguousarray(rows[:, 4]), np.ascontiguousarray(rows[:, 5])

    def table(self, slot: int) -> dict[tuple[int, ...], dict[int, int]]:
        """context → {successor: count} of the table of `slot` (for tests and inspection)."""
        out: dict[tuple[int, ...], dict[int, int]] = {}
        contexts, succ, cnt = self.rows(slot)
        for row, tok, c in zip(contexts.tolist(), succ.tolist(), cnt.tolist()):
            out.setdefault(tuple(t for t in row if t >= 0), {})[tok] = c
        return out

    def save(self, slot: int, path: str | Path) -> None:
        """The table of `slot` as safetensors: `contexts` [n, order] (right-aligned, -1 before a
        shorter context), `successors` [n] and `counts` [n], one row per (context, successor), and
        `order` [order, min_order]. Written atomically: an interrupted save leaves the old file."""
        from ..files import atomic_save_safetensors

        contexts, succ, cnt = self.rows(slot)
        atomic_save_safetensors({"contexts": np.ascontiguousarray(contexts), "successors": succ, "counts": cnt,
                                 "order": np.array([self.order, self.min_order], dtype=np.int64)}, path, numpy=True)

    @_settled
    def load(self, slot: int, path: str | Path, vocab: int | None = None) -> None:
        """Add the counts `save` wrote to the table of `slot` (the same shortest context, the longest
        no longer than this store's: a table that knows a context knows its shorter ones, so one of
        shorter contexts loads as it is); ValueError naming the file when it is unreadable or
        malformed (`read_prior`), token ids ≥ `vocab` included."""
        data = read_prior(path, vocab)
        order, min_order = data["order"].tolist()
        if min_order != self.min_order or order > self.order:
            raise ValueError(f"{path} counts contexts of {min_order}…{order} tokens but this table counts "
                             f"{self.min_order}…{self.order}: pass a prior of contexts from {self.min_order} to at most "
                             f"{self.order} tokens")
        succ = data["successors"].astype(np.int64)
        shard = int(self.shard_of[slot])
        self._reserve(len(succ), 2 * len(succ), shard)
        sh = self.shards[shard]
        self.kern._import(sh.ctx, sh.pairs, sh.used, self.sizes, slot, self.owner(slot),
                          _pack(data["contexts"].astype(np.int64)), succ, data["counts"].astype(np.int64))


def read_prior(path: str | Path, vocab: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of a prior `NgramStore.save` wrote, checked: `contexts` [n, order] integer ids
    ≥ -1 (-1 before a shorter context), `successors` [n] ids ≥ 0 (and < `vocab` when given),
    `counts` [n] positive ints, `order` [max_match, min_match], the contexts as a table holds them
    (`_check_contexts`). ValueError naming the file otherwise."""
    from ..files import load_safetensors

    data = load_safetensors(path, "the vLLM proposer's prior", numpy=True)

    def bad(what: str) -> ValueError:
        return ValueError(f"the vLLM proposer's prior {path} {what}: pass the prior.safetensors that `save_state` "
                          "(or TRL's graft_vllm_state) wrote, or save it again")

    if "contexts" not in data and "ids" in data:
        raise bad("is the engine's adjacency prior (graft_prior.safetensors), a different table")
    missing = [k for k in ("contexts", "successors", "counts", "order") if k not in data]
    if missing:
        raise bad(f"lacks {missing} (has {sorted(data)})")
    ctx, succ, cnt, order = data["contexts"], data["successors"], data["counts"], data["order"]
    if any(a.dtype.kind not in "iu" for a in (ctx, succ, cnt, order)):
        raise bad(f"holds non-integer arrays (dtypes {[str(a.dtype) for a in (ctx, succ, cnt, order)]})")
    big = [k for k in ("contexts", "successors", "counts", "order")
           if data[k].size and data[k].dtype.kind == "u" and int(data[k].max()) > np.iinfo(np.int64).max]
    if big:  # read as the store's int64, 2**64 - 1 would become -1
        raise bad(f"holds {big} values above 2**63 - 1 (unsigned 64-bit) that the store's int64 cannot hold")
    data = {k: v.astype(np.int64) if k in ("contexts", "successors", "counts", "order") else v for k, v in data.items()}
    ctx, succ, cnt, order = data["contexts"], data["successors"], data["counts"], data["order"]
    if order.shape != (2,) or not 1 <= order[1] <= order[0] <= MAX_ORDER:
        raise bad(f"has order {order.tolist()}, want [max_match, min_match] with 1 <= min_match <= max_match <= {MAX_ORDER}")
    n = len(succ)
    if ctx.shape != (n, int(order[0])) or succ.shape != (n,) or cnt.shape != (n,):
        raise bad(f"has contexts {list(ctx.shape)}, successors {list(succ.shape)}, counts {list(cnt.shape)}: want "
                  f"[n, {int(order[0])}], [n], [n]")
    if n and (ctx.min() < -1 or succ.min() < 0):
        raise bad("holds negative token ids")
    if n and (cnt.min() < 1):
        raise bad("holds counts below 1")
    if vocab is not None and n and max(int(ctx.max()), int(succ.max())) >= vocab:
        raise bad(f"holds token id {max(int(ctx.max()), int(succ.max()))} outside the model's vocabulary [0, {vocab})")
    if n:
        _check_contexts(ctx, int(order[1]), bad)
    return data


def _check_contexts(ctx: np.ndarray, min_order: int, bad) -> None:
    """A saved table's contexts are right-aligned (-1 only before a context), of min_order tokens
    or more, and suffix-closed: a context's suffix one token shorter is a context too (a position
    is counted after each of its contexts). The chains' walks rely on the last (`_kernels._chains`
    bisects the known lengths), so a table without it would silently draft from shorter contexts."""
    tokens = ctx >= 0
    if (tokens[:, :-1] & ~tokens[:, 1:]).any():
        raise bad("holds a context with -1 after a token (a context is right-aligned: -1 only before its first token)")
    lengths = tokens.sum(axis=1)
    if (lengths < min_order).any():
        raise bad(f"holds a context of {int(lengths.min())} tokens, fewer than its min_match {min_order}")
    longer = np.flatnonzero(lengths > min_order)
    shorter = ctx[longer]  # each with its first token dropped
    shorter[np.arange(len(longer)), ctx.shape[1] - lengths[longer]] = -1
    known, wanted = np.sort(_row_hash(ctx)), _row_hash(shorter)
    ordered = np.sort(wanted)  # sorted queries: the search runs along `known`
    missing = known[np.minimum(np.searchsorted(known, ordered), len(known) - 1)] != ordered
    if missing.any():
        row = longer[np.argmax(wanted == ordered[np.argmax(missing)])]
        raise bad(f"is not suffix-closed: context {ctx[row][tokens[row]].tolist()} is counted but its suffix "
                  f"{ctx[row][tokens[row]][1:].tolist()} is not (a table `save` wrote always is)")


def _row_hash(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of token ids (for membership: a collision can only let a missing
    context pass)."""
    h = np.zeros(len(rows), np.uint64)
    with np.errstate(over="ignore"):
        for col in (rows + 1).astype(np.uint64).T:
            h = (h ^ col) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(29)
    return h
