"""rollout_graft inside vLLM: our RL draft sources and D-cut as a `custom_class` proposer.

    from vllm import LLM
    from rollout_graft.vllm import speculative_config
    llm = LLM(model, speculative_config=speculative_config(num_speculative_tokens=8))

`vllm_speculative_config("suffix" | "ngram", K)` builds vLLM's own draft methods (the peers we
are measured against) the same way.

Importing this package does not import vLLM; the proposer module does, in vLLM's own process.
`proposer_summary`, `save_proposer_state` and `load_proposer_state` reach the proposer of a
`vllm.LLM` on each of its workers (through `LLM.collective_rpc`).
"""

from __future__ import annotations

from .config import ChainConfig, speculative_config
from .methods import vllm_speculative_config


def _call(llm, method: str, *args) -> list:
    """`method` of the proposer on each worker of `llm`, by name (`plugin.WORKER_METHOD`, which our vLLM
    plugin gives every worker): strings cross vLLM's processes without insecure serialization."""
    from .plugin import WORKER_METHOD, register_worker_method

    register_worker_method()  # this process too (vLLM's in-process engine: VLLM_ENABLE_V1_MULTIPROCESSING=0)
    return llm.collective_rpc(WORKER_METHOD, args=(method, *args))


def proposer_summary(llm) -> dict:
    """The proposer's counters and its budget policy's explanation (first worker)."""
    return _call(llm, "summary")[0]


def save_proposer_state(llm, directory: str) -> None:
    """Write the proposer's prior and recalled completions to `directory` (first worker's)."""
    _call(llm, "save_state", str(directory))


def load_proposer_state(llm, directory: str) -> None:
    """Restore what `save_proposer_state` wrote, on every worker."""
    _call(llm, "load_state", str(directory))


__all__ = ["ChainConfig", "load_proposer_state", "proposer_summary", "save_proposer_state", "speculative_config",
           "vllm_speculative_config"]
