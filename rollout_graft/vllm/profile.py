"""D-cut's start profile inside vLLM: the roofline (`dcut.roofline`) of the GPU the proposer runs
on and of the target vLLM loaded, so a fresh proposer verifies by the step's shape from its first
step and the online fit corrects it (docs/DESIGN.md, "The vLLM backend", step 4). A GPU with a
preset is priced by its datasheet; any other by its peaks measured when the target is loaded
(`measure_peaks`: a matmul and a device copy, a fraction of a second). None where the roofline does
not model the step: a CPU, tensor or pipeline parallelism, mixture-of-experts, quantized weights,
layers other than full attention; D-cut then learns the step time online alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..dcut.roofline import Accelerator, ModelShape, Roofline, accelerator_named

_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def start_profile(vllm_config, model, device_name: str | None = None,
                  measure: Callable[[torch.dtype], tuple[float, float]] | None = None) -> tuple[Roofline | None, str]:
    """The roofline of this step, or None, and why (for the log). `model`: the target as vLLM loaded
    it (its parameters' count and bytes); `device_name`: the GPU's (None: CUDA's current device's);
    `measure`: dtype → the GPU's (TFLOP/s, TB/s) where it has no preset (None: `measure_peaks` on it)."""
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None)
    if device != "cuda":
        return None, f"device {device!r}: no roofline, the step time is learned online"
    why = _unmodelled(vllm_config)
    if why:
        return None, f"{why}: the roofline does not model this step, the step time is learned online"
    name = torch.cuda.get_device_name() if device_name is None else device_name
    shape = _shape(vllm_config, model)
    accelerator, source = accelerator_named(name), "datasheet"
    if accelerator is None:  # no preset: its peaks as measured now, reached (η = 1) rather than headlined
        try:
            tflops, tbps = (measure or (lambda dtype: measure_peaks("cuda", dtype)))(vllm_config.model_config.dtype)
        except Exception as e:  # out of memory, an unsupported dtype, no CUDA: learned online, and the log says why
            return None, f"GPU {name!r} has no preset and measuring its peaks failed ({e}): the step time is learned online"
        accelerator, source = Accelerator(name, tflops, tbps), f"measured now: {tflops:.0f} TFLOP/s, {tbps:.2f} TB/s"
        clock = Roofline(accelerator, shape, eta_mem=1.0, eta_flop=1.0)
    else:
        clock = Roofline(accelerator, shape)
    return clock, (f"D-cut starts from the {accelerator.name} roofline ({source}) of a {shape.params / 1e9:.2f} B "
                   f"parameter target ({shape.layers} layers, {shape.kv_heads} KV heads × {shape.head_dim})")


def measure_peaks(device: str, dtype: torch.dtype, size: int = 8192, copy_mib: int = 512,
                  repeats: int = 5) -> tuple[float, float]:
    """(TFLOP/s, TB/s) a device reaches: a size³ matmul in `dtype` (the target's: a step's matmuls)
    and a copy of `copy_mib` MiB (read and written), each the best of `repeats` after a warm-up.
    What the presets' η's stand for (one H200: ~790 TFLOP/s of 989 on a bf16 8192³ matmul, ~4.3 TB/s
    of 4.8 on a device copy); ValueError where a figure is not positive and finite."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def best(work) -> float:
        work()
        sync()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            work()
            sync()
            times.append(time.perf_counter() - start)
        return min(times)

    def matmul() -> float:  # its buffers freed on return, before the copy's are taken
        a, b = torch.randn(size, size, device=device).to(dtype), torch.randn(size, size, device=device).to(dtype)
        out = torch.empty(size, size, device=device, dtype=dtype)
        return 2.0 * size**3 / best(lambda: torch.mm(a, b, out=out)) / 1e12

    def copy() -> float:
        src = torch.empty(copy_mib << 20, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        return 2.0 * src.numel() / best(lambda: dst.copy_(src)) / 1e12

    tflops, tbps = matmul(), copy()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    if not all(0.0 < x < float("inf") for x in (tflops, tbps)):
        raise ValueError(f"measured {tflops} TFLOP/s and {tbps} TB/s on {device}")
    return tflops, tbps


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

