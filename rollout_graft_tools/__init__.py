"""The benchmark's and the lab's library, beside the rollout path (`rollout_graft` never imports it):
one measuring loop with an adapter per backend (`benchmark`, `bench_engine`, `bench_vllm`), the
tables and plots of its JSONs (`tables`), the offline real models (`models`), acceptance studies by
replay (`replay` for the engine's trees, `chain_replay` for vLLM's chains) and upper bounds of
what a drafter could accept (`bounds`), the scripts' shared argparse types (`cli`). `scripts/` and
`lab/` import it, never each other."""
