"""The shipped real-model prompt set (rollout_graft/assets/real-prompts): structure and loaders."""

import json
import re

import pytest

from rollout_graft.assets import REAL_PROMPTS, TINY_ANSWER_PATTERN, load_real_prompts


def _file_rows():
    with open(REAL_PROMPTS, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_file_exists_and_counts():
    assert REAL_PROMPTS.is_file()
    rows = _file_rows()
    assert len(rows) == 96
    counts = {}
    for r in rows:
        assert set(r) == {"prompt", "answer", "kind", "split"}
        counts[(r["kind"], r["split"])] = counts.get((r["kind"], r["split"]), 0) + 1
    assert counts == {("math", "test"): 48, ("math", "train"): 16,
                      ("code", "test"): 24, ("code", "train"): 8}


def test_row_order_math_first_test_first():
    keys = [(r["kind"], r["split"]) for r in _file_rows()]
    expected = ([("math", "test")] * 48 + [("math", "train")] * 16
                + [("code", "test")] * 24 + [("code", "train")] * 8)
    assert keys == expected
    # the first 8 test rows are math
    assert all(r["kind"] == "math" for r in load_real_prompts(split="test")[:8])


def test_prompts_are_system_user_chats():
    users = set()
    for r in _file_rows():
        msgs = r["prompt"]
        assert isinstance(msgs, list) and len(msgs) == 2
        assert [m["role"] for m in msgs] == ["system", "user"]
        for m in msgs:
            assert set(m) == {"role", "content"}
            assert isinstance(m["content"], str) and m["content"].strip() == m["content"] != ""
        users.add(msgs[1]["content"])
        if r["kind"] == "math":
            assert "####" in msgs[0]["content"]
        else:
            assert "Python" in msgs[0]["content"]
    assert len(users) == 96  # no duplicate prompts


def test_math_answers_are_integers():
    math_rows = load_real_prompts(kind="math")
    assert len(math_rows) == 64
    for r in math_rows:
        assert isinstance(r["answer"], str)
        assert re.fullmatch(r"-?\d+", r["answer"]), r["answer"]
        assert str(int(r["answer"])) == r["answer"]
        # a completion ending like the system message asks is parsed by the shared pattern
        m = re.search(TINY_ANSWER_PATTERN, f"... so the total is {r['answer']}.\n#### {r['answer']}")
        assert m and m.group(1) == r["answer"]
        assert r["prompt"][1]["content"].endswith("?")


def test_code_answers_are_asserts_on_the_named_function():
    code_rows = load_real_prompts(kind="code")
    assert len(code_rows) == 32
    names = set()
    for r in code_rows:
        task = r["prompt"][1]["content"]
        m = re.search(r"`(\w+)\(", task)
        assert m, task
        name = m.group(1)
        names.add(name)
        assert r["answer"].startswith("assert ")
        code = compile(r["answer"], "<test>", "exec")
        assert name in code.co_names  # the test calls the function the task names
    assert len(names) == 32  # one function name per task


def test_loader_filters():
    everything = load_real_prompts()
    assert everything == _file_rows()
    for split in ("train", "test"):
        for kind in ("math", "code"):
            rows = load_real_prompts(split=split, kind=kind)
            assert rows == [r for r in everything if r["split"] == split and r["kind"] == kind]
        assert len(load_real_prompts(split=split)) == {"train": 24, "test": 72}[split]
    assert len(load_real_prompts(kind="math")) == 64
    assert len(load_real_prompts(kind="code")) == 32


@pytest.mark.parametrize("kwargs", [{"split": "val"}, {"split": "TEST"}, {"kind": "prose"},
                                    {"kind": "Math"}, {"split": "train", "kind": "all"}])
def test_loader_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError) as e:
        load_real_prompts(**kwargs)
    msg = str(e.value)
    if "split" in kwargs and kwargs["split"] not in ("train", "test"):
        assert "'train'" in msg and "'test'" in msg
    else:
        assert "'math'" in msg and "'code'" in msg


def test_prompt_texts_take_strings_as_they_are_and_chats_through_the_template(tmp_path):
    """`read_prompt_texts` (the vLLM benchmarks' prompt pool): plain strings stay, chat messages go
    through the tokenizer's chat template with the generation prompt."""
    from transformers import AutoTokenizer

    from rollout_graft.assets import TINY_TARGET, read_prompt_texts

    tok = AutoTokenizer.from_pretrained(str(TINY_TARGET))
    chat = load_real_prompts()[0]["prompt"]
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "Question: 1+1\nAnswer:"}) + "\n" + json.dumps({"prompt": chat}) + "\n")
    texts = read_prompt_texts(path, tok)
    assert texts == ["Question: 1+1\nAnswer:",
                     tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)]
    assert chat[-1]["content"] in texts[1] and texts[1] != chat[-1]["content"]
