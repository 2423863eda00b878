"""The engine's tree D-cut on modelled clocks: real rollouts, each step priced by a clock.

Every arm runs the real engine on the real target with one seed, so every arm emits the tokens
plain sampling emits (seed-exact) and only the steps differ: how many forwards, and how many tree
nodes per row each verified. A `clocks.StepClock` prices each verify forward (its rows, the nodes
each row verified, the rows' contexts) in place of the wall clock; the budget policy sees those
milliseconds too (`clocked`), so D-cut's choices are deterministic and made on the clock it is
judged by. Arms: `plain` (the engine's `ar`), `fixed-wW` (the default retrieval proposer verifying
trees of W nodes per row), `ours-dcut` (D-cut over the same proposer, its cost table the clock's
own profile — what `cost.CostModel.profile` measures on a real device — fresh for every clock);
a cell has the layout of `clock_replay.cells`, judged by its `verdict`.
Modelled throughput = tokens / Σ forward ms: the forward alone (prefill, the proposer's and the
engine's host time are not priced; a roofline's `spec_ms` is charged to every step that verifies a
tree). `engine-cpu/<model>` is the target's own forward-cost table profiled on this machine;
`<GPU>-engine/<model>` the engine's forwards measured on a GPU (`measured_table_clock`).
`pool_cells` is a study on the same runs: how well a cut of a wider proposal keeps what the target
accepts (D-cut cuts from the proposal its last choice led to, `DCut.proposal_after`); `learn_cells`
another: what verifying a node is worth beyond its step, through what the index learns there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from rollout_graft import EngineConfig, RolloutEngine, SamplingParams
from rollout_graft import engine as engine_module
from rollout_graft.cost import DEFAULT_TOKENS, CostModel
from rollout_graft.dcut.core import BudgetDecision
from rollout_graft.dcut.trees import DCut
from rollout_graft.files import read_json
from rollout_graft.selection import keep_best
from rollout_graft.stats import StepTimer

from .clocks import StepClock

WIDTHS = (2, 4, 8, 15, 30, 60)  # the fixed arms' trees: D-cut's widths at the default budget (ratios × 60)
TABLE_BATCHES = (1, 4, 16, 64, 256)
TABLE_CONTEXT = 128  # `CostModel.profile`'s context


@dataclass(frozen=True)
class TableClock:
    """A clock from a forward-cost table (`cost.CostModel`): a step of `rows` rows verifying n
    tokens each costs `table.predict(rows, n)` (context not modelled)."""

    table: CostModel
    name: str
    includes_proposer = False  # a forward-cost table's steps: the forward alone (as a roofline's)

    def step_ms(self, drafts, contexts=None) -> float:
        drafts = np.asarray(drafts)
        return self.table.predict(len(drafts), 1 + int(drafts.max(initial=0)))

    def profile_ms(self, rows, draft_tokens, context=0.0) -> np.ndarray:
        k = np.asarray(draft_tokens, dtype=np.float64)
        return np.array([self.table.predict(rows, 1 + x / rows) for x in np.atleast_1d(k)]).reshape(k.shape)


def measured_table_clock(path: str | Path, model: str, context: int = TABLE_CONTEXT) -> TableClock:
    """A clock from `lab/gpu_verify_cost.py`'s grid: `model`'s verify forwards measured at `context`
    on the GPU the JSON names, as a forward-cost table (`lower_envelope` of the cells; a cell the run
    skipped extrapolated linearly in tokens from the row's last two; a row of fewer than two cells
    dropped). ValueError naming the file when it has no such model or context."""
    data = read_json(path, "a lab/gpu_verify_cost.py JSON")
    found = [m for m in data.get("models", []) if m["model"]["name"] == model]
    cells = [c for c in found[0]["cells"] if c["context"] == context] if found else []
    if not cells:
        raise ValueError(f"{path}: no cells of {model!r} at context {context} (models: "
                         f"{[m['model']['name'] for m in data.get('models', [])]})")
    tokens = sorted({c["tokens"] for c in cells})
    batches, latency = [], []
    for rows in sorted({c["rows"] for c in cells}):
        have = {c["tokens"]: c["ms"] for c in cells if c["rows"] == rows}
        if len(have) < 2:
            continue
        row = []
        for q in tokens:
            if q not in have:  # past the row's last measured cells: the line through its last two
                (q0, y0), (q1, y1) = sorted(have.items())[-2:]
                have[q] = y1 + (y1 - y0) / (q1 - q0) * (q - q1)
            row.append(have[q])
        batches.append(rows)
        latency.append(row)
    gpu = str(data.get("gpu", "GPU")).replace("NVIDIA ", "").split()[0]
    table = CostModel(batches, tokens, lower_envelope(latency), key=f"measured:{gpu}/{model}@{context}")
    return TableClock(table, f"{gpu}-engine/{model}")


def lower_envelope(latency: list[list[float]]) -> list[list[float]]:
    """Each cell the least of itself and every cell of more rows and tokens: a table that never
    decreases, drawn under the noise. A best-of timing errs only upwards (a host hiccup adds time;
    on a host-bound GPU forward, ±20 % from one cell to the next), so the lower envelope is the
    estimate; `cost.CostModel.profile`'s running maximum would carry one slow cell into every wider one."""
    out = [list(row) for row in latency]
    for b in reversed(range(len(out))):
        for q in reversed(range(len(out[b]))):
            later = [out[b][q + 1]] if q + 1 < len(out[b]) else []
            later += [out[b + 1][q]] if b + 1 < len(out) else []
            out[b][q] = min([out[b][q], *later])
    return out


def table_of(clock: StepClock) -> CostModel:
    """The forward-cost table a profile of `clock` would measure (`CostModel.profile`'s grid, batches
    up to 256, at its context)."""
    latency = [[float(clock.profile_ms(b, np.float64((q - 1) * b), TABLE_CONTEXT)) for q in DEFAULT_TOKENS]
               for b in TABLE_BATCHES]
    return CostModel(list(TABLE_BATCHES), list(DEFAULT_TOKENS), latency, key=f"clock:{clock.name}")


@dataclass
class Steps:
    """The verify forwards of the rollouts run inside `clocked`: (rows, tokens per row, contexts) each."""

    shapes: list[tuple[int, int, np.ndarray]] = field(default_factory=list)

    @property
    def row_steps(self) -> int:
        return sum(rows for rows, _, _ in self.shapes)

    @property
    def verified_nodes(self) -> float:
        """Tree nodes verified per row-step (the root not counted)."""
        return sum(rows * (n - 1) for rows, n, _ in self.shapes) / max(self.row_steps, 1)

    def ms(self, clock: StepClock) -> float:
        return sum(clock.step_ms(np.full(rows, n - 1), ctx) for rows, n, ctx in self.shapes)


@contextmanager
def clocked(engine: RolloutEngine, clock: StepClock | None) -> Iterator[Steps]:
    """Inside the block, `engine`'s verify forwards are recorded (`Steps`) and — given `clock` — its
    budget policy sees each step's forward priced by the clock, nothing outside it (`StepTiming`)."""
    steps, runner = Steps(), engine.runner
    verify, timer = runner.verify, engine_module.StepTimer

    def recorded(tokens, positions, mask):
        steps.shapes.append((tokens.shape[0], tokens.shape[1], positions[:, 0].cpu().numpy()))
        return verify(tokens, positions, mask)

    class ClockTimer(StepTimer):
        @contextmanager
        def phase(self, name):
            with self.stats.timed(name, self.sync):
                yield
            if name == "verify":
                rows, n, ctx = steps.shapes[-1]
                self.timing.forward_ms += clock.step_ms(np.full(rows, n - 1), ctx)

    runner.verify = recorded
    if clock is not None:
        engine_module.StepTimer = ClockTimer
    try:
        yield steps
    finally:
        runner.verify = verify
        engine_module.StepTimer = timer


def arms(budget: int = 60) -> dict[str, EngineConfig]:
    """The fixed arms' configurations (`plain`, `fixed-wW`); `ours-dcut` is `dcut_engine`'s."""
    out = {"plain": EngineConfig(method="ar")}
    out.update({f"fixed-w{w}": EngineConfig(method="retrieval", budget=w) for w in WIDTHS if w <= budget})
    return out


def dcut_engine(model, tokenizer, clock: StepClock, budget: int = 60, **dcut_options) -> RolloutEngine:
    """A fresh engine with D-cut over the default retrieval proposer, its cost table `clock`'s profile."""
    cfg = EngineConfig(method="retrieval", budget=budget, budget_policy="dcut")
    if dcut_options:
        cfg = replace(cfg, dcut=replace(cfg.dcut, **dcut_options))
    engine = RolloutEngine(model, cfg, tokenizer=tokenizer)
    engine.policy = DCut(table_of(clock), cfg.budget, cfg.dcut)
    return engine


def rollouts(regime: str, prompt_sets: list[list[list[int]]], group: int,
             params: SamplingParams) -> list[tuple[list, SamplingParams, bool]]:
    """(rows, params, timed) of each rollout a regime runs, one engine through them all (as GRPO's
    steps): `first` — each prompt set once; `revisit` — each twice in a row, a GRPO epoch later with
    another seed (recall holds the first epoch's completions), timed the second time."""
    if regime not in ("first", "revisit"):
        raise ValueError(f"unknown regime {regime!r}; choose 'first' or 'revisit'")
    plan = []
    for i, prompts in enumerate(prompt_sets):
        rows, seeded = [p for p in prompts for _ in range(group)], replace(params, seed=params.seed + 2 * i)
        if regime == "revisit":
            plan.append((rows, seeded, False))
        plan.append((rows, replace(seeded, seed=seeded.seed + 1) if regime == "revisit" else seeded, True))
    return plan


def run(engine: RolloutEngine, plan, clock: StepClock | None) -> tuple[Steps, int, list]:
    """The plan's rollouts on `engine` (`clocked` by `clock`); the timed ones' steps, tokens and completions."""
    timed_steps, tokens, completions = Steps(), 0, []
    for rows, params, timed in plan:
        with clocked(engine, clock) as steps:
            out = engine.generate(rows, params)
        if timed:
            timed_steps.shapes += steps.shapes
            tokens += out.stats.emitted_tokens
            completions += out.completion_ids
    return timed_steps, tokens, completions


def cells(model, tokenizer, prompt_sets: list[list[list[int]]], group: int, regime: str, params: SamplingParams,
          clocks: list[StepClock], **dcut_options) -> list[dict]:
    """One cell per clock: each arm's modelled tokens/s, MAT (tokens per row-step) and verified nodes per row-step
    over the timed rollouts (`rollouts`), and whether every arm emitted the same tokens (seed-exact:
    it must)."""
    plan = rollouts(regime, prompt_sets, group, params)
    fixed = {name: run(RolloutEngine(model, cfg, tokenizer=tokenizer), plan, None) for name, cfg in arms().items()}
    reference = fixed["plain"][2]
    out = []
    for clock in clocks:
        runs = {**fixed, "ours-dcut": run(dcut_engine(model, tokenizer, clock, **dcut_options), plan, clock)}
        out.append({
            "clock": clock.name, "regime": regime, "batch": len(prompt_sets[0]) * group, "rollouts": len(prompt_sets),
            "arms": {n: 1000.0 * tokens / steps.ms(clock) for n, (steps, tokens, _) in runs.items()},
            "mat": {n: tokens / max(steps.row_steps, 1) for n, (steps, tokens, _) in runs.items()},
            "mean_verified_nodes": {n: s.verified_nodes for n, (s, _, _) in runs.items()},
            "seed_exact": all(c == reference for _, _, c in runs.values())})
    return out


class PoolCut(DCut):
    """A study's policy (`pool_cells`): every step proposes `pool` nodes per row and verifies `keep` of
    them, ranked by the proposer's raw scores (`ranking="raw"`) or by D-cut's calibrated acceptance
    (`"calibrated"`, what `DCut.cut` keeps), the calibration learning as D-cut's does."""

    def __init__(self, table: CostModel, pool: int, keep: int, ranking: str):
        if ranking not in ("raw", "calibrated"):
            raise ValueError(f"ranking must be 'raw' or 'calibrated', got {ranking!r}")
        super().__init__(table, pool)  # the budget: every step's proposal
        self.keep, self.ranking = keep, ranking

    def plan(self, rows: int) -> int:
        self.planned = self.budget
        return self.budget

    def cut(self, draft):
        if draft.tokens.shape[1] == 0:
            return draft, BudgetDecision(0.0, 0, 0, float(draft.tokens.shape[0]))
        _, decision, calibrated = self._decide(draft)
        return keep_best(draft, self.keep, calibrated if self.ranking == "calibrated" else None), decision


POOLS = ((15, 15, "raw"), (30, 15, "raw"), (30, 15, "calibrated"), (60, 15, "calibrated"),
         (4, 4, "raw"), (8, 4, "raw"), (8, 4, "calibrated"), (16, 4, "calibrated"),
         (30, 30, "raw"), (60, 30, "calibrated"))
"""(pool, keep, ranking) of `pool_cells`' arms: each kept width from its own proposal, from twice it
ranked both ways, and from four times it calibrated."""


def pool_cells(model, tokenizer, prompt_sets: list[list[list[int]]], group: int, regime: str, params: SamplingParams,
               clock: StepClock, pools=POOLS) -> dict:
    """One cell: for each (pool, keep, ranking), the timed rollouts' MAT (tokens per row-step) and
    modelled tokens/s on `clock` — how well a cut of a wider proposal keeps the nodes the target
    accepts, against the proposer's own tree of the kept width."""
    plan = rollouts(regime, prompt_sets, group, params)
    arms = []
    for pool, keep, ranking in pools:
        engine = RolloutEngine(model, EngineConfig(method="retrieval", budget=pool), tokenizer=tokenizer)
        engine.policy = PoolCut(table_of(clock), pool, keep, ranking)
        steps, tokens, _ = run(engine, plan, clock)
        arms.append({"pool": pool, "keep": keep, "ranking": ranking, "mat": tokens / max(steps.row_steps, 1),
                     "tokens_per_s": 1000.0 * tokens / steps.ms(clock), "forwards": len(steps.shapes)})
    return {"clock": clock.name, "regime": regime, "batch": len(prompt_sets[0]) * group, "arms": arms}


def learn_only_best(engine: RolloutEngine, best: int) -> RolloutEngine:
    """`engine` with its retrieval proposer learning at each row's `best` verified nodes by the
    proposer's raw scores (and the root) only, not at every node it verified: the target's
    distribution at the other nodes, which a verify forward computes anyway, is not put into the
    index. The difference to the unrestricted engine is what verifying those nodes is worth to
    later steps."""
    proposer, last = engine.proposer, {}
    propose, learn = proposer.propose, proposer.observe

    def proposing(ctx, chain=None):
        last["draft"] = draft = propose(ctx, chain)
        return draft

    def observe(ctx, tree, logits, acceptance):  # the proposer's own learning, on a tree whose other nodes are masked
        keep, draft = tree.valid.clone(), last["draft"]
        if draft.tokens.shape[1] + 1 != keep.shape[1]:  # a policy cut the draft: its ranks no longer index the tree
            raise ValueError("learn_only_best needs the whole draft verified under its root: a fixed budget")
        rank = draft.score.masked_fill(~draft.valid, -1.0).argsort(1, descending=True).argsort(1)
        keep[:, 1:] &= rank < best
        learn(ctx, replace(tree, valid=keep), logits, acceptance)

    proposer.propose, proposer.observe = proposing, observe
    return engine


LEARN_ARMS = ((30, None), (60, None), (60, 45), (60, 30))
"""(width, learns at its best …) of `learn_cells`' arms (None: at every verified node, as shipped)."""


def learn_cells(model, tokenizer, prompt_sets: list[list[list[int]]], group: int, regime: str, params: SamplingParams,
                clock: StepClock, arms=LEARN_ARMS) -> dict:
    """One cell: for each (width, learns at), fixed trees of `width` nodes per row whose index learns
    at every verified node or only at each row's best `learns at` (`learn_only_best`), and D-cut
    (width None: `dcut_engine`, deciding on `clock`); the timed rollouts' MAT (tokens per row-step),
    verified nodes per row-step and modelled tokens/s on `clock`. Every arm emits the plain path's
    tokens (seed-exact), so only the forwards differ."""
    plan = rollouts(regime, prompt_sets, group, params)
    out = []
    for width, learns in [*arms, (None, None)]:
        if width is None:
            engine = dcut_engine(model, tokenizer, clock)
        else:
            engine = RolloutEngine(model, EngineConfig(method="retrieval", budget=width), tokenizer=tokenizer)
        if learns is not None:
            learn_only_best(engine, learns)
        steps, tokens, _ = run(engine, plan, clock if width is None else None)
        out.append({"width": width, "learns_at": learns, "mat": tokens / max(steps.row_steps, 1),
                    "verified_nodes": steps.verified_nodes,
                    "tokens_per_s": 1000.0 * tokens / steps.ms(clock), "forwards": len(steps.shapes)})
    return {"clock": clock.name, "regime": regime, "batch": len(prompt_sets[0]) * group, "arms": out}
