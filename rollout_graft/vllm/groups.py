"""Requests and GRPO groups of vLLM's persistent batch, by request id (docs/DESIGN.md, "The vLLM
backend", step 1).

Before each `propose` our plugin hands the proposer every row's request id and prompt length.
A new id starts a request, whose group is every request with the same prompt; a known id
extends its text with the tokens it sampled (counted lazily, at the next draft, where vLLM's
token array holds them: `RequestTracker.count`); an id missing from a step (finished or
preempted) is kept aside `forget_after` steps at most and taken back when it returns with the
length it left with, or dropped as soon as vLLM reports it finished (`RequestTracker.finish`).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import chain, repeat

import numpy as np

from .ngrams import NgramStore, TextRows

MAX_BACKLOG = 1 << 18
"""Tokens of text that left the batch uncounted (`RequestTracker._settle`) kept for the next
`count`, at most; past it the oldest are dropped uncounted (`RequestTracker.dropped_tokens`).
Text is counted at the next draft; a budget policy that drafted nothing for a long spell (D-cut
keeps probing, at most 1 % of the time; one that never drafts, never) would otherwise hold every
text since in host memory, and its next draft would count them all in one step. 2^18 tokens bound
that count to about a third of a second on this CPU (1.2–1.5 µs a token: RESULTS'
micro-benchmark, a fixed depth's count over its MAT) and the text held to a few MB; a spell that long costs the prior what it did not
count (and a group still running, the text of its requests that finished first). The kept
recordings and replays never reach it (their whole text is smaller)."""


@dataclass(eq=False)
class Group:
    """The requests of one prompt (a GRPO group): its texts — the prompt, completions recalled from
    its earlier rollouts and its requests' (a request's text is its tracker's while it holds a row:
    `text`) — and the table (a slot of `store`) counting their n-grams, released when the group
    is collected. A text added is counted lazily, by its tracker's next `count` (`take`; the group
    joins `pending`, shared by a tracker's groups); a request's new tokens are its tracker's to
    count."""

    prompt: list[int]
    store: NgramStore
    pending: dict[int, "Group"] | None = None  # groups with texts not counted yet (`take`)
    texts: list[list[int] | np.ndarray | None] = field(default_factory=list)  # every text of the group (`text` reads one)
    fresh: list[tuple[int, int]] = field(default_factory=list)  # texts added, not counted yet: (text, from)
    recalled: list[int] = field(default_factory=list)  # text ids of completions from earlier rollouts
    members: list[int] = field(default_factory=list)  # text ids of this rollout's requests
    in_rows: dict[int, "Request"] = field(default_factory=dict)  # text id → its request, while its text is a row
    held: int = 0  # requests of the group a tracker holds (in the batch or away)
    idle: bool = False  # no request can draft from its table again: the table is cleared (`RequestTracker`)
    slot: int = field(init=False)  # the group's table in `store`

    def __post_init__(self) -> None:
        self.slot = self.store.slot()
        weakref.finalize(self, self.store.release, self.slot).atexit = False

    def add(self, tokens: list[int], counted_from: int = 0) -> int:
        """A new text: the prompt, a recalled completion (prompt + completion) or a request's text;
        its positions from `counted_from` on are counted by the next `take` (a sibling's prompt is
        the first text's). Returns its id."""
        self.texts.append(list(tokens))
        tid = len(self.texts) - 1
        if counted_from < len(tokens):
            self.fresh.append((tid, counted_from))
            if self.pending is not None:
                self.pending[id(self)] = self
        return tid

    def take(self) -> list[tuple]:
        """The texts added since the last call, as `NgramStore.teach` work (its table only)."""
        work = [(self.slot, -1, self.texts[tid], start, len(self.texts[tid])) for tid, start in self.fresh]
        self.fresh = []
        if self.pending is not None:
            self.pending.pop(id(self), None)
        return work

    def text(self, tid: int) -> list[int]:
        """Text `tid` as it stands (a request's in the batch is its tracker's: `Request.text`; one
        that left its row is an array, `RequestTracker._to_list`)."""
        if tid in self.in_rows:
            return self.in_rows[tid].text
        text = self.texts[tid]
        return text.tolist() if isinstance(text, np.ndarray) else text

    def completions(self) -> list[list[int]]:
        """Completions known for this prompt, oldest first (recalled ones, then this rollout's)."""
        return [self.text(t)[len(self.prompt) :] for t in self.recalled + self.members]


@dataclass(eq=False)
class Request:
    """A request the tracker holds: its group, its slot, and its text — a row of the tracker's
    text array, or group.texts[text_id] once it moved there (`RequestTracker._to_list`)."""

    group: Group
    text_id: int  # its text in group.texts (None there while its text is a row)
    rid: str  # its vLLM request id
    tracker: "RequestTracker"
    slot: int  # its row in the arrays of per-request state (`RequestTracker.slots`; the proposer's `InFlight`)
    seen: int = 0  # step it was last seen (set when it leaves the batch)

    @property
    def length(self) -> int:
        """Tokens committed (prompt + completion)."""
        return int(self.tracker.length[self.slot])

    @property
    def text(self) -> list[int]:
        row = int(self.tracker.row_of[self.slot])
        return self.tracker.texts[row, : self.length].tolist() if row >= 0 else self.group.text(self.text_id)


def _key(prompt) -> tuple[int, int]:
    """A group's key in `RequestTracker.groups` (its prompt compared in full on a hit)."""
    return len(prompt), hash(tuple(prompt))


def _grown(a: np.ndarray, n: int, fill: int = 0) -> np.ndarray:
    """`a` with room for at least n entries along its first axis (doubling; new entries `fill`)."""
    if n <= len(a):
        return a
    out = np.full((max(n, 2 * len(a)), *a.shape[1:]), fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


class RequestTracker:
    """Maps the rows of each `propose` call to `Request`s (by request id) and their `Group`s.

    A request of a prompt none of whose requests ran at the previous step, or whose group the
    tracker holds no request of any more, starts a new rollout of that prompt (a later GRPO
    epoch): its group is rebuilt with the last `recall` completions
    of the previous rollout as read-only texts.

    State is arrays by request slot (a request keeps its slot while the tracker holds it): its
    length, its text's row in `texts` (an int32 array: the tracker's own copy, since vLLM's row is
    gone once the batch condenses; -1 once the text moved to its group's list, when the rows ran
    out or the request was dropped), the positions counted and its group's table. A step whose
    rows continue the last step's requests is array work only; Python runs per request that
    arrives, returns or leaves.

    After `rows` (or `defer`), the step's arrays are kept for the proposer: `active` (rows that
    sampled), `num` (committed tokens per active row), `lens` (tokens sampled per active row),
    `slots` (each active row's request slot; `started` lists the slots new this step, reused
    ones included, and `by_slot` finds a request), `tables` (its group's table) and `created` (a
    request started this step: its prefill ran).

    Args:
        store: where the groups' tables live (default: `NgramStore()`).
        prior: the slot of `store` every group's completions also teach (-1: none).
        recall: completions of a prompt's previous rollout kept for its next one (0: none).
        max_groups: prompts remembered at most, least recently used dropped first.
        forget_after: steps a request that left the batch is kept for its return (a preempted one).
        shared: the requests of one prompt share one group (else each request has its own,
            with its prompt; nothing is recalled).
    """

    def __init__(self, store: NgramStore | None = None, prior: int = -1, recall: int = 0, max_groups: int = 4096,
                 forget_after: int = 4096, shared: bool = True):
        self.store = NgramStore() if store is None else store  # every group's table
        self.prior, self.recall, self.shared = prior, recall, shared
        self.pending: dict[int, Group] = {}  # groups with text not counted yet: prompts, recalled completions
        self.max_groups, self.forget_after = max_groups, forget_after
        self.groups: OrderedDict[tuple[int, int], Group] = OrderedDict()
        self.slot_of: dict[str, int] = {}  # the requests in the batch (the last step's), by id → slot
        self.away: dict[str, Request] = {}  # requests that left the batch (finished or preempted), by id
        self.by_slot: dict[int, Request] = {}  # every request the tracker holds, by slot
        self.step = 0
        # by slot
        self.length = np.zeros(0, dtype=np.int64)  # tokens committed
        self.row_of = np.zeros(0, dtype=np.int64)  # its text's row in `texts` (-1: it left the batch)
        self.counted = np.zeros(0, dtype=np.int64)  # positions of its text counted (`count`)
        self.table_of = np.zeros(0, dtype=np.int64)  # its group's table
        self.group_seen = np.zeros(0, dtype=np.int64)  # by table: the step a request of the group was last seen
        self.texts = np.zeros((0, 64), dtype=np.int32)  # the texts of the requests in the batch, a row each
        self._free_rows: list[int] = []
        self._left: deque[tuple[Group, int, int, int]] = deque()  # texts moved to lists, to count: (group, text, from, to)
        self._left_tokens = 0  # their tokens (at most `MAX_BACKLOG`)
        self.dropped_tokens = 0  # tokens dropped uncounted past `MAX_BACKLOG`
        self._departed: list[int] = []  # slots of requests that left since the last `count`
        # the last step
        self.active = np.zeros(0, dtype=np.int64)
        self.num = self.lens = np.zeros(0, dtype=np.int64)
        self.slots = np.zeros(0, dtype=np.int64)  # the slot of each active row's request
        self.tables = np.zeros(0, dtype=np.int64)  # and its group's table (a slot of `store`)
        self.created = False
        self.started: list[int] = []  # slots of the requests the last `rows` call started (their state starts empty)
        self.token_ids: np.ndarray | None = None  # the last `rows` call's token ids (vLLM's token_ids_cpu)
        self._ids: list | None = None  # the last step's ids, where every row sampled (`defer`)
        self._n_rows = 0  # the last step's rows (`requests`)
        self.slot_capacity = 0  # slots handed out so far
        self._free_slots: list[int] = []  # slots of requests dropped before the last `rows` call: reused
        self._dropped: list[int] = []  # slots of requests dropped since (their state is read this step still)
        none = np.zeros(0, dtype=np.int64)
        self.store.kern._append_rows(self.texts, none, none, none, none)  # compiled now, not in a timed step
        for num_tokens in (none, none.astype(np.int32)):  # vLLM's num_tokens_no_spec: int32
            self.store.kern._step_rows(self.texts, np.zeros((0, 1), np.int32), none, none, none, none, num_tokens, none,
                                       none, none, 0)

    @property
    def live(self) -> dict[str, Request]:
        """The requests of the last step, by id."""
        return {rid: self.by_slot[slot] for rid, slot in self.slot_of.items()}

    # ------------------------------------------------------------------ the step
    def rows(self, ids: list, prompt_lens, sampled: list[list[int]], num_tokens: np.ndarray,
             token_ids: np.ndarray) -> None:
        """Take this step's rows: each row that sampled (a row that did not — a prefill chunk or an
        empty slot — has no request this step) continues its request, or returns one that left,
        or starts one; the sampled tokens are appended to its text; the last step's requests not
        in a row left the batch. ids / prompt_lens: the request id and prompt length of rows
        0…len(ids)-1 (vLLM's input batch); rows past them are empty. `requests()`: each row's."""
        self._release_dropped()
        if self.defer(ids, sampled, num_tokens, token_ids):
            return
        self.step += 1
        n = min(len(sampled), len(ids))
        lens = np.fromiter(map(len, sampled[:n]), dtype=np.int64, count=n)
        active = np.flatnonzero(lens)
        num, lens = np.asarray(num_tokens[:n], dtype=np.int64)[active], lens[active]
        before = num - lens
        slot_of = self.slot_of
        every = len(active) == n  # every row sampled (no per-row selection)
        rids = ids[:n] if every else [ids[i] for i in active.tolist()]
        slots = np.fromiter(map(slot_of.get, rids, repeat(-1, len(rids))), dtype=np.int64, count=len(rids))
        known = slots >= 0
        known[known] = self.length[slots[known]] == before[known]  # the row continues its request
        self.created, self.started = False, []
        kept = self._mark(slots[known])
        for slot in self.slots[~kept[self.slots]].tolist():  # the last step's requests not continued in a row: they left (or start over)
            self._leave(self.by_slot[slot])
        for j in np.flatnonzero(~known).tolist():  # arrivals: Python per request
            i = int(active[j])
            req = self._returning(ids[i], int(before[j]))
            if req is None:
                plen = int(prompt_lens[i])
                req = self._start(ids[i], token_ids[i, :plen].tolist(), token_ids[i, plen : before[j]].tolist())
                self.created = True
            slots[j] = req.slot
            slot_of[ids[i]] = req.slot
        self._n_rows = len(sampled)
        self._append(slots, num, lens, chain.from_iterable(sampled[:n] if every else [sampled[i] for i in active.tolist()]))
        self.active, self.num, self.lens, self.slots = active, num, lens, slots
        self.tables = self.table_of[slots]
        self.group_seen[self.tables] = self.step
        self.token_ids = token_ids
        self._prune()
        self._ids = list(ids[:n]) if every else None

    def defer(self, ids: list, sampled: list[list[int]], num_tokens: np.ndarray, token_ids: np.ndarray) -> bool:
        """Take a step whose rows are the last step's requests in the same rows, each grown by what
        it sampled (none arrived, left, moved, was preempted or is prefilling): array work only, one
        compiled pass (`_kernels._step_rows`), the new tokens read where vLLM wrote them before the
        call (`token_ids`, its `token_ids_cpu`), not from its lists. Returns False, changing
        nothing, for any other step (take it with `rows`)."""
        n = min(len(sampled), len(ids))
        if self._ids is None or n != len(self._ids) or list(ids[:n]) != self._ids:
            return False
        num_tokens = num_tokens[:n] if isinstance(num_tokens, np.ndarray) else np.asarray(num_tokens[:n], dtype=np.int64)
        num = np.empty(n, dtype=np.int64)
        args = (token_ids, self.row_of, self.length, self.slots, self.num, num_tokens, num, self.group_seen,
                self.tables, self.step + 1)
        done = self.store.kern._step_rows(self.texts, *args)
        if done == 2:  # a text outgrows the rows
            self._widen(int(num_tokens.max()))
            done = self.store.kern._step_rows(self.texts, *args)
        if done:
            return False
        self.step += 1
        self.num, self.lens, self.created, self.started = num, num - self.num, False, []
        self.token_ids = token_ids
        self._prune()
        return True

    def text_from(self, slot: int, start: int) -> list[int]:
        """The text of the request of `slot` from position `start`."""
        row = int(self.row_of[slot])
        if row >= 0:
            return self.texts[row, start : self.length[slot]].tolist()
        return self.by_slot[slot].text[start:]

    def requests(self) -> list[Request | None]:
        """The request of each row of the last step that sampled, by row (None: it did not)."""
        out: list[Request | None] = [None] * self._n_rows
        for i, slot in zip(self.active.tolist(), self.slots.tolist()):
            out[i] = self.by_slot[slot]
        return out

    def _mark(self, slots: np.ndarray) -> np.ndarray:
        """A mask by slot, True at `slots`."""
        mask = np.zeros(self.slot_capacity, dtype=np.bool_)
        mask[slots] = True
        return mask

    def _append(self, slots: np.ndarray, num: np.ndarray, lens: np.ndarray, sampled) -> None:
        """The tokens each active row sampled (`lens` of them, from vLLM's lists: `sampled`, flat)
        appended to its request's row of `texts`, now `num` long."""
        if len(num) and int(num.max()) > self.texts.shape[1]:
            self._widen(int(num.max()))
        tokens = np.fromiter(sampled, dtype=np.int64, count=int(lens.sum()))
        self.store.kern._append_rows(self.texts, self.row_of[slots], num, lens, tokens)
        self.length[slots] = num

    def _widen(self, width: int) -> None:
        wider = np.zeros((len(self.texts), max(width, 2 * self.texts.shape[1])), dtype=np.int32)
        wider[:, : self.texts.shape[1]] = self.texts
        self.texts = wider

    # ------------------------------------------------------------------ arrivals and departures
    def _leave(self, req: Request) -> None:
        """`req` left the batch (away: it may return). Its text keeps its row (counted by the next
        `count`) until the rows run out (`_to_row`) or the request is dropped."""
        del self.slot_of[req.rid]
        req.seen = self.step - 1
        self.away[req.rid] = req
        self._departed.append(req.slot)

    def _to_list(self, req: Request) -> None:
        """`req`'s text from its row to its group's list, as a copy of the row (what is not counted
        yet is counted from there: `_settle`); the row is free. A copy, not a list of Python ints: a
        request leaves its row as soon as vLLM reports it finished, and a list of a 1,000-token
        text took most of the tracker's time in the proposer's micro-benchmark, whose rows all
        finish within a few steps (`lab/profile_vllm_proposer.py --compare`)."""
        row = int(self.row_of[req.slot])
        if row >= 0:
            self._settle(req)
            req.group.texts[req.text_id] = self.texts[row, : req.length].copy()
            req.group.in_rows.pop(req.text_id, None)
            self.row_of[req.slot] = -1
            self._free_rows.append(row)

    def _to_row(self, req: Request) -> None:
        """A row of `texts` for `req`'s text: a free one, else the rows of the requests away move to
        their lists (each request's once), else more rows. The group's list lets its copy go (None
        while the row holds the text): a list of Python ints freed when the request finishes cost
        that step ~10 µs per 1,000 tokens (a scratch timing)."""
        if not self._free_rows:
            for other in self.away.values():
                self._to_list(other)
        if not self._free_rows:
            old = len(self.texts)
            self.texts = _grown(self.texts, old + 1)
            self._free_rows = list(range(len(self.texts) - 1, old - 1, -1))
        row = self._free_rows.pop()
        text = req.group.texts[req.text_id]
        if len(text) > self.texts.shape[1]:
            self._widen(len(text))
        self.texts[row, : len(text)] = text
        self.row_of[req.slot] = row
        req.group.in_rows[req.text_id] = req
        req.group.texts[req.text_id] = None

    def _returning(self, rid, before: int) -> Request | None:
        """The request `rid` returning to the batch (preempted, recomputed; or of the last step, in a
        row whose text is not its own: it left first) if its text is the row's as it stood before
        this step's tokens; else None (it is dropped: the row starts a new request)."""
        req = self.away.pop(rid, None)
        if req is not None and req.length != before:
            self._dropped.append(req.slot)
            return None
        if req is not None and self.row_of[req.slot] < 0:
            self._to_row(req)
        return req

    def finish(self, ids) -> int:
        """Requests vLLM reports finished (its `finished_req_ids`): they will not return, so each
        that left the batch is dropped now, not after `forget_after` steps away, and a group whose
        requests have all gone is idle, its table cleared (`_release_dropped`). Without the report
        (no vLLM runner with our plugin) a finished request waits `forget_after` steps away: every
        table of 4,096 steps of groups stayed in memory, and the store grew with them (1.3 GB after
        20 rollouts of 64 rows × 320 tokens). Returns the requests dropped."""
        dropped = [req.slot for req in map(self.away.pop, ids, repeat(None)) if req is not None]
        self._dropped += dropped
        return len(dropped)

    def _prune(self) -> None:
        if self.step % 256 == 0:
            self._dropped += [r.slot for r in self.away.values() if self.step - r.seen > self.forget_after]
            self.away = {rid: r for rid, r in self.away.items() if self.step - r.seen <= self.forget_after}

    def _release_dropped(self) -> None:
        """Free the slots of the requests dropped last step. A group left without requests is idle:
        no request joins it again (a later request of its prompt starts a new group: `_start`), so
        its table is cleared (its texts stay, for recall); what it still had to count teaches the
        prior only (`_take_work`). Else every prompt remembered kept a table (up to `max_groups`)."""
        for slot in self._dropped:
            req = self.by_slot.pop(slot)
            self._to_list(req)  # its text stays its group's
            group = req.group
            group.held -= 1
            if not group.held and not group.idle:
                group.idle = True
                self.store.clear(group.slot)
        self._free_slots += self._dropped
        self._dropped = []

    def _start(self, rid, prompt: list[int], completion: list[int]) -> Request:
        """A new request: its group (this rollout's of its prompt) and its text, prompt + the
        completion it already has (one the tracker has not seen: forgotten while away)."""
        if not self.shared:  # a group of its own, not remembered
            group = self._new_group(prompt, [])
        else:
            key = _key(prompt)
            group = self.groups.get(key)
            if group is None or group.prompt != prompt or group.idle or self.group_seen[group.slot] < self.step - 1:
                recalled = group.completions()[-self.recall :] if group is not None and self.recall else []
                group = self.groups[key] = self._new_group(prompt, recalled)
                while len(self.groups) > self.max_groups:
                    self.groups.popitem(last=False)
            self.groups.move_to_end(key)
        tid = group.add(prompt + completion, counted_from=len(prompt) + len(completion))  # the tracker counts it
        group.members.append(tid)
        self.group_seen[group.slot] = self.step
        req = Request(group, tid, rid, self, self._slot(), seen=self.step)
        group.held += 1
        self.by_slot[req.slot] = req
        self.started.append(req.slot)
        self.length[req.slot] = len(prompt) + len(completion)
        self.counted[req.slot] = len(prompt)  # the prompt is counted once, as its group's first text
        self.table_of[req.slot] = group.slot
        self._to_row(req)
        return req

    def _slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        self.slot_capacity += 1
        n = self.slot_capacity
        self.length, self.counted, self.table_of = (_grown(a, n) for a in (self.length, self.counted, self.table_of))
        self.row_of = _grown(self.row_of, n, -1)
        return n - 1

    def _new_group(self, prompt: list[int], recalled: list[list[int]]) -> Group:
        group = Group(prompt, self.store, self.pending)
        group.add(prompt)
        group.recalled = [group.add(prompt + completion, counted_from=len(prompt)) for completion in recalled]
        self.group_seen = _grown(self.group_seen, group.slot + 1)
        self.group_seen[group.slot] = 0  # no request yet (a restored group's first one starts a rollout)
        return group

    # ------------------------------------------------------------------ counting
    def waiting(self) -> int:
        """Tokens of the requests' texts not counted yet (those of the batch's rows and of requests that left)."""
        return int((self.length[self.slots] - self.counted[self.slots]).sum()) + self._left_tokens

    def count(self, beside: bool = False) -> None:
        """Count every text not counted yet, in one `NgramStore.teach`: the texts of the requests in
        the batch from their rows of `texts` (each from where its counting stopped to its length:
        no Python per row; those that left since too, while their rows hold them, else from their
        lists: `_settle`) and the groups' new
        texts (prompts, recalled completions). A request's completion teaches its group's table
        and the prior. Callable any time (the texts are the tracker's own, not vLLM's rows).
        `beside`: counted in the store's helper thread while the caller goes on
        (`NgramStore.teach`)."""
        slots = self.slots
        if self._departed:  # those whose rows still hold them (else they count from their lists: `_settle`)
            left = np.unique(self._departed)
            left = left[(self.row_of[left] >= 0) & ~self._mark(slots)[left]]
            slots = np.concatenate([slots, left])
            self._departed = []
        rows = TextRows(self.texts, self.row_of[slots], self.table_of[slots], self.counted[slots], self.length[slots],
                        self.prior)
        self.store.teach(self._take_work(), rows, beside=beside)
        self.counted[slots] = self.length[slots]

    def _settle(self, req: Request) -> None:
        """The request's text not counted yet is counted by the next `count` from its group's list
        (its row is freed)."""
        start = int(self.counted[req.slot])
        if start < req.length:
            self._left.append((req.group, req.text_id, start, req.length))
            self._left_tokens += req.length - start
            self.counted[req.slot] = req.length
            while self._left_tokens > MAX_BACKLOG:  # the oldest go uncounted
                _, _, first, end = self._left.popleft()
                self._left_tokens -= end - first
                self.dropped_tokens += end - first

    def _take_work(self) -> list[tuple]:
        work = [(self.prior, -1, g.texts[tid], start, end) if g.idle else (g.slot, self.prior, g.texts[tid], start, end)
                for g, tid, start, end in self._left if self.prior >= 0 or not g.idle]
        self._left, self._left_tokens = deque(), 0
        return work + [w for g in list(self.pending.values()) for w in g.take()]

    def restore(self, saved: list[tuple[list[int], list[list[int]]]]) -> None:
        """Prompts and their completions (`Group.completions`) saved with a checkpoint: a request
        of one of these prompts starts a rollout that recalls them."""
        for prompt, completions in saved:
            recalled = [list(c) for c in completions][-self.recall :] if self.recall else []
            self.groups[_key(prompt)] = self._new_group(list(prompt), recalled)
        while len(self.groups) > self.max_groups:
            self.groups.popitem(last=False)
