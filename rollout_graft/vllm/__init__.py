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


def _call(worker, method: str, *args):
    """`method` of the proposer of a vLLM worker (run there by `LLM.collective_rpc`)."""
    from .proposer import RLDraftProposer

    drafter = getattr(worker.model_runner, "drafter", None)
    if not isinstance(drafter, RLDraftProposer):
        raise ValueError("this vLLM engine does not run rollout_graft's proposer: build it with "
                         "speculative_config=rollout_graft.vllm.speculative_config(...)")
    return getattr(drafter, method)(*args)


def proposer_summary(llm) -> dict:
    """The proposer's counters and its budget policy's explanation (first worker)."""
    return llm.collective_rpc(_call, args=("summary",))[0]


def save_proposer_state(llm, directory: str) -> None:
    """Write the proposer's prior and recalled completions to `directory` (first worker's)."""
    llm.collective_rpc(_call, args=("save_state", str(directory)))


def load_proposer_state(llm, directory: str) -> None:
    """Restore what `save_proposer_state` wrote, on every worker."""
    llm.collective_rpc(_call, args=("load_state", str(directory)))


__all__ = ["ChainConfig", "load_proposer_state", "proposer_summary", "save_proposer_state", "speculative_config",
           "vllm_speculative_config"]
