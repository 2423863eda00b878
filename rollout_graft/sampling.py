"""Logit warping, sampling and per-token logprobs — the target distribution, defined once.

Every emitted token, whatever proposed it, is drawn here from the target's warped
distribution, so the speculative and the plain path sample the same law.

The uniforms behind the draws are counter-based: u = hash(seed, row, position), a function of the
call's seed, the row's index in the `generate` call and the completion position of the token
(splitmix64 in int64 tensor ops, the same bits on CPU and GPU). No sequential generator is
consumed, so how many draws a step makes (tree depth, D-cut's choice, waves, what an index has
learnt) cannot shift the noise of later tokens: every method emits, position by position, the token
plain "ar" sampling emits with that seed (up to float rounding between a tree forward and a
one-token forward, which can move a CDF boundary across u).
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


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """The repetition penalty (HF's `RepetitionPenaltyLogitsProcessor`, vLLM's rule): the logit of
    every token `seen` [..., ≥ V] bool marks (its first V columns) divided by `penalty` where
    positive, multiplied by it where not. logits [..., V] → [..., V] float32."""
    logits = logits.float()
    hit = seen[..., : logits.shape[-1]]
    return torch.where(hit, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


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
        drop_sorted[..., 0] = False  # a top_p below float32's smallest (~1e-45) rounds to 0: keep the top token
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


_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment (2^64 / golden ratio, odd)
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)  # splitmix64's finaliser multipliers
U64 = 2**64


def _i64(c: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return c - U64 if c >= 2**63 else c


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic: mask the sign copies)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps mod 2^64): a bijection of 64 bits."""
    x = (x ^ _shr(x, 30)) * _i64(_MIX[0])
    x = (x ^ _shr(x, 27)) * _i64(_MIX[1])
    return x ^ _shr(x, 31)


def row_keys(seed: int, rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[rows] int64 key of each row of a call seeded `seed` (an int in [0, 2^64)): mix(mix(seed) + row·γ).

    Distinct rows get distinct keys (mix is a bijection), so the rows of one GRPO group draw
    independent streams."""
    base = mix64(torch.tensor(_i64(seed % U64), dtype=torch.long, device=device))
    return mix64(base + torch.arange(rows, dtype=torch.long, device=device) * _i64(_GOLDEN))


def uniforms(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """u = mix(key + position·γ) as float32 in [0, 1) (its top 24 bits, torch.rand's resolution).

    keys: int64 [...] from `row_keys`; positions: int64 [...] completion positions (0 = the
    completion's first token). Broadcasts."""
    bits = _shr(mix64(keys + positions * _i64(_GOLDEN)), 40)  # [...] in [0, 2^24)
    return bits.to(torch.float32) * 2.0**-24


def sample(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor | None) -> torch.Tensor:
    """One draw per row of `logits` [..., V] from uniforms `u` [...] → ids [...].

    Greedy is argmax (u unused, may be None). Otherwise inverse-CDF sampling: the first token whose
    cumulative probability exceeds u·total (tokens of zero probability are never picked). One
    uniform per row instead of V exponentials: several times faster on CPU than Gumbel-max, and the
    same u always picks the same token from the same distribution.
    """
    if params.greedy:
        return logits.argmax(-1)
    probs = warp_logits(logits, params).softmax(-1)
    cdf = probs.cumsum(-1)  # [..., V]
    ids = torch.searchsorted(cdf, u.to(cdf.dtype).unsqueeze(-1) * cdf[..., -1:], right=True)
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
