"""Local stand-ins for the Hub ids of TRL's GRPO tests (`trl-internal-testing/...`), offline.

`tiny-Qwen2ForCausalLM-2.5` is the embedded tiny-math target (a trained Qwen3-architecture
model); every other causal LM and sequence classifier is a random tiny model of that
architecture built from its config, with the tiny-math tokenizer. They are written as a
Hugging Face hub cache (`models--trl-internal-testing--<name>/snapshots/<rev>/`), so every
`from_pretrained("trl-internal-testing/...")` inside TRL and the tests resolves them with
`HF_HUB_OFFLINE=1` and `HF_HUB_CACHE` pointing there. The Qwen3 stand-ins (`TOOL_TEMPLATE`) carry
TRL's Qwen3 chat template (`trl/chat_templates/qwen3.jinja`, as the Hub models do), which renders
tool calls, so TRL's `tools=` / `environment_factory` tests get past TRL's template check. The `zen` datasets are rows of the
embedded tiny-math prompts (`zen_dataset`). Ids without a stand-in (vision models, remote code)
are left out: their tests are deselected and listed as such.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import torch

from rollout_graft.assets import TINY_TARGET, load_tiny_prompts

ORG = "trl-internal-testing"
REVISION = "0" * 40
VERSION = 2
"""Of the stand-ins' files (2: the Qwen3 ones carry `TOOL_TEMPLATE`): a cache built by another version is not reused."""
_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=512)

# Hub name -> (model_type, architecture class, config overrides). Random weights, seeded.
RANDOM_MODELS = {
    "tiny-Qwen2ForSequenceClassification-2.5": ("qwen2", "Qwen2ForSequenceClassification", {"num_labels": 1}),
    "tiny-Qwen3ForSequenceClassification": ("qwen3", "Qwen3ForSequenceClassification", {"num_labels": 1}),
    "tiny-LlamaForSequenceClassification-3.2": ("llama", "LlamaForSequenceClassification", {"num_labels": 1}),
    "tiny-Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM", {}),
    "tiny-LlamaForCausalLM-3.2": ("llama", "LlamaForCausalLM", {}),
    "tiny-MistralForCausalLM-0.2": ("mistral", "MistralForCausalLM", {}),
    "tiny-Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM", {}),
    "tiny-Cohere2ForCausalLM": ("cohere2", "Cohere2ForCausalLM", {}),
    "tiny-Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM",
                                 {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "tiny-Glm4MoeForCausalLM": ("glm4_moe", "Glm4MoeForCausalLM",
                                {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                 "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1}),
    "tiny-GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM",
                               {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 64}),
    "tiny-NemotronHForCausalLM-nano": ("nemotron_h", "NemotronHForCausalLM",
                                       {"layers_block_type": ["mamba", "attention"], "mamba_num_heads": 4,
                                        "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 1,
                                        "mamba_n_groups": 1, "chunk_size": 16}),
}
EMBEDDED = {"tiny-Qwen2ForCausalLM-2.5": TINY_TARGET}
TOOL_TEMPLATE = ("tiny-Qwen3ForCausalLM", "tiny-Qwen3MoeForCausalLM")  # given TRL's tool-capable Qwen3 template
DATASETS = ("zen",)


def standin_ids() -> list[str]:
    return [f"{ORG}/{name}" for name in (*EMBEDDED, *RANDOM_MODELS)]


def build_hub_cache(root: Path) -> Path:
    """Write every stand-in into a hub cache under `root` (kept: rebuilt only when missing or of
    another `VERSION`); returns the cache's folder, for HF_HUB_CACHE."""
    root = root / f"v{VERSION}"
    root.mkdir(parents=True, exist_ok=True)
    for name in (*EMBEDDED, *RANDOM_MODELS):
        snapshot = root / f"models--{ORG}--{name}" / "snapshots" / REVISION
        if (snapshot / "config.json").is_file():
            continue
        tmp = snapshot.with_name(REVISION + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if name in EMBEDDED:
            shutil.copytree(EMBEDDED[name], tmp)
        else:
            _random_model(name, *RANDOM_MODELS[name], tmp)
        tmp.rename(snapshot)
        (snapshot.parent.parent / "refs").mkdir(exist_ok=True)
        (snapshot.parent.parent / "refs" / "main").write_text(REVISION)
    return root


def _random_model(name: str, model_type: str, architecture: str, overrides: dict, out: Path) -> None:
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY_TARGET)
    if name in TOOL_TEMPLATE:
        tokenizer.chat_template = qwen3_chat_template()
    config = AutoConfig.for_model(model_type, **_SMALL, **overrides, vocab_size=len(tokenizer),
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                  bos_token_id=tokenizer.eos_token_id)
    if model_type == "nemotron_h":
        config.num_hidden_layers = len(overrides["layers_block_type"])
    torch.manual_seed(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
    model = getattr(transformers, architecture)(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def qwen3_chat_template() -> str:
    """TRL's Qwen3 chat template (renders tool calls; TRL's response parser knows it)."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()


def zen_dataset(name: str, config: str, split: str | None = None, streaming: bool = False):
    """`load_dataset("trl-internal-testing/zen", config, split=...)` from the tiny-math prompts
    (17 train rows, 2 test rows, as zen's): "standard_prompt_only" or "conversational_prompt_only"."""
    from datasets import Dataset, DatasetDict, IterableDatasetDict

    if name != f"{ORG}/zen" or config not in ("standard_prompt_only", "conversational_prompt_only"):
        raise FileNotFoundError(f"no local stand-in for dataset {name!r} config {config!r}")
    rows = {"train": load_tiny_prompts("train")[:17], "test": load_tiny_prompts("test")[:2]}

    def make(split_rows):
        prompts = [r["prompt"] for r in split_rows]
        if config == "conversational_prompt_only":
            prompts = [[{"role": "user", "content": p}] for p in prompts]
        data = Dataset.from_dict({"prompt": prompts})
        return data.to_iterable_dataset() if streaming else data

    if split is not None:
        return make(rows[split])
    parts = {k: make(v) for k, v in rows.items()}
    return IterableDatasetDict(parts) if streaming else DatasetDict(parts)
