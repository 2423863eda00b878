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
