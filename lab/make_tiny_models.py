#!/usr/bin/env python
"""Build the embedded tiny-math models used by tests, examples and CPU benchmarks.

Produces, deterministically and on CPU only (no network):

* a synthetic step-by-step arithmetic word-problem corpus (several problem
  families, several phrasings each; +, -, *, / with small exact numbers),
* a byte-level BPE tokenizer (digits split individually) wrapped as a
  ``PreTrainedTokenizerFast`` with a Qwen-style chat template,
* a Qwen3-architecture *target* causal LM and a ~6x smaller Qwen3 *draft*,
  both trained from scratch on the corpus,
* ``prompts.jsonl`` with held-out train/test prompts and gold answers for RL.

Output layout (default ``rollout_graft/assets/tiny-math/``)::

    target/      config.json, generation_config.json, model.safetensors, tokenizer files
    draft/       same, for the draft model
    prompts.jsonl  {"prompt": ..., "answer": "17", "split": "train"|"test"}
    build_stats.json  losses, accuracies, draft agreement, timings of the last build

Prompt / completion format (the reward function relies on it)::

    prompt     = "Question: <problem text>\\nAnswer:"
    completion = " <step line>\\n<step line>\\n...\\n#### <integer><|endoftext|>"

Target and draft train concurrently in two spawned processes with one torch thread each
(deterministic: a rerun on the same machine / torch version reproduces the files bit for bit).

Usage::

    python lab/make_tiny_models.py            # full build (~800 CPU-s: ~11-12 min on 2 idle cores)
    python lab/make_tiny_models.py --smoke    # quick reduced-step run into a temp dir
    python lab/make_tiny_models.py --check    # only evaluate the existing assets
    python lab/make_tiny_models.py --only early-target --early-target-steps 540 --out DIR
        # only the target's step-540 state of the same run (same data, RNG stream and LR schedule,
        # which spans all --target-steps) as DIR/target-early/; ~0.3 CPU-s per step
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "rollout_graft" / "assets" / "tiny-math"

CUE = "\nAnswer:"
QUESTION_PREFIX = "Question: "
EOS = "<|endoftext|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [EOS, PAD, IM_START, IM_END]  # ids 0..3
ANSWER_RE = re.compile(r"####\s*(-?\d+)")
# --early-target-steps default: 0 = no target-early/ snapshot (none is embedded; see --only early-target)
EARLY_TARGET_STEPS = 0

# Qwen-style chat template. Assistant turns end with the EOS token (instead of
# <|im_end|>) so that a single eos_token_id terminates both raw-prompt and
# conversational generations.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] -}}"
    "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}{%- else -%}{{- '<|im_end|>' -}}{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# --------------------------------------------------------------------------------------
# Synthetic corpus
# --------------------------------------------------------------------------------------

NAMES = [
    ("Tom", "m"), ("Anna", "f"), ("Ben", "m"), ("Lily", "f"), ("Sam", "m"), ("Mia", "f"),
    ("Jack", "m"), ("Emma", "f"), ("Leo", "m"), ("Zoe", "f"), ("Max", "m"), ("Sara", "f"),
    ("Noah", "m"), ("Ella", "f"), ("Owen", "m"), ("Ruby", "f"), ("Luke", "m"), ("Nora", "f"),
    ("Ryan", "m"), ("Amy", "f"),
]
PRON = {"m": ("he", "him", "his"), "f": ("she", "her", "her")}
OBJECTS = [
    "apples", "marbles", "stickers", "books", "cookies", "pencils", "coins", "cards",
    "shells", "stamps", "flowers", "eggs", "candies", "balloons", "beads", "toys",
    "oranges", "crayons", "buttons", "rocks",
]
ITEMS = [
    "pens", "notebooks", "cupcakes", "tickets", "toys", "books", "shirts", "plants",
    "cookies", "apples", "bottles", "balls",
]
MAKERS = [("machine", "toys"), ("baker", "cakes"), ("printer", "pages"), ("farm", "eggs"),
          ("factory", "cars"), ("shop", "shirts"), ("robot", "boxes"), ("team", "kites")]
FRIENDS_WORD = ["friends", "children", "students", "boxes", "bags"]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


class ProblemGen:
    """Random arithmetic word problems. Each sample returns (question, solution_lines, answer)."""

    def __init__(self, seed: int):
        self.r = random.Random(seed)

    # -- helpers ------------------------------------------------------------------------
    def _person(self, exclude=()):
        while True:
            name, g = self.r.choice(NAMES)
            if name not in exclude:
                return name, PRON[g]

    def sample(self):
        fam = self.r.choices(
            [self.change, self.shopping, self.sharing, self.compare, self.rate],
            weights=[3, 2, 2, 2, 2],
        )[0]
        return fam()

    # -- family 1: running total with 2-3 operations -------------------------------------
    def change(self):
        r = self.r
        name, (he, him, his) = self._person()
        friend, _ = self._person(exclude=(name,))
        obj = r.choice(OBJECTS)
        cur = r.randint(2, 40)
        q = [r.choice([
            f"{name} has {cur} {obj}.",
            f"{name} starts with {cur} {obj}.",
            f"{name} owns {cur} {obj}.",
        ])]
        sol = [f"{name} starts with {cur} {obj}."]
        n_ops = r.choice([2, 2, 3])
        last = None
        for i in range(n_ops):
            then = "" if i == 0 else r.choice(["Then ", "After that ", "Next "])
            kinds = []
            if cur <= 95:
                kinds.append("add")
            if cur >= 3:
                kinds.append("sub")
            mults = [k for k, lim in ((2, 40), (3, 20), (4, 9), (5, 9)) if cur <= lim]
            if mults and last != "mul":
                kinds.append("mul")
            divs = [k for k in range(2, 6) if cur % k == 0 and cur // k >= 2 and cur <= 50]
            if divs and last != "div":
                kinds.append("div")
            kind = r.choice(kinds)
            last = kind
            He = _cap(he) if not then else he
            if kind == "add":
                n = r.randint(1, min(30, 99 - cur))
                new = cur + n
                act = r.choice([
                    (f"{He} buys {n} more {obj}.", f"{_cap(he)} buys {n} more"),
                    (f"{He} finds {n} more {obj}.", f"{_cap(he)} finds {n} more"),
                    (f"{friend} gives {him} {n} {obj}.", f"{_cap(he)} gets {n} from {friend}"),
                    (f"{He} gets {n} more {obj}.", f"{_cap(he)} gets {n} more"),
                ])
                eq = f"{cur} + {n} = {new}"
            elif kind == "sub":
                n = r.randint(1, cur - 1)
                new = cur - n
                act = r.choice([
                    (f"{He} gives {n} {obj} to {friend}.", f"{_cap(he)} gives away {n}"),
                    (f"{He} loses {n} {obj}.", f"{_cap(he)} loses {n}"),
                    (f"{He} sells {n} {obj}.", f"{_cap(he)} sells {n}"),
                    (f"{He} uses {n} {obj}.", f"{_cap(he)} uses {n}"),
                ])
                eq = f"{cur} - {n} = {new}"
            elif kind == "mul":
                k = r.choice(mults)
                new = cur * k
                word = {2: "doubles", 3: "triples"}.get(k)
                if word and r.random() < 0.6:
                    act = (f"{He} {word} {his} {obj}.", f"{_cap(he)} {word} them")
                else:
                    act = (f"{He} ends up with {k} times as many {obj}.", f"{_cap(he)} gets {k} times as many")
                eq = f"{cur} * {k} = {new}"
            else:  # div
                k = r.choice(divs)
                new = cur // k
                if k == 2 and r.random() < 0.5:
                    act = (f"{He} gives away half of {his} {obj}.", f"{_cap(he)} keeps half")
                else:
                    act = (f"{He} splits {his} {obj} into {k} equal groups and keeps one group.",
                           f"{_cap(he)} keeps one of {k} groups")
                eq = f"{cur} / {k} = {new}"
            q.append(then + act[0])
            sol.append(f"{act[1]}, so {he} has {eq} {obj}.")
            cur = new
        q.append(r.choice([
            f"How many {obj} does {name} have now?",
            f"How many {obj} does {name} have in the end?",
            f"How many {obj} does {name} have left?",
        ]))
        return " ".join(q), sol, cur

    # -- family 2: shopping (multiply, add, optional change) ------------------------------
    def shopping(self):
        r = self.r
        name, (he, him, his) = self._person()
        i1, i2 = r.sample(ITEMS, 2)
        q1, q2 = r.randint(2, 5), r.randint(2, 5)
        p1, p2 = r.randint(2, 9), r.randint(2, 9)
        x, y = q1 * p1, q2 * p2
        z = x + y
        q = r.choice([
            f"{name} buys {q1} {i1} for {p1} dollars each and {q2} {i2} for {p2} dollars each.",
            f"{_cap(i1)} cost {p1} dollars each and {i2} cost {p2} dollars each. "
            f"{name} buys {q1} {i1} and {q2} {i2}.",
            f"At the store, {name} gets {q1} {i1} at {p1} dollars each and {q2} {i2} at {p2} dollars each.",
        ])
        sol = [
            f"The {i1} cost {q1} * {p1} = {x} dollars.",
            f"The {i2} cost {q2} * {p2} = {y} dollars.",
            f"In total {he} spends {x} + {y} = {z} dollars.",
        ]
        if r.random() < 0.4:
            bill = 50 if z < 50 and r.random() < 0.5 else 100
            c = bill - z
            q += f" {_cap(he)} pays with {bill} dollars. How many dollars of change does {he} get?"
            sol.append(f"The change is {bill} - {z} = {c} dollars.")
            return q, sol, c
        q += r.choice([
            f" How many dollars does {name} spend?",
            f" How much does {name} pay in total?",
            f" How many dollars does {he} spend in total?",
        ])
        return q, sol, z

    # -- family 3: sharing (exact division, then +/-) -------------------------------------
    def sharing(self):
        r = self.r
        name, (he, him, his) = self._person()
        obj = r.choice(OBJECTS)
        k = r.randint(2, 9)
        a = r.randint(2, 9)
        T = k * a
        v = r.randint(0, 2)
        if v == 0:
            m = r.randint(1, 20)
            who = r.choice(["friends", "children", "students"])
            q = (f"{name} has {T} {obj} and shares them equally among {k} {who}. "
                 f"Each of the {who} then gets {m} more {obj}. "
                 f"How many {obj} does each of the {who} have now?")
            sol = [f"Each of the {who} gets {T} / {k} = {a} {obj}.",
                   f"Then each has {a} + {m} = {a + m} {obj}."]
            return q, sol, a + m
        if v == 1:
            s = r.randint(1, a - 1)
            q = (f"{name} packs {T} {obj} into boxes of {k}. {_cap(he)} sells {s} of the boxes. "
                 f"How many boxes does {name} have left?")
            sol = [f"{_cap(he)} makes {T} / {k} = {a} boxes.",
                   f"After selling, {he} has {a} - {s} = {a - s} boxes."]
            return q, sol, a - s
        food = r.choice(["cookies", "muffins", "buns", "cupcakes", "pies", "rolls"])
        k, a, n = r.randint(2, 5), r.randint(2, 5), r.randint(2, 3)
        T = k * a
        total = T * n
        q = (f"{name} bakes {T} {food} each day for {n} days. {_cap(he)} puts all of them into bags of {k}. "
             f"How many bags does {name} fill?")
        sol = [f"{_cap(he)} bakes {T} * {n} = {total} {food}.",
               f"{_cap(he)} fills {total} / {k} = {total // k} bags."]
        return q, sol, total // k

    # -- family 4: comparison --------------------------------------------------------------
    def compare(self):
        r = self.r
        a_name, _ = self._person()
        b_name, _ = self._person(exclude=(a_name,))
        obj = r.choice(OBJECTS)
        a = r.randint(5, 40)
        d = r.randint(2, 20)
        if r.random() < 0.5 or d >= a:
            b = a + d
            rel = f"{d} more {obj} than {a_name}"
            l1 = f"{b_name} has {a} + {d} = {b} {obj}."
        else:
            b = a - d
            rel = f"{d} fewer {obj} than {a_name}"
            l1 = f"{b_name} has {a} - {d} = {b} {obj}."
        q = f"{a_name} has {a} {obj}. {b_name} has {rel}."
        sol = [l1]
        if r.random() < 0.5 or b > 45:
            q += r.choice([f" How many {obj} do they have together?", f" How many {obj} do they have in total?"])
            sol.append(f"Together they have {a} + {b} = {a + b} {obj}.")
            return q, sol, a + b
        c_name, _ = self._person(exclude=(a_name, b_name))
        k = r.choice([2, 3]) if b <= 20 else 2
        c = b * k
        q += f" {c_name} has {k} times as many {obj} as {b_name}. How many {obj} does {c_name} have?"
        sol.append(f"{c_name} has {b} * {k} = {c} {obj}.")
        return q, sol, c

    # -- family 5: rates -------------------------------------------------------------------
    def rate(self):
        r = self.r
        maker, obj = r.choice(MAKERS)
        rate = r.randint(2, 9)
        h = r.randint(2, 9)
        x = rate * h
        v = r.randint(0, 1)
        if v == 0:
            s = r.randint(2, x - 1)
            verb = r.choice(["sold", "given away", "broken"])
            q = (f"A {maker} makes {rate} {obj} every hour. It works for {h} hours. "
                 f"Then {s} of the {obj} are {verb}. How many {obj} are left?")
            sol = [f"The {maker} makes {rate} * {h} = {x} {obj}.",
                   f"There are {x} - {s} = {x - s} {obj} left."]
            return q, sol, x - s
        h2 = r.randint(2, 9)
        y = rate * h2
        q = (f"A {maker} makes {rate} {obj} every hour. It works {h} hours on Monday and {h2} hours on Tuesday. "
             f"How many {obj} does it make in total?")
        sol = [f"On Monday it makes {rate} * {h} = {x} {obj}.",
               f"On Tuesday it makes {rate} * {h2} = {y} {obj}.",
               f"In total it makes {x} + {y} = {x + y} {obj}."]
        return q, sol, x + y


def make_example(gen: ProblemGen):
    question, sol, ans = gen.sample()
    assert 0 <= ans < 1000, (question, ans)
    prompt = QUESTION_PREFIX + question + CUE
    completion = " " + "\n".join(sol) + f"\n#### {ans}"
    return prompt, completion, str(ans)


# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------

def train_tokenizer(texts, vocab_size: int, max_len: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=max_len,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    return hf


# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------

def make_config(tok, *, hidden, layers, inter, heads, kv_heads, max_pos):
    from transformers import Qwen3Config

    head_dim = hidden // heads
    return Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_cache=True,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )


def n_params(model) -> int:
    # tied embeddings are counted once
    return sum(p.numel() for p in model.parameters())


def batches_for(seqs, batch_size: int, rng: random.Random, pad_id: int):
    """Length-bucketed right-padded batches (deterministic given rng).

    ``seqs`` are ``(token_ids, prompt_len)`` pairs; labels cover the completion only
    (prompt and padding positions are -100)."""
    idx = list(range(len(seqs)))
    rng.shuffle(idx)
    chunk = batch_size * 32
    out = []
    for s in range(0, len(idx), chunk):
        part = sorted(idx[s:s + chunk], key=lambda i: len(seqs[i][0]))
        for b in range(0, len(part) - batch_size + 1, batch_size):
            out.append(part[b:b + batch_size])
    rng.shuffle(out)
    for b in out:
        L = max(len(seqs[i][0]) for i in b)
        ids = torch.full((len(b), L), pad_id, dtype=torch.long)
        mask = torch.zeros((len(b), L), dtype=torch.long)
        labels = torch.full((len(b), L), -100, dtype=torch.long)
        for j, i in enumerate(b):
            toks, plen = seqs[i]
            ids[j, : len(toks)] = torch.tensor(toks)
            mask[j, : len(toks)] = 1
            labels[j, plen: len(toks)] = ids[j, plen: len(toks)]
        yield ids, mask, labels


def train_model(model, seqs, *, steps, batch_size, lr, seed, pad_id, label, warmup_frac=0.05,
                min_lr_frac=0.05, log_every=100, snapshot_steps=(), stop_after=None, snapshots=None):
    """Train ``model`` for ``steps`` steps (the LR schedule always spans all ``steps``).

    ``snapshot_steps``: after each of these optimizer steps a copy of the state_dict is put into
    the ``snapshots`` dict (keyed by step); it consumes no randomness, so the run is unchanged.
    ``stop_after``: end after this many steps (same RNG stream and schedule as the full run, so
    the model is exactly the full run's state at that step)."""
    snapshot_steps = set(snapshot_steps)
    if snapshot_steps and snapshots is None:
        raise ValueError("snapshot_steps needs a snapshots dict")
    end = steps if stop_after is None else min(steps, stop_after)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in n else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.98), eps=1e-8,
    )
    warm = max(1, int(steps * warmup_frac))

    def lr_at(step):  # linear warmup, cosine decay to min_lr_frac * lr
        if step < warm:
            return (step + 1) / warm
        prog = (step - warm) / max(1, steps - warm)
        return min_lr_frac + (1 - min_lr_frac) * 0.5 * (1 + math.cos(math.pi * prog))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    step, t0, c0, ema = 0, time.time(), time.process_time(), None
    losses = []
    while step < end:
        for ids, mask, labels in batches_for(seqs, batch_size, rng, pad_id):
            out = model(input_ids=ids, attention_mask=mask, labels=labels)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            lv = out.loss.item()
            losses.append(lv)
            ema = lv if ema is None else 0.98 * ema + 0.02 * lv
            step += 1
            if step in snapshot_steps:
                snapshots[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if step % log_every == 0 or step == end:
                print(f"[{label}] step {step}/{steps} loss {lv:.4f} ema {ema:.4f} "
                      f"lr {sched.get_last_lr()[0]:.2e} wall {time.time() - t0:.0f}s cpu {time.process_time() - c0:.0f}s",
                      flush=True)
            if step >= end:
                break
    model.eval()
    tail = losses[-50:]
    return sum(tail) / len(tail), time.time() - t0


def _train_worker(cfg_dict, init_seed, seqs, train_kwargs, threads, result_path):
    """Child-process entry point: build, train and save one model (state_dict, snapshots, stats)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(init_seed)
    model = Qwen3ForCausalLM(Qwen3Config.from_dict(cfg_dict))
    snapshots = {}
    loss, secs = train_model(model, seqs, snapshots=snapshots, **train_kwargs)
    torch.save({"state_dict": model.state_dict(), "snapshots": snapshots, "loss": loss, "seconds": secs},
               result_path)


def train_both(jobs, threads: int, parallel: bool):
    """Train several models; with ``parallel`` each in its own single-process (spawned) worker.

    Each worker uses ``threads`` intra-op threads, so results do not depend on scheduling.
    Returns a list of (state_dict, final_loss, seconds, snapshots)."""
    import multiprocessing as mp

    tmp = Path(tempfile.mkdtemp(prefix="tiny-math-train-"))
    paths = [tmp / f"job{i}.pt" for i in range(len(jobs))]
    try:
        if parallel:
            ctx = mp.get_context("spawn")
            procs = [ctx.Process(target=_train_worker, args=(*job, threads, str(p))) for job, p in zip(jobs, paths)]
            for pr in procs:
                pr.start()
            for pr in procs:
                pr.join()
            bad = [pr.exitcode for pr in procs if pr.exitcode != 0]
            if bad:
                raise RuntimeError(f"training worker failed with exit codes {bad}")
        else:
            for job, p in zip(jobs, paths):
                _train_worker(*job, threads, str(p))
        res = [torch.load(p, weights_only=True) for p in paths]
        return [(r["state_dict"], r["loss"], r["seconds"], r["snapshots"]) for r in res]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def set_generation_config(model, tok):
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        max_new_tokens=160,
    )


# --------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------

def parse_answer(text: str):
    m = ANSWER_RE.search(text)
    return m.group(1) if m else None


@torch.no_grad()
def generate(model, tok, prompts, *, do_sample, seed, max_new_tokens=160, bs=64):
    tok.padding_side = "left"
    outs = []
    torch.manual_seed(seed)
    for s in range(0, len(prompts), bs):
        enc = tok(prompts[s:s + bs], return_tensors="pt", padding=True)
        kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if do_sample else dict(do_sample=False)
        g = model.generate(**enc, max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.pad_token_id, **kw)
        for row in g[:, enc["input_ids"].shape[1]:]:
            ids = row.tolist()
            ended = tok.eos_token_id in ids
            if ended:
                ids = ids[: ids.index(tok.eos_token_id)]
            outs.append((tok.decode(ids), ended, len(ids) + int(ended)))
    tok.padding_side = "right"
    return outs


@torch.no_grad()
def completion_loss_and_agreement(target, draft, tok, prompts, completions):
    """Mean completion-token loss of each model, and draft/target greedy next-token agreement."""
    tot = {"t_nll": 0.0, "d_nll": 0.0, "agree": 0, "n": 0}
    for p, c in zip(prompts, completions):
        pi = tok(p)["input_ids"]
        ci = tok(c)["input_ids"] + [tok.eos_token_id]
        ids = torch.tensor([pi + ci])
        lt = target(input_ids=ids).logits[0, len(pi) - 1:-1]
        ld = draft(input_ids=ids).logits[0, len(pi) - 1:-1]
        y = torch.tensor(ci)
        tot["t_nll"] += torch.nn.functional.cross_entropy(lt, y, reduction="sum").item()
        tot["d_nll"] += torch.nn.functional.cross_entropy(ld, y, reduction="sum").item()
        tot["agree"] += (lt.argmax(-1) == ld.argmax(-1)).sum().item()
        tot["n"] += len(ci)
    n = tot["n"]
    return tot["t_nll"] / n, tot["d_nll"] / n, tot["agree"] / n


def evaluate(out_dir: Path, n_eval: int = 64, seed: int = 0, verbose: bool = True):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tdir, ddir = out_dir / "target", out_dir / "draft"
    tok = AutoTokenizer.from_pretrained(tdir)
    AutoTokenizer.from_pretrained(ddir)  # must load too
    target = AutoModelForCausalLM.from_pretrained(tdir).eval()
    draft = AutoModelForCausalLM.from_pretrained(ddir).eval()
    rows = [json.loads(l) for l in (out_dir / "prompts.jsonl").read_text().splitlines() if l.strip()]
    test = [r for r in rows if r["split"] == "test"][:n_eval]
    prompts = [r["prompt"] for r in test]
    gold = [r["answer"] for r in test]
    res = {"target_params": n_params(target), "draft_params": n_params(draft)}
    t0 = time.time()
    greedy = generate(target, tok, prompts, do_sample=False, seed=seed)
    sampled = generate(target, tok, prompts, do_sample=True, seed=seed)
    dgreedy = generate(draft, tok, prompts, do_sample=False, seed=seed)
    for key, outs in (("target_greedy", greedy), ("target_t1", sampled), ("draft_greedy", dgreedy)):
        res[f"{key}_acc"] = sum(parse_answer(o[0]) == g for o, g in zip(outs, gold)) / len(gold)
        res[f"{key}_eos_rate"] = sum(o[1] for o in outs) / len(outs)
        res[f"{key}_mean_len"] = sum(o[2] for o in outs) / len(outs)
    # agreement on the target's own greedy completions (what speculative decoding sees at T=0)
    comps = [o[0] for o in greedy]
    t_nll, d_nll, agree = completion_loss_and_agreement(target, draft, tok, prompts, comps)
    res["draft_agreement_on_target_greedy"] = agree
    # and on the target's T=1 samples; also completion-token NLL of both models on those
    t_nll1, d_nll1, agree1 = completion_loss_and_agreement(
        target, draft, tok, prompts, [o[0] for o in sampled])
    res["draft_agreement_on_target_t1"] = agree1
    res["target_nll_on_t1_samples"] = t_nll1
    res["draft_nll_on_t1_samples"] = d_nll1
    res["eval_seconds"] = time.time() - t0
    if verbose:
        print("=== example (greedy) ===")
        print(prompts[0] + greedy[0][0] + ("<EOS>" if greedy[0][1] else "<no EOS>"), "| gold", gold[0])
        print("=== example (T=1) ===")
        print(prompts[1] + sampled[1][0] + ("<EOS>" if sampled[1][1] else "<no EOS>"), "| gold", gold[1])
        print("=== eval ===")
        for k, v in res.items():
            print(f"  {k}: {v:.4f}" if isinstance(v, float) else f"  {k}: {v}")
    return res


FINAL_LINE_RE = re.compile(r"####\s*(-?\d+)\s*$")  # the recipe's format reward: last line `#### N`


def evaluate_early_target(out_dir: Path, n_eval: int = 128, seed: int = 0, verbose: bool = True):
    """Greedy and T=1 accuracy, format and EOS rates of ``target-early/`` on the test prompts
    (same prompts, seeds and sampling as :func:`evaluate` uses for ``target/``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    edir = out_dir / "target-early"
    tok = AutoTokenizer.from_pretrained(edir)
    model = AutoModelForCausalLM.from_pretrained(edir).eval()
    rows = [json.loads(l) for l in (out_dir / "prompts.jsonl").read_text().splitlines() if l.strip()]
    test = [r for r in rows if r["split"] == "test"][:n_eval]
    prompts = [r["prompt"] for r in test]
    gold = [r["answer"] for r in test]
    res = {}
    for key, do_sample in (("target_early_greedy", False), ("target_early_t1", True)):
        outs = generate(model, tok, prompts, do_sample=do_sample, seed=seed)
        res[f"{key}_acc"] = sum(parse_answer(o[0]) == g for o, g in zip(outs, gold)) / len(gold)
        res[f"{key}_format_rate"] = sum(o[1] and FINAL_LINE_RE.search(o[0].strip()) is not None
                                        for o in outs) / len(outs)
        res[f"{key}_eos_rate"] = sum(o[1] for o in outs) / len(outs)
        res[f"{key}_mean_len"] = sum(o[2] for o in outs) / len(outs)
        if verbose:
            print(f"=== target-early example ({key}) ===")
            print(prompts[1] + outs[1][0] + ("<EOS>" if outs[1][1] else "<no EOS>"), "| gold", gold[1])
    if verbose:
        for k, v in res.items():
            print(f"  {k}: {v:.4f}")
    return res


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------

def prepare(args):
    """Held-out prompts, training corpus, tokenizer, tokenized sequences and model configs (deterministic)."""
    t_start = time.time()
    torch.manual_seed(args.seed)
    held = ProblemGen(args.seed + 1)
    held_rows, seen = [], set()
    while len(held_rows) < args.n_train_prompts + args.n_test_prompts:
        p, c, a = make_example(held)
        if p in seen:
            continue
        seen.add(p)
        split = "test" if len(held_rows) < args.n_test_prompts else "train"
        held_rows.append({"prompt": p, "answer": a, "split": split})
    n_target = args.target_steps * args.batch_size
    n_draft = args.draft_steps * args.batch_size
    gen = ProblemGen(args.seed)
    corpus, dropped = [], 0
    while len(corpus) < max(n_target, n_draft):
        p, c, a = make_example(gen)
        if p in seen:  # keep RL / eval prompts out of the training corpus
            dropped += 1
            continue
        corpus.append((p, c))
    print(f"corpus: {len(corpus)} examples ({dropped} dropped as held-out duplicates), "
          f"held-out prompts: {len(held_rows)}", flush=True)

    # ---- tokenizer -----------------------------------------------------------------
    max_pos = 512
    tok = train_tokenizer((p + c for p, c in corpus[:20000]), args.vocab_size, max_pos)
    assert tok.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3]
    chat_rng = random.Random(args.seed + 2)
    seqs = []  # (token ids, prompt length)
    for p, c in corpus:
        pi, ci = tok(p)["input_ids"], tok(c)["input_ids"]
        if len(seqs) < 2000:  # the prompt/completion boundary must not change tokenization
            assert pi + ci == tok(p + c)["input_ids"], (p, c)
        if chat_rng.random() < 0.1:  # a little chat-format data so conversational prompts work
            ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            pi = list(ids)
        seqs.append((pi + ci + [tok.eos_token_id], len(pi)))
    lens = sorted(len(s) for s, _ in seqs)
    comp_lens = sorted(len(s) - pl for s, pl in seqs[:5000])
    print(f"vocab {len(tok)}; seq len median {lens[len(lens) // 2]} max {lens[-1]}; completion len (incl. EOS) "
          f"median {comp_lens[len(comp_lens) // 2]} min {comp_lens[0]} max {comp_lens[-1]}", flush=True)
    assert lens[-1] <= max_pos

    # ---- models --------------------------------------------------------------------
    tcfg = make_config(tok, hidden=192, layers=4, inter=512, heads=6, kv_heads=2, max_pos=max_pos)
    dcfg = make_config(tok, hidden=96, layers=2, inter=256, heads=4, kv_heads=2, max_pos=max_pos)
    common = dict(batch_size=args.batch_size, pad_id=tok.pad_token_id)
    target_job = (tcfg.to_dict(), args.seed, seqs[:n_target],
                  dict(steps=args.target_steps, lr=args.target_lr, seed=args.seed, label="target", **common))
    draft_job = (dcfg.to_dict(), args.seed + 1, seqs[-n_draft:],
                 dict(steps=args.draft_steps, lr=args.draft_lr, seed=args.seed + 1, label="draft", **common))
    print(f"data + tokenizer ready after {time.time() - t_start:.0f}s", flush=True)
    return held_rows, tok, tcfg, dcfg, target_job, draft_job


def save_model(out_dir: Path, name: str, cfg, state_dict, tok) -> Path:
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM(cfg)
    model.load_state_dict(state_dict)
    d = out_dir / name
    if d.exists():
        shutil.rmtree(d)
    set_generation_config(model, tok)
    model.to(torch.float32).save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d


def build_early_target_only(args, out_dir: Path):
    """``--only early-target``: rebuild the data, retrain the target for its first
    ``--early-target-steps`` steps (the full run's RNG stream and LR schedule, which spans all
    ``--target-steps``), save ``target-early/``; the other assets are left alone."""
    t_start = time.time()
    held_rows, tok, tcfg, _, target_job, _ = prepare(args)
    prompts_file = out_dir / "prompts.jsonl"
    expected = "".join(json.dumps(r) + "\n" for r in held_rows)
    if prompts_file.exists() and prompts_file.read_text() != expected:
        raise SystemExit(f"{prompts_file} was not built with these settings (--seed etc.); refusing to mix builds")
    cfg_dict, init_seed, seqs, kwargs = target_job
    kwargs = dict(kwargs, stop_after=args.early_target_steps)
    print(f"training target to step {args.early_target_steps} of {args.target_steps}, {args.threads} thread(s)",
          flush=True)
    [(sd, loss, secs, _)] = train_both([(cfg_dict, init_seed, seqs, kwargs)], args.threads, parallel=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    d = save_model(out_dir, "target-early", tcfg, sd, tok)
    target_tok = out_dir / "target" / "tokenizer.json"
    if target_tok.exists() and target_tok.read_bytes() != (d / "tokenizer.json").read_bytes():
        raise SystemExit(f"{d}/tokenizer.json differs from {target_tok}: not the same build")
    if not prompts_file.exists():
        prompts_file.write_text(expected)
    res = evaluate_early_target(out_dir, n_eval=args.n_eval, seed=args.seed)
    res.update(target_early_steps=args.early_target_steps, target_early_train_seconds=secs,
               target_early_train_loss=loss)
    print(f"target-early (step {args.early_target_steps}/{args.target_steps}) written in "
          f"{time.time() - t_start:.0f}s: {d}")
    stats_file = out_dir / "build_stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    stats = {k: v for k, v in stats.items() if not k.startswith("target_early_")}
    stats_file.write_text(json.dumps({**stats, **res}, indent=2, sort_keys=True) + "\n")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help=f"output dir (default {DEFAULT_OUT})")
    ap.add_argument("--seed", type=int, default=20240607)
    ap.add_argument("--target-steps", type=int, default=1800)
    ap.add_argument("--draft-steps", type=int, default=1600)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--early-target-steps", type=int, default=EARLY_TARGET_STEPS,
                    help="also save the target after this many of its --target-steps steps as target-early/ "
                         "(an RL start model with room to improve); 0: don't")
    ap.add_argument("--only", choices=["all", "early-target"], default="all",
                    help="early-target: only (re)build target-early/ (trains the target to "
                         "--early-target-steps; leaves the other files alone)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--vocab-size", type=int, default=768)
    ap.add_argument("--n-train-prompts", type=int, default=512)
    ap.add_argument("--n-test-prompts", type=int, default=128)
    ap.add_argument("--n-eval", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads per training process (fixed for determinism)")
    ap.add_argument("--sequential", action="store_true",
                    help="train target then draft in this process instead of two parallel workers")
    ap.add_argument("--smoke", action="store_true", help="tiny step counts, writes to a temp dir unless --out")
    ap.add_argument("--check", action="store_true", help="only evaluate existing assets in --out")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    out_dir = args.out
    if out_dir is None:
        out_dir = Path(tempfile.mkdtemp(prefix="tiny-math-smoke-")) if args.smoke else DEFAULT_OUT
    if args.check:
        evaluate(out_dir, n_eval=args.n_eval, seed=args.seed)
        if (out_dir / "target-early").exists():
            evaluate_early_target(out_dir, n_eval=args.n_eval, seed=args.seed)
        return None
    if args.smoke:
        args.target_steps, args.draft_steps = 40, 60
        args.early_target_steps = min(args.early_target_steps, 20)
    if not 0 <= args.early_target_steps < args.target_steps:
        ap.error("--early-target-steps must be in [0, --target-steps)")
    if args.only == "early-target":
        if not args.early_target_steps:
            ap.error("--only early-target needs --early-target-steps > 0")
        return build_early_target_only(args, out_dir)

    t_start = time.time()
    held_rows, tok, tcfg, dcfg, target_job, draft_job = prepare(args)
    if args.early_target_steps:
        target_job[3]["snapshot_steps"] = (args.early_target_steps,)
    print(f"training target ({args.target_steps} steps) and draft ({args.draft_steps} steps) "
          f"{'sequentially' if args.sequential else 'in parallel'}, {args.threads} thread(s) each", flush=True)
    (t_sd, t_loss, t_time, t_snaps), (d_sd, d_loss, d_time, _) = train_both(
        [target_job, draft_job], args.threads, not args.sequential)

    # ---- save ----------------------------------------------------------------------
    out_dir.mkdir(parents=True, exist_ok=True)
    save_model(out_dir, "target", tcfg, t_sd, tok)
    save_model(out_dir, "draft", dcfg, d_sd, tok)
    if args.early_target_steps:
        save_model(out_dir, "target-early", tcfg, t_snaps[args.early_target_steps], tok)
    with open(out_dir / "prompts.jsonl", "w") as f:
        for r in held_rows:
            f.write(json.dumps(r) + "\n")
    build_wall = time.time() - t_start
    print(f"built in {build_wall:.0f}s; evaluating", flush=True)

    res = evaluate(out_dir, n_eval=args.n_eval, seed=args.seed)
    if args.early_target_steps:
        res.update(evaluate_early_target(out_dir, n_eval=args.n_eval, seed=args.seed),
                   target_early_steps=args.early_target_steps)
    res.update(target_final_train_loss=t_loss, draft_final_train_loss=d_loss, target_train_seconds=t_time,
               draft_train_seconds=d_time, build_seconds=build_wall, total_seconds=time.time() - t_start,
               target_steps=args.target_steps, draft_steps=args.draft_steps, batch_size=args.batch_size,
               target_lr=args.target_lr, draft_lr=args.draft_lr, seed=args.seed, threads=args.threads)
    print(f"target final train loss (completion tokens) {t_loss:.4f} ({t_time:.0f}s), draft {d_loss:.4f} "
          f"({d_time:.0f}s); total wall {res['total_seconds']:.0f}s; out {out_dir}")
    (out_dir / "build_stats.json").write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    return res


if __name__ == "__main__":
    main()
