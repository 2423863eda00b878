"""D-cut's start profile inside vLLM: the roofline (`dcut.roofline`) of the GPU the proposer runs
on and of the target vLLM loaded, so a fresh proposer verifies by the step's shape from its first
step and the online fit corrects it (docs/DESIGN.md, "The vLLM backend", step 4). None where the
roofline does not model the step: a CPU, a GPU without a preset, tensor or pipeline parallelism,
mixture-of-experts, quantized weights, layers other than full attention; D-cut then learns the
step time online alone.
"""

from __future__ import annotations

import torch

from ..dcut.roofline import ModelShape, Roofline, accelerator_named

_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def start_profile(vllm_config, model, device_name: str | None = None) -> tuple[Roofline | None, str]:
    """The roofline of this step, or None, and why (for the log). `model`: the target as vLLM loaded
    it (its parameters' count and bytes); `device_name`: the GPU's (None: CUDA's current device's)."""
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None)
    if device != "cuda":
        return None, f"device {device!r}: no roofline, the step time is learned online"
    name = torch.cuda.get_device_name() if device_name is None else device_name
    accelerator = accelerator_named(name)
    if accelerator is None:
        return None, f"GPU {name!r} has no preset (rollout_graft.dcut.roofline.ACCELERATORS): the step time is learned online"
    why = _unmodelled(vllm_config)
    if why:
        return None, f"{why}: the roofline does not model this step, the step time is learned online"
    shape = _shape(vllm_config, model)
    return Roofline(accelerator, shape), (f"D-cut starts from the {accelerator.name} roofline of a {shape.params / 1e9:.2f} B "
                                          f"parameter target ({shape.layers} layers, {shape.kv_heads} KV heads × {shape.head_dim})")


def _unmodelled(vllm_config) -> str:
    """Why the roofline does not model the step ('' where it does)."""
    par, mc = vllm_config.parallel_config, vllm_config.model_config
    if par.tensor_parallel_size * par.pipeline_parallel_size > 1:
        return f"tensor × pipeline parallel size {par.tensor_parallel_size} × {par.pipeline_parallel_size}"
    if getattr(mc, "quantization", None):
        return f"quantized weights ({mc.quantization})"
    hf = mc.hf_text_config
    if any(getattr(hf, a, None) for a in _EXPERTS):
        return "a mixture of experts"
    types = set(getattr(hf, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"}:
        return f"layers of types {sorted(types)}"
    return ""


def _shape(vllm_config, model) -> ModelShape:
    """The target's shape from its config, its parameters as loaded, its KV cache's dtype."""
    mc, hf = vllm_config.model_config, vllm_config.model_config.hf_text_config
    params = list(model.parameters())
    heads = hf.num_attention_heads
    kv_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto"))
    kv_bytes = 1 if kv_dtype.startswith("fp8") else torch.empty(0, dtype=mc.dtype).element_size()
    return ModelShape(str(getattr(mc, "model", "target")), float(sum(p.numel() for p in params)), hf.num_hidden_layers,
                      heads, getattr(hf, "num_key_value_heads", None) or heads,
                      getattr(hf, "head_dim", None) or hf.hidden_size // heads, kv_bytes,
                      weight_bytes=float(sum(p.numel() * p.element_size() for p in params)))

