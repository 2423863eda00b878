"""Tiny, offline fixtures for the TRL tests: a character-level tokenizer with a chat template,
a random Qwen3 policy over its vocabulary and a few arithmetic prompts."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIALS = ["<pad>", "<eos>", "<bos>"]  # ids 0, 1, 2
CHARS = list("0123456789+-*=#?: \nabcdehilmnopqrstuwxyQA")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def char_tokenizer(chars: list[str] = CHARS) -> PreTrainedTokenizerFast:
    """One token per character; `<eos>` = 1, `<pad>` = 0."""
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="?")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_policy(vocab: int, seed: int = 0, sharp: float = 3.0) -> Qwen3ForCausalLM:
    """A random 2-layer Qwen3 (a few k parameters); `sharp` peaks its distributions so retrieval
    drafts get accepted. eos = 1, pad = 0 as in `char_tokenizer`."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, eos_token_id=1, pad_token_id=0,
        bos_token_id=2, tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharp)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model


QUESTIONS = ["1+2=", "3*4=", "9-5=", "7+8=", "6*6=", "2-9=", "5+5=", "8*3="]


def prompt_dataset(n: int = 8, conversational: bool = False) -> Dataset:
    qs = [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]
    prompts = [[{"role": "user", "content": q}] for q in qs] if conversational else [f"Q:{q}\nA:" for q in qs]
    return Dataset.from_dict({"prompt": prompts})


def length_reward(completions, **kwargs) -> list[float]:
    """A dense toy reward (short completions win) so advantages are non-zero."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [-len(t) / 32.0 for t in texts]


TOOL_CALL = '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
ENV_CALL = '<tool_call>\n{"name": "increment", "arguments": {"step": 2}}\n</tool_call>'


def tool_policy(call: str = TOOL_CALL):
    """A tool-calling policy over the embedded tiny-math tokenizer with Qwen3's chat template (which TRL
    knows how to parse tool calls from): `call` is one added token, and the model (1 layer, attention and
    MLP outputs zeroed, so its logits depend on the current token only) emits `call` after any other token
    and `<|im_end|>` (its EOS) after `call`, each with probability 1 - 1e-15 (head_dim 32: vLLM's CPU
    attention has no kernel for smaller heads). Returns (model, tokenizer)."""
    from pathlib import Path

    import trl
    from transformers import AutoTokenizer

    from rollout_graft.assets import TINY_TARGET

    tok = AutoTokenizer.from_pretrained(TINY_TARGET)
    tok.add_tokens([call])
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tok.eos_token = "<|im_end|>"
    x, eos = tok.convert_tokens_to_ids(call), tok.eos_token_id
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048,
                      eos_token_id=eos, pad_token_id=tok.pad_token_id, bos_token_id=eos, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        emb.zero_()
        emb[:, 1] = 1.0  # every token but `call` points one way...
        emb[x, 1], emb[x, 0] = 0.0, 1.0  # ...`call` the other
        head.zero_()
        head[x, 1] = head[eos, 0] = 35.0
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok
