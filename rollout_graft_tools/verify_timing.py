"""The engine's verify forward timed as a rollout's step meets it: a cache whose slots of rejected
nodes are masked, a causal block of tokens per row (`lab/gqa_fold.py`, `lab/gpu_verify_paths.py`;
`cost.time_forward` is the profile's own, every slot valid)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rollout_graft.runner import ModelRunner


def cache_with_holes(runner: ModelRunner, rows: int, context: int, holes: float) -> None:
    """Every row's cache: one prompt of `context` tokens, a share `holes` of its slots masked (the
    first kept), the same for the same arguments."""
    gen = torch.Generator().manual_seed(rows * 7919 + context)
    prompt = torch.randint(0, runner.vocab_size, (context,), generator=gen).tolist()
    runner.prefill([prompt], torch.zeros(rows, dtype=torch.long))
    if holes:
        invalid = torch.rand(rows, context, generator=gen) < holes
        invalid[:, 0] = False
        runner.slot_valid = runner.slot_valid & ~invalid.to(runner.device)


@dataclass(frozen=True)
class VerifyTiming:
    ms: float  # best whole forward, synchronised on a GPU
    host_ms: float  # best time until `verify` returned (the host's part)
    logits: torch.Tensor  # the last forward's


def time_verify(runner: ModelRunner, rows: int, tokens: int, context: int, repeats: int) -> VerifyTiming:
    """Best of `repeats` verify forwards of `tokens` causal tokens per row over the cache
    `cache_with_holes` left (after one untimed forward, which reserves the cache's room); the cache
    is truncated back after each and released at the end."""
    dev = runner.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    ids = torch.randint(0, runner.vocab_size, (rows, tokens), generator=torch.Generator().manual_seed(1)).to(dev)
    positions = (context + torch.arange(tokens, device=dev)).expand(rows, tokens)
    mask = torch.ones(tokens, tokens, dtype=torch.bool, device=dev).tril().expand(rows, tokens, tokens)
    whole, host = [], []
    for i in range(repeats + 1):
        sync()
        start = time.perf_counter()
        logits = runner.verify(ids, positions, mask)
        returned = time.perf_counter()
        sync()
        if i:
            whole.append(1000 * (time.perf_counter() - start))
            host.append(1000 * (returned - start))
        runner.truncate(context)
    runner.release()
    return VerifyTiming(min(whole), min(host), logits)
