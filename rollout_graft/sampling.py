"""Logit warping, sampling and per-token logprobs — the target distribution, defined once.

Every emitted token, whatever proposed it, is drawn here from the target's warped
distribution, so the speculative and the plain path sample the same law.
"""

from __future__ import annotations

import torch

from .config import SamplingParams


def check_finite(logits: torch.Tensor) -> None:
    """Refuse NaN/inf logits instead of sampling garbage."""
    if not torch.isfinite(logits).all():
        raise ValueError(
            "the target model produced NaN/inf logits; check the weights and dtype "
            "(fp16 overflow is common: load the model in bf16 or fp32)"
        )


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature → top-k → top-p → min-p (the order of HF `generate` and vLLM).

    logits: [..., V] raw target logits. Returns [..., V] float32 logits with removed tokens
    at -inf. Greedy callers never need this (argmax of the raw logits).
    """
    logits = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if params.min_p > 0.0:
        probs = logits.softmax(-1)
        floor = params.min_p * probs.amax(-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution every emitted token follows. logits [..., V] → probs [..., V]."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return warp_logits(logits, params).softmax(-1)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One independent draw per row of `logits` [..., V] → ids [...].

    Greedy is argmax. Otherwise inverse-CDF sampling: one uniform u per row, the first token whose
    cumulative probability exceeds u·total (tokens of zero probability are never picked). One
    uniform per row instead of V exponentials: several times faster on CPU than Gumbel-max.
    """
    if params.greedy:
        return logits.argmax(-1)
    probs = warp_logits(logits, params).softmax(-1)
    cdf = probs.cumsum(-1)  # [..., V]
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, device=cdf.device, dtype=cdf.dtype)
    ids = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)
    return ids.squeeze(-1).clamp(max=probs.shape[-1] - 1)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T)[id] — unmasked by top-k/top-p, as TRL recomputes it.

    logits: [..., V]; ids: [...]. Greedy (T=0) reports the T=1 logprob.
    """
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.float() / scale, dim=-1)
    return logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def top_k_probs(logits: torch.Tensor, k: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely next tokens under softmax(logits / T), without materialising the softmax.

    logits: [N, V] → (probs [N, k] float32, ids [N, k]); greedy (T=0) uses T=1.
    """
    scale = temperature if temperature > 0 else 1.0
    scaled = logits.float() if scale == 1.0 else logits.float() / scale
    top, ids = torch.topk(scaled, k, dim=-1)
    return (top - torch.logsumexp(scaled, dim=-1, keepdim=True)).exp(), ids
