"""Calibrated pruning at checkpoint levels and the draft/retrieval split (DESIGN.md §2 step 2).

A row's tree is checked only at a few checkpoint levels (default {0, 1, 5}; level d = draft
depth d + 1). At checkpoint c the best cumulative confidence among the level's nodes is compared
with τ_c; below it the tree stops growing there, and the row's budget N is split by that stage:
`split[c]` draft nodes, N − split[c] retrieval slots (never stopped: all N to the drafter).

τ is calibrated from a warm-up run that replays every pruning stage at once: each step builds
the tree every stage would give (same drafter expansion, cut at that stage's level, with that
stage's split and grafted retrieval), verifies their union, and counts the tokens each stage's
tree accepts along the verified walk (the walk's draws are shared, so this is each tree's own
acceptance, exactly). Two objectives:

- "accepted": τ maximises the mean accepted tokens when every row takes the stage its
  confidences select (coordinate ascent over confidence quantiles, from "never prune", ties to
  the least pruning). Graft then never verifies fewer expected tokens than the dense tree on the
  warm-up data; when retrieval never beats the drafter's own nodes, τ = 0 (pruning off).
- "separation" (ECHO-style): at checkpoint level d a row is positive when the dense tree got a
  draft node at level d accepted (≥ d + 1 tokens); τ_d maximises Youden's J = TPR − FPR of
  "best confidence ≥ τ_d". This prunes whenever the drafter is likely wrong — it saves drafter
  forwards — whatever retrieval offers instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch

from .config import DraftConfig, SamplingParams
from .tree import Draft

CalibrationObjective = Literal["accepted", "separation"]
MIN_CALIBRATION_ROWS = 16
"""With fewer warm-up observations (row-steps) than this, calibrate keeps the current thresholds."""


def pruning_stage(best: torch.Tensor, thresholds: torch.Tensor | tuple[float, ...]) -> torch.Tensor:
    """First checkpoint where a row's best confidence falls below τ; n_checkpoints = never.

    best: [rows, n_checkpoints] best cumulative confidence at each checkpoint level.
    Returns [rows] int64.
    """
    tau = torch.as_tensor(thresholds, dtype=best.dtype, device=best.device)
    below = best < tau  # [rows, C]
    never = torch.full_like(below[:, :1], True)
    return torch.cat([below, never], 1).int().argmax(1)


def draft_quota(stage: torch.Tensor, cfg: DraftConfig, budget: int) -> torch.Tensor:
    """Draft nodes each row keeps: by pruning stage (adaptive) or fixed; scaled from split_budget."""
    scale = budget / cfg.split_budget
    if not cfg.adaptive_split:
        return torch.full_like(stage, min(budget, round(cfg.fixed_draft_nodes * scale)))
    table = [min(budget, round(n * scale)) for _, n in cfg.split] + [budget]  # stage → draft nodes
    return torch.tensor(table, dtype=torch.long, device=stage.device)[stage]


def accepted_along(draft: Draft, path: torch.Tensor, n_path: torch.Tensor) -> torch.Tensor:
    """Tokens of `path` a tree accepts: the longest prefix of the walk that is a chain from its root.

    draft: [rows, m]; path: [rows, D] tokens of a verified walk (accepted + last draw); n_path: [rows].
    Returns [rows] int64.
    """
    rows = path.shape[0]
    cur = torch.full((rows,), -1, dtype=torch.long, device=path.device)  # -1 = the root
    accepted = torch.zeros(rows, dtype=torch.long, device=path.device)
    if draft.tokens.shape[1] == 0:
        return accepted
    alive = torch.ones(rows, dtype=torch.bool, device=path.device)
    for j in range(path.shape[1]):
        match = draft.valid & (draft.parents == cur.view(-1, 1)) & (draft.tokens == path[:, j : j + 1])  # [rows, m]
        alive = alive & match.any(1) & (j < n_path)
        cur = torch.where(alive, match.float().argmax(1), cur)
        accepted += alive
    return accepted


def fit_thresholds(best: torch.Tensor, accepted: torch.Tensor, current: tuple[float, ...],
                   quantiles: int = 40, rounds: int = 4) -> tuple[float, ...]:
    """τ maximising the mean accepted tokens when each row takes the stage τ selects.

    best: [N, C] best confidence at each checkpoint; accepted: [N, C + 1] tokens the tree of each
    stage (C = never pruned) accepted; current: kept when there are too few observations.
    """
    n, c_max = best.shape
    if n < MIN_CALIBRATION_ROWS:
        return tuple(current)
    best, accepted = best.float(), accepted.float()
    grid = torch.linspace(0, 1, quantiles + 1)
    observed = [torch.quantile(best[:, c], grid, interpolation="lower") for c in range(c_max)]  # τ candidates
    cands = [torch.unique(torch.cat([torch.tensor([0.0, 1.0]), q])) for q in observed]
    gain = lambda t: float(accepted.gather(1, pruning_stage(best, t).view(-1, 1)).mean())  # noqa: E731
    tau = [0.0] * c_max  # start from never pruning
    for _ in range(rounds):
        for c in range(c_max):
            values = [gain(tau[:c] + [float(v)] + tau[c + 1 :]) for v in cands[c]]
            top = max(values)
            tau[c] = float(cands[c][next(i for i, v in enumerate(values) if v >= top - 1e-9)])  # least pruning
    return tuple(tau)


def separating_thresholds(best: torch.Tensor, dense_accepted: torch.Tensor, checkpoints: tuple[int, ...],
                          current: tuple[float, ...]) -> tuple[float, ...]:
    """τ per checkpoint maximising Youden's J (see the module docstring).

    best: [N, C]; dense_accepted: [N] tokens the unpruned tree accepted; current: kept when too few data.
    """
    taus = []
    for c, level in enumerate(checkpoints):
        seen = best[:, c] > 0  # level reached
        x, pos = best[seen, c].double(), dense_accepted[seen] >= level + 1
        n_pos, n_neg = int(pos.sum()), int((~pos).sum())
        if n_pos + n_neg < MIN_CALIBRATION_ROWS:
            taus.append(current[c])
        elif n_neg == 0 or n_pos == 0:
            taus.append(0.0 if n_neg == 0 else 1.0)  # the drafter always / never gets through: never / always prune
        else:
            cand = torch.unique(torch.cat([x, x.new_zeros(1)]))
            keep = x.view(1, -1) >= cand.view(-1, 1)  # [T, N] predicted positive (continue)
            j = (keep & pos).sum(1).double() / n_pos - (keep & ~pos).sum(1).double() / n_neg
            taus.append(float(cand[torch.argmax(j)]))
    return tuple(taus)


def save_thresholds(path: str | Path, checkpoints: tuple[int, ...], thresholds: tuple[float, ...], **extra) -> None:
    data = {"checkpoints": list(checkpoints), "thresholds": list(thresholds), **extra}
    Path(path).write_text(json.dumps(data, indent=1))


def load_thresholds(path: str | Path, checkpoints: tuple[int, ...]) -> tuple[float, ...]:
    data = json.loads(Path(path).read_text())
    if tuple(data["checkpoints"]) != tuple(checkpoints):
        raise ValueError(f"{path} was calibrated for checkpoints {data['checkpoints']} but the config uses "
                         f"{list(checkpoints)}: re-run calibrate() with this config")
    return tuple(float(t) for t in data["thresholds"])


def calibrate(engine, prompts: list[list[int]], params: SamplingParams | None = None,
              path: str | Path | None = None, objective: CalibrationObjective = "accepted") -> tuple[float, ...]:
    """Fit τ from a warm-up rollout of `engine` (method "graft") over `prompts`, install it in the
    engine's proposer and, when `path` is given, save it as JSON (load it with
    `DraftConfig(thresholds_path=...)`). `objective`: see the module docstring. During the warm-up
    every step verifies the union of all stages' trees (so it may exceed the budget); the outputs
    are still exact target samples."""
    proposer = engine.proposer
    if not hasattr(proposer, "calibration_log"):
        raise ValueError("calibrate() needs an engine built with EngineConfig(method='graft')")
    if objective not in ("accepted", "separation"):
        raise ValueError(f"unknown calibration objective {objective!r}; choose 'accepted' or 'separation'")
    proposer.calibration_log = []
    try:
        engine.generate(prompts, params or SamplingParams())
        best = torch.cat([b for b, _ in proposer.calibration_log])
        accepted = torch.cat([a for _, a in proposer.calibration_log])
    finally:
        proposer.calibration_log = None
    cfg = proposer.cfg
    if objective == "accepted":
        taus = fit_thresholds(best, accepted, proposer.thresholds)
    else:
        taus = separating_thresholds(best, accepted[:, -1], cfg.checkpoints, proposer.thresholds)
    proposer.thresholds = taus
    if path is not None:
        stage = pruning_stage(best, taus)
        save_thresholds(path, cfg.checkpoints, taus, objective=objective, observations=int(best.shape[0]),
                        stage_accepted=accepted.float().mean(0).tolist(),  # per stage (last: never pruned)
                        stage_share=torch.bincount(stage, minlength=len(taus) + 1).div(len(stage)).tolist(),
                        calibrated_accepted=float(accepted.gather(1, stage.view(-1, 1)).float().mean()))
    return taus
