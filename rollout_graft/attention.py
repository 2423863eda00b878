"""Grouped-query attention folded into the query axis: the engine's forwards without KV head copies.

Under an explicit attention mask, transformers' SDPA path (`integrations.sdpa_attention`) copies
every KV head out to the query heads that share it, in every layer and step (`repeat_kv`: torch's
SDPA takes grouped-query attention without the copy only when no mask is given). The engine always
passes a mask (ragged rows, rejected tree nodes), so it pays that copy every step. `folded_sdpa`
computes the same attention with each KV head's query heads stacked along the query axis and the
mask repeated to match: the same dot products, one SDPA call, no copy; logits equal within float
rounding (docs/RESULTS.md, "Engine's verify forward: grouped-query attention folded").
`folded(model)` switches a model whose attention is transformers' `sdpa` and whose KV heads are
shared (fewer than its query heads) to it for a block, and back (`EngineConfig.fold_gqa`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

FOLDED = "rollout_graft_folded_sdpa"


def folded_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA over [batch, heads, length, dim] queries and [batch, kv_heads, slots, dim] keys and values,
    each KV head's query heads folded into the query axis, for the engine's forwards: a mask shared
    by the heads (`ModelRunner` always passes one), no dropout. Any other call is transformers' own."""
    if attention_mask is None or attention_mask.shape[1] != 1 or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, heads, length, _ = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    mask = attention_mask[:, :, :, :slots].expand(batch, 1, length, slots)
    mask = mask.repeat(1, groups, 1, 1).reshape(batch, 1, groups * length, slots)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, kv_heads, groups * length, query.shape[-1]), key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, length, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(FOLDED, folded_sdpa)


def foldable(model) -> bool:
    """Whether `folded` switches `model`: its attention is transformers' `sdpa` and it shares KV heads."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return (getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation")
            and bool(heads) and kv_heads < heads and heads % kv_heads == 0)


@contextmanager
def folded(model) -> Iterator[None]:
    """Inside the block, `model`'s attention is `folded_sdpa` where `foldable`; transformers' `sdpa`
    again after it (also after an exception). Any other model runs as it is."""
    if not foldable(model):
        yield
        return
    model.set_attn_implementation(FOLDED)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")
