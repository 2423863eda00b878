"""ModelRunner: the only code that runs a model and owns its KV cache (DESIGN.md §4).

KV layout. One `SlotCache` (HF `Cache` with in-place, spare-capacity layers) holds `[rows, heads, slots, head_dim]` per layer plus
`slot_valid [rows, slots]`. A verify forward appends its whole tree block to every row; after
acceptance only the root and accepted nodes of the block stay valid. Invalid slots are
masked out of attention and dropped by `compact()` once they exceed a slack fraction, so the
cache is rewritten O(log) times per rollout instead of every step. Because a row's positions
are tracked apart from its slots, ragged rows, padding and rejected nodes all cost nothing but
masked slots. The plain autoregressive path is a tree with only a root: same code, no copy.
"""

from __future__ import annotations

import inspect

import torch
import transformers
from packaging import version
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer


class SlotLayer(DynamicLayer):
    """A cache layer with spare capacity: appending writes in place instead of re-concatenating
    the whole cache every step (HF's DynamicLayer copies O(slots) per step and layer)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._buf_k = self._buf_v = None
            self.used = 0
        need = self.used + key_states.shape[-2]
        if self._buf_k is None or need > self._buf_k.shape[-2] or self._buf_k.shape[0] != key_states.shape[0]:
            self._reserve(key_states, value_states, need)
        self._buf_k[:, :, self.used : need] = key_states
        self._buf_v[:, :, self.used : need] = value_states
        self.used = need
        self.keys, self.values = self._buf_k[:, :, :need], self._buf_v[:, :, :need]
        return self.keys, self.values

    def _reserve(self, k: torch.Tensor, v: torch.Tensor, need: int) -> None:
        capacity = need + need // 2 + 64
        b, h, _, d = k.shape
        new_k = k.new_empty(b, h, capacity, d)
        new_v = v.new_empty(b, h, capacity, v.shape[-1])
        if self.used:
            new_k[:, :, : self.used] = self.keys
            new_v[:, :, : self.used] = self.values
        self._buf_k, self._buf_v = new_k, new_v

    def replace(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Install rewritten tensors (row selection, compaction); capacity is re-reserved lazily."""
        self._buf_k, self._buf_v, self.keys, self.values = keys, values, keys, values
        self.used = keys.shape[-2]

    def truncate(self, slots: int) -> None:
        """Forget every slot from `slots` on; their space is reused by the next append."""
        self.used = min(self.used, slots)
        self.keys, self.values = self._buf_k[:, :, : self.used], self._buf_v[:, :, : self.used]


class SlotCache(Cache):
    def __init__(self):
        super().__init__(layer_class_to_replicate=SlotLayer)


def cache_keyword(model: PreTrainedModel) -> str:
    """The keyword the model's forward takes its KV cache by: `cache` from transformers 5.24 on,
    `past_key_values` before. Decided once per runner: a keyword the model does not know is
    swallowed by `**kwargs`, and the model would silently run without our cache.

    Read from the forward's signature; a wrapper that forwards `**kwargs` (PEFT) names neither,
    so then transformers' version decides (the rename came in 5.24).
    """
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return "cache" if version.parse(transformers.__version__) >= version.parse("5.24") else "past_key_values"


ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "attention", "moe", "mlp"})
"""Layer kinds whose cache is per-token keys and values (or none): a rejected tree node is just a
masked slot. Anything else (Mamba/SSM, linear attention, convolution states) folds every token it
sees into one recurrent state, which a tree verification would corrupt with its rejected branches."""

RECURRENT_MODEL_TYPES = frozenset({
    "mamba", "mamba2", "falcon_mamba", "falcon_h1", "jamba", "zamba", "zamba2", "bamba", "nemotron_h",
    "granitemoehybrid", "qwen3_next", "rwkv", "recurrent_gemma", "xlstm", "lfm2", "lfm2_moe", "minimax", "plamo2",
})
"""Model types with recurrent layers, for configs that name no per-layer kinds."""


def recurrent_layers(config) -> list[str]:
    """The kinds of `config`'s layers that keep a recurrent state instead of a KV cache (empty: the
    engine can verify on the model)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    kinds = []
    for name in ("layer_types", "layers_block_type"):
        value = getattr(config, name, None)
        if isinstance(value, (list, tuple)):
            kinds += [str(kind) for kind in value]
    pattern = getattr(config, "hybrid_override_pattern", None)  # Nemotron-H: "M" = Mamba, "*" = attention
    if isinstance(pattern, str):
        kinds += ["mamba" for c in pattern if c == "M"]
    other = sorted(set(kinds) - ATTENTION_LAYERS)
    if not other and getattr(config, "model_type", None) in RECURRENT_MODEL_TYPES:
        other = [f"{config.model_type} (recurrent)"]
    return other


def check_verifiable(model: PreTrainedModel) -> None:
    """ValueError when the model has recurrent layers (Mamba/SSM, linear attention...): tree and
    draft verification keeps rejected tokens out of a KV cache by masking, which a recurrent state
    cannot do, so the engine refuses them instead of sampling from a corrupted state."""
    kinds = recurrent_layers(model.config)
    if kinds:
        raise ValueError(f"{type(model).__name__} has recurrent layers {kinds}: the rollout engine verifies drafts "
                         "on a per-token KV cache and cannot roll a recurrent state back past rejected tokens")


class ModelRunner:
    def __init__(self, model: PreTrainedModel, compact_slack: float = 0.5):
        self.model = model
        check_verifiable(model)
        self._cache_kw = cache_keyword(model)  # `cache` (transformers >= 5.24) or `past_key_values`
        self.compact_slack = compact_slack
        self.cache: SlotCache | None = None
        self.slot_valid: torch.Tensor | None = None  # [rows, slots] bool
        # the model's device and dtype are read from its first parameter, kept: `model.parameters()`
        # walks every module (~30 µs), and they are read every forward. `model.to(...)` moves that
        # parameter object in place, so it stays current.
        self._first_param = next(model.parameters())

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return self._first_param.device

    @property
    def dtype(self) -> torch.dtype:
        return self._first_param.dtype

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def max_positions(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    # ------------------------------------------------------------------ forwards
    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """bool [rows, q, kv] → additive 4D mask [rows, 1, q, kv] in the model dtype."""
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device)
        return mask.masked_fill_(~allowed, torch.finfo(self.dtype).min).unsqueeze(1)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=tokens,
            position_ids=positions,
            attention_mask=self._additive(allowed),
            use_cache=True,
            **{self._cache_kw: self.cache},
        )
        return out.logits

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], row_prompt: torch.Tensor) -> torch.Tensor | None:
        """Encode each distinct prompt once and give every row its prompt's KV.

        prompts: distinct token lists (may be empty); row_prompt: [rows] index into `prompts`.
        Returns logits [n_prompts, max_len, V] of the prompt positions (None if all empty).
        """
        self.cache = SlotCache()
        length = max(len(p) for p in prompts)
        if length == 0:
            self.slot_valid = torch.zeros(len(row_prompt), 0, dtype=torch.bool, device=self.device)
            return None
        ids = torch.zeros(len(prompts), length, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        lens = torch.tensor([len(p) for p in prompts])
        key_valid = torch.arange(length).unsqueeze(0) < lens.unsqueeze(1)  # [n_prompts, len]
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        eye = torch.eye(length, dtype=torch.bool)  # padding queries see themselves: no empty rows
        allowed = (causal & key_valid.unsqueeze(1)) | eye  # [n_prompts, len, len]
        positions = torch.arange(length).expand(len(prompts), length)
        logits = self._forward(ids.to(self.device), positions.to(self.device), allowed.to(self.device))
        row_prompt = row_prompt.to(self.device)
        self._select(row_prompt)
        self.slot_valid = key_valid.to(self.device)[row_prompt]
        return logits

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor,
               past_extra: torch.Tensor | None = None) -> torch.Tensor:
        """Append one tree block per row and return its logits.

        tokens, positions: [rows, n]; tree_mask: [rows, n, n] bool (ancestor-or-self).
        past_extra: optional [rows, n, slots] bool — cached slots a query may see beyond the valid
        ones (a drafter expanding a tree level by level sees its uncommitted ancestors).
        Returns logits [rows, n, V]. Call `commit` next to say which block slots stay.
        """
        rows, n = tokens.shape
        past = self.slot_valid.unsqueeze(1).expand(rows, n, self.slot_valid.shape[1])
        if past_extra is not None:
            past = past | past_extra
        logits = self._forward(tokens, positions, torch.cat([past, tree_mask], 2))
        self.slot_valid = torch.cat([self.slot_valid, torch.zeros_like(tree_mask[:, 0])], 1)
        return logits

    def commit(self, keep: torch.Tensor) -> None:
        """keep: [rows, n] bool — block slots of the last `verify` whose KV stays valid."""
        self.slot_valid[:, -keep.shape[1] :] = keep

    @property
    def slots(self) -> int:
        return 0 if self.slot_valid is None else self.slot_valid.shape[1]

    # ------------------------------------------------------------------ cache surgery
    def _layers(self):
        return self.cache.layers if self.cache is not None else []

    def _select(self, rows: torch.Tensor) -> None:
        for layer in self._layers():
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.replace(layer.keys.index_select(0, rows), layer.values.index_select(0, rows))

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only `rows` ([k] int64, in order): finished sequences leave the batch."""
        rows = rows.to(self.device)
        self._select(rows)
        self.slot_valid = self.slot_valid.index_select(0, rows)

    def maybe_compact(self, max_cached: int, slack: float | None = None, margin: int = 16) -> bool:
        """Compact when the slots exceed (1 + slack) · max_cached + margin (slack: `compact_slack`
        unless given). max_cached: the longest row's valid count."""
        slots = self.slot_valid.shape[1]
        slack = self.compact_slack if slack is None else slack
        if slots <= (1.0 + slack) * max_cached + margin:
            return False
        self.compact(max_cached)
        return True

    def compact(self, max_cached: int) -> None:
        """Move every row's valid slots to the front (order kept) and drop the rest."""
        # stable sort puts valid slots first in their original order
        order = torch.sort((~self.slot_valid).to(torch.int8), dim=1, stable=True).indices[:, :max_cached]
        self.slot_valid = self.slot_valid.gather(1, order)
        for layer in self._layers():
            if getattr(layer, "keys", None) is None or not layer.keys.numel():
                continue
            b, h, _, d = layer.keys.shape
            idx = order.view(b, 1, -1, 1).expand(b, h, order.shape[1], d)
            layer.replace(layer.keys.gather(2, idx), layer.values.gather(2, idx))

    def truncate(self, slots: int) -> None:
        """Drop the cache's slots from `slots` on (a drafter's scratch blocks), without a copy."""
        for layer in self._layers():
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.truncate(slots)
        self.slot_valid = self.slot_valid[:, :slots]

    def release(self) -> None:
        self.cache, self.slot_valid = None, None
