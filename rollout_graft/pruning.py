"""Calibrated pruning at checkpoint levels and the draft/retrieval split (DESIGN.md §2 step 2).

A row's tree is checked only at a few checkpoint levels (default {0, 1, 5}; level d = draft
depth d + 1). At checkpoint c the best cumulative confidence among the level's nodes is compared
with τ_c; below it the tree stops growing there, and the row's budget N is split by that stage:
`split[c]` draft nodes, N − split[c] retrieval slots (never stopped: all N to the drafter).

τ is calibrated from a warm-up run that replays every pruning stage at once
(`GraftProposer.calibrate` runs it; this module holds the pure fitting functions): each step builds
the tree every stage would give (same drafter expansion, cut at that stage's level, with that
stage's split and grafted retrieval), verifies their union, and counts the tokens each stage's
tree accepts along the verified walk (`verify.accepted_along`: the walk's draws are shared, so
this is each tree's own acceptance, exactly). Two objectives:

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

from pathlib import Path
from typing import Literal

import torch

from .config import DraftConfig
from .files import atomic_write_json, is_finite_number, is_int, read_json, require_keys

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
    atomic_write_json(path, data, indent=1)


def load_thresholds(path: str | Path, checkpoints: tuple[int, ...]) -> tuple[float, ...]:
    """τ per checkpoint from a file `save_thresholds` wrote; ValueError naming the file when it is
    corrupt (not JSON, keys missing, thresholds not numbers in [0, 1], one per checkpoint)."""
    data = read_json(path, "the pruning thresholds")
    require_keys(data, ("checkpoints", "thresholds"), path, "the pruning thresholds")
    taus, points = data["thresholds"], data["checkpoints"]
    if (not isinstance(taus, list) or not isinstance(points, list) or len(taus) != len(points)
            or not all(is_finite_number(t) and 0.0 <= t <= 1.0 for t in taus) or not all(map(is_int, points))):
        raise ValueError(f"the pruning thresholds {path} must hold one threshold in [0, 1] per checkpoint level, got "
                         f"checkpoints={points!r}, thresholds={taus!r}: re-run the calibration")
    if tuple(data["checkpoints"]) != tuple(checkpoints):
        raise ValueError(f"{path} was calibrated for checkpoints {data['checkpoints']} but the config uses "
                         f"{list(checkpoints)}: re-run the calibration (rollout_graft.calibrate) with this config")
    return tuple(float(t) for t in data["thresholds"])


def calibrated_thresholds(best: torch.Tensor, accepted: torch.Tensor, objective: CalibrationObjective,
                          checkpoints: tuple[int, ...], current: tuple[float, ...]) -> tuple[float, ...]:
    """τ for `objective` (see the module docstring) from a warm-up's observations.

    best: [N, C] best confidence at each checkpoint; accepted: [N, C + 1] tokens the tree of each
    stage accepted (last: never pruned); current: kept where there are too few observations.
    """
    if objective == "separation":
        return separating_thresholds(best, accepted[:, -1], checkpoints, current)
    return fit_thresholds(best, accepted, current)


def calibration_summary(best: torch.Tensor, accepted: torch.Tensor, thresholds: tuple[float, ...]) -> dict:
    """What a warm-up measured, saved beside τ: observations, mean tokens each stage's tree accepted
    (last: never pruned), the share of rows each stage gets under τ, and the mean accepted under τ."""
    stage = pruning_stage(best, thresholds)
    return {"observations": int(best.shape[0]), "stage_accepted": accepted.float().mean(0).tolist(),
            "stage_share": torch.bincount(stage, minlength=len(thresholds) + 1).div(len(stage)).tolist(),
            "calibrated_accepted": float(accepted.gather(1, stage.view(-1, 1)).float().mean())}
