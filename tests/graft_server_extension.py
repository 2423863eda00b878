"""Our proposer's counters and state over a vLLM server's `/collective_rpc` (tests/test_trl_vllm_serve.py).

`trl vllm-serve ... --worker-extension-cls graft_server_extension.ProposerRPC` mixes this class into
vLLM's worker (the folder of this file on PYTHONPATH); TRL's server runs in dev mode
(`VLLM_SERVER_DEV_MODE=1`), where `POST /collective_rpc {"method": "graft_proposer_summary"}` calls it
on every worker. A server only passes strings in, and JSON out.
"""


class ProposerRPC:
    def graft_proposer_summary(self) -> dict:
        """The proposer's counters (`RLDraftProposer.summary`, numbers only)."""
        summary = self.model_runner.drafter.summary()
        return {k: v for k, v in summary.items() if isinstance(v, (int, float))}

    def graft_save_proposer_state(self, directory: str) -> None:
        """Write the proposer's prior and remembered completions (`recall.json`) to `directory`."""
        self.model_runner.drafter.save_state(directory)
