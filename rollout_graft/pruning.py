"""Calibrated pruning at checkpoint levels and the draft/retrieval split (DESIGN.md §2 step 2).

A row's tree is checked only at a few checkpoint levels (default {0, 1, 5}; level d = draft
depth d + 1). At checkpoint c the best cumulative confidence among the level's nodes is compared
with τ_c; below it the tree stops growing there, and the row's budget N is split by that stage:
`split[c]` draft nodes, N − split[c] retrieval slots (never stopped: all N to the drafter).

τ is calibrated from a warm-up run with dense trees: at checkpoint c (level d) a row is
*positive* when verification accepted a draft node at level d (≥ d + 1 accepted tokens); τ_c is
the confidence threshold that best separates positives from negatives (Youden's J = TPR − FPR,
where "predicted positive" = best confidence ≥ τ_c).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import DraftConfig, SamplingParams

MIN_CALIBRATION_ROWS = 16
"""Fewer observations than this at a checkpoint keep its current threshold."""


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


def fit_thresholds(best: torch.Tensor, accepted: torch.Tensor, checkpoints: tuple[int, ...],
                   current: tuple[float, ...]) -> tuple[float, ...]:
    """τ per checkpoint maximising Youden's J on warm-up observations.

    best: [N, C] best confidence per checkpoint (0 = level not reached, ignored);
    accepted: [N] draft tokens accepted in that step; current: kept when data are too few.
    """
    taus = []
    for c, level in enumerate(checkpoints):
        seen = best[:, c] > 0
        x, pos = best[seen, c].double(), accepted[seen] >= level + 1
        n_pos, n_neg = int(pos.sum()), int((~pos).sum())
        if n_pos + n_neg < MIN_CALIBRATION_ROWS:
            taus.append(current[c])
        elif n_neg == 0:
            taus.append(0.0)  # the drafter always gets through this level: never prune
        elif n_pos == 0:
            taus.append(1.0)  # it never does: always prune
        else:
            cand = torch.unique(torch.cat([x, x.new_zeros(1)]))  # τ = 0: never prune
            keep = x.view(1, -1) >= cand.view(-1, 1)  # [T, N] continue (predicted positive)
            tpr = (keep & pos).sum(1).double() / n_pos
            fpr = (keep & ~pos).sum(1).double() / n_neg
            taus.append(float(cand[torch.argmax(tpr - fpr)]))
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
              path: str | Path | None = None) -> tuple[float, ...]:
    """Fit τ from a warm-up rollout of `engine` (method "graft") over `prompts`, install it in the
    engine's proposer and, when `path` is given, save it as JSON (load with
    `DraftConfig(thresholds_path=...)`). The warm-up uses dense, unpruned drafter trees."""
    proposer = engine.proposer
    if not hasattr(proposer, "calibration_log"):
        raise ValueError("calibrate() needs an engine built with EngineConfig(method='graft')")
    proposer.calibration_log = []
    try:
        engine.generate(prompts, params or SamplingParams())
        best = torch.cat([b for b, _ in proposer.calibration_log])
        accepted = torch.cat([a for _, a in proposer.calibration_log])
    finally:
        proposer.calibration_log = None
    cfg = proposer.cfg
    taus = fit_thresholds(best, accepted, cfg.checkpoints, proposer.thresholds)
    proposer.thresholds = taus
    if path is not None:
        rate = [float((accepted[best[:, c] > 0] >= lvl + 1).float().mean()) if bool((best[:, c] > 0).any()) else None
                for c, lvl in enumerate(cfg.checkpoints)]
        save_thresholds(path, cfg.checkpoints, taus, observations=int(best.shape[0]), accept_rate=rate)
    return taus
