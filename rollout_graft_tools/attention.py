"""Grouped-query attention folded into the query axis: a study of the engine's verify forward.

Under an explicit attention mask, transformers' SDPA path (`integrations.sdpa_attention`) copies
every KV head out to the query heads that share it, in every layer and step (`repeat_kv`: torch's
SDPA takes grouped-query attention without the copy only when no mask is given). The engine always
passes a mask (ragged rows, rejected tree nodes), so it pays that copy every step. `folded_sdpa`
computes the same attention with each KV head's query heads stacked along the query axis and the
mask repeated to match: the same dot products, one SDPA call, no copy. Registered with
transformers as `FOLDED`: `model.set_attn_implementation(FOLDED)` switches a model to it (and
`"sdpa"` back). Measured by `lab/gqa_fold.py` and `lab/gpu_verify_cost.py --attention`.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

FOLDED = "gqa_folded_sdpa"


def folded_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA over [batch, heads, length, dim] queries and [batch, kv_heads, slots, dim] keys and values,
    each KV head's query heads folded into the query axis; the engine's case only (a mask shared by
    the heads, no dropout)."""
    batch, heads, length, _ = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    mask = attention_mask[:, :, :, :slots].expand(batch, 1, length, slots)
    mask = mask.repeat(1, groups, 1, 1).reshape(batch, 1, groups * length, slots)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, kv_heads, groups * length, query.shape[-1]), key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, length, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(FOLDED, folded_sdpa)
