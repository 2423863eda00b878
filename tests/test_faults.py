"""Fault injection: every file rollout_graft reads or writes survives corruption and interruption.

Readers: a corrupt or truncated file ends in a clear `ValueError` naming the file (never a raw
`JSONDecodeError`/`KeyError`/`IndexError`), except the D-cut cost cache, which warns, naming it,
and is profiled again. Writers: a write interrupted midway (the rename raising) leaves the old file
intact and no temporary file behind. Datasets: each bad row kind is named by its line before any
training step. Options: wrong types raise `TypeError` naming the field. vLLM's real runs are in
`test_vllm_faults.py`.
"""

import json
import os
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file

from rollout_graft import files
from rollout_graft.adjacency import EMPTY, AdjacencyIndex
from rollout_graft.assets import TINY_DRAFT, TINY_PROMPTS, TINY_TARGET, read_jsonl, read_prompt_rows, read_prompt_texts
from rollout_graft.config import DCutConfig, DraftConfig, EngineConfig, RetrievalConfig
from rollout_graft.cost import CostModel
from rollout_graft.pruning import load_thresholds, save_thresholds
from rollout_graft.vllm import ChainConfig, speculative_config
from rollout_graft.vllm.ngrams import read_prior
from trainers.config import GraftConfig
from trainers.grpo import GraftGRPOTrainer, read_rollout_state

VOCAB = 16


def named_error(path, fn, *args, **kwargs) -> str:
    """Call fn: it must raise a plain ValueError (not a JSONDecodeError, a ValueError subclass) naming `path`."""
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    assert type(info.value) is ValueError, f"raw {type(info.value).__name__}: {info.value}"
    assert str(path) in str(info.value), str(info.value)
    return str(info.value)


def interrupted(monkeypatch, path: Path, write) -> None:
    """`write()` with the final rename failing: the old content of `path` survives, no temp file remains."""
    before = path.read_bytes()
    monkeypatch.setattr(files.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full (injected)")))
    with pytest.raises(OSError, match="injected"):
        write()
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


# ---------------------------------------------------------------------------- the writing helper
def test_atomic_writes_replace_whole_files_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    files.atomic_write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    interrupted(monkeypatch, path, lambda: files.atomic_write_json(path, {"a": 2}))

    def serializer_fails():  # the serializer raising midway, after writing part of the temp file
        with files.atomic_path(path) as tmp:
            tmp.write_text('{"a": ')
            raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        serializer_fails()
    assert json.loads(path.read_text()) == {"a": 1} and len(list(tmp_path.iterdir())) == 1
    files.atomic_write_text(tmp_path / "new" / "dir" / "x.txt", "hi")  # creates the directory
    assert (tmp_path / "new" / "dir" / "x.txt").read_text() == "hi"


def test_atomic_writes_keep_the_modes_open_would_give(tmp_path):
    """Not mkstemp's private 0600: a new file gets 0666 less the umask, a replaced one keeps its mode."""
    new = tmp_path / "new.json"
    files.atomic_write_json(new, {})
    assert new.stat().st_mode & 0o777 == 0o666 & ~files._UMASK
    shared = tmp_path / "shared.json"
    shared.write_text("{}")
    shared.chmod(0o640)
    files.atomic_write_json(shared, {"a": 1})
    assert shared.stat().st_mode & 0o777 == 0o640


# ---------------------------------------------------------------------------- the D-cut cost cache
@pytest.fixture(scope="module")
def tiny_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TINY_TARGET, dtype=torch.float32, local_files_only=True).eval()


def _profile(model, **kw) -> CostModel:
    return CostModel.profile(model, batches=(1, 2), tokens=(1, 2), context=8, repeats=1, **kw)


@pytest.mark.parametrize("content", [b"", b"\xff\xfe garbage", b'{"batches": [1, 2], "tokens": [1', b"[1, 2, 3]",
                                     b'{"batches": [1, 2], "tokens": [1, 2]}',
                                     b'{"batches": [1, 2], "tokens": [1, 2], "latency_ms": [[1.0, 2.0]]}',
                                     b'{"batches": [1, 2], "tokens": [1, 2], "latency_ms": [[1, NaN], [2, 3]]}',
                                     b'{"batches": [2, 1], "tokens": [1, 2], "latency_ms": [[1, 2], [2, 3]]}'],
                         ids=["empty", "binary", "truncated", "list", "no-latency", "short-table", "nan", "unsorted"])
def test_a_corrupt_cost_cache_warns_naming_it_and_is_profiled_again(tiny_model, tmp_path, monkeypatch, content):
    monkeypatch.setenv("ROLLOUT_GRAFT_CACHE", str(tmp_path))
    path = tmp_path / "cost" / f"{CostModel.key_for(tiny_model)}.json"
    path.parent.mkdir()
    path.write_bytes(content)
    with pytest.warns(RuntimeWarning, match=str(path)):
        cost = _profile(tiny_model)
    assert cost.predict(1, 1) > 0
    again = CostModel.from_json(json.loads(path.read_text()))  # rewritten whole
    assert again.latency_ms == cost.latency_ms
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _profile(tiny_model).latency_ms == cost.latency_ms  # read back from the cache, silently


def test_the_profile_times_a_rollouts_steady_steps_not_the_first_forwards_cache_copy(tiny_model, monkeypatch):
    """The first forward after a prefill copies every row's prompt KV into a cache with spare room
    (`SlotLayer._reserve`); a rollout's steps append in place. On a clock where that copy costs
    100 ms and a forward 1 ms, the table holds the forwards alone: a profile that timed the copy priced
    plain forwards several times too dear and drafts too cheap beside them (D-cut then drafted at a loss)."""
    from rollout_graft import cost as cost_module
    from rollout_graft.runner import ModelRunner, SlotLayer

    clock = [0.0]
    reserve, verify = SlotLayer._reserve, ModelRunner.verify

    def dear_reserve(self, k, v, need):
        clock[0] += 0.1 if self.used else 0.0  # copying a filled cache (not a prefill's first allocation)
        return reserve(self, k, v, need)

    def timed_verify(self, *args, **kwargs):
        clock[0] += 0.001
        return verify(self, *args, **kwargs)

    monkeypatch.setattr(SlotLayer, "_reserve", dear_reserve)
    monkeypatch.setattr(ModelRunner, "verify", timed_verify)
    monkeypatch.setattr(cost_module.time, "perf_counter", lambda: clock[0])
    cost = CostModel.profile(tiny_model, batches=(1, 4), tokens=(1, 2, 8), context=16, repeats=2, use_cache=False)
    assert [ms for row in cost.latency_ms for ms in row] == pytest.approx([1.0] * 6)


def test_the_cost_cache_records_when_and_under_what_load(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLOUT_GRAFT_CACHE", str(tmp_path))
    cost = _profile(tiny_model)
    assert set(cost.meta) == {"profiled_at", "loadavg", "cpu_count", "torch_threads"}
    assert cost.meta["profiled_at"].endswith("+00:00") and cost.meta["torch_threads"] == torch.get_num_threads()
    if hasattr(os, "getloadavg"):
        assert len(cost.meta["loadavg"]["before"]) == 3 and len(cost.meta["loadavg"]["after"]) == 3
    path = tmp_path / "cost" / f"{cost.key}.json"
    assert json.loads(path.read_text())["profiled_at"] == cost.meta["profiled_at"]
    assert _profile(tiny_model).meta == cost.meta  # read back
    old = {k: v for k, v in json.loads(path.read_text()).items() if k in ("batches", "tokens", "latency_ms", "key")}
    path.write_text(json.dumps(old))  # a cache written before these keys existed
    assert _profile(tiny_model).meta == {}
    interrupted(monkeypatch, path, lambda: _profile(tiny_model, refresh=True))


# ---------------------------------------------------------------------------- the adjacency prior
def _prior() -> AdjacencyIndex:
    index = AdjacencyIndex.empty(1, VOCAB, 4)
    index.ids[0, 3, :2] = torch.tensor([5, 7])
    index.probs[0, 3, :2] = torch.tensor([0.6, 0.3], dtype=torch.float16)
    return index


def _tensors(**change) -> dict:
    index = _prior()
    t = {"ids": index.ids, "probs": index.probs}
    t.update(change)
    return t


@pytest.mark.parametrize("case", ["out-of-vocab", "negative", "nan", "above-one", "truncated", "no-probs", "float-ids",
                                  "shape", "not-safetensors"])
def test_a_bad_adjacency_prior_names_the_file(tmp_path, case):
    path = tmp_path / "graft_prior.safetensors"
    ids, probs = _prior().ids.clone(), _prior().probs.clone()
    if case == "out-of-vocab":
        ids[0, 3, 0] = VOCAB + 100
    elif case == "negative":
        ids[0, 3, 0] = -5
    elif case == "nan":
        probs[0, 3, 0] = float("nan")
    elif case == "above-one":
        probs[0, 3, 0] = 3.0
    tensors = {"ids": ids, "probs": probs}
    if case == "no-probs":
        tensors = {"ids": ids}
    elif case == "float-ids":
        tensors = {"ids": ids.float(), "probs": probs}
    elif case == "shape":
        tensors = {"ids": ids[0], "probs": probs[0]}
    save_file(tensors, str(path))
    if case == "truncated":
        path.write_bytes(path.read_bytes()[:-40])
    elif case == "not-safetensors":
        path.write_text("hello")
    named_error(path, AdjacencyIndex.load, path)
    # through the engine's config, before any generate: no IndexError mid-rollout
    from rollout_graft.proposers.retrieval import RetrievalProposer

    named_error(path, RetrievalProposer, RetrievalConfig(prior_path=str(path)), VOCAB, "cpu")


def test_the_adjacency_prior_round_trips_and_survives_an_interrupted_save(tmp_path, monkeypatch):
    path = tmp_path / "graft_prior.safetensors"
    _prior().save(path)
    loaded = AdjacencyIndex.load(path)
    assert torch.equal(loaded.ids, _prior().ids) and loaded.ids[0, 0, 0] == EMPTY
    interrupted(monkeypatch, path, lambda: AdjacencyIndex.empty(1, VOCAB, 4).save(path))
    assert torch.equal(AdjacencyIndex.load(path).ids, _prior().ids)


def test_a_missing_adjacency_prior_is_named_when_configured(tmp_path):
    missing = tmp_path / "graft_prior.safetensors"
    named_error(missing, RetrievalConfig, prior_path=str(missing))
    named_error(missing, GraftConfig, prior_path=str(missing))


def test_missing_draft_thresholds_are_named_when_configured(tmp_path):
    missing = tmp_path / "thresholds.json"
    named_error(missing, DraftConfig, thresholds_path=str(missing))
    named_error(missing, GraftConfig, method="graft", draft_model_name_or_path=str(TINY_DRAFT),
                draft_thresholds_path=str(missing))
    named_error(tmp_path, DraftConfig, thresholds_path=str(tmp_path))  # a folder


def test_a_prior_with_another_vocabulary_is_refused_before_generating(tmp_path):
    from rollout_graft.engine import RolloutEngine

    path = tmp_path / "prior.safetensors"
    _prior().save(path)
    with pytest.raises(ValueError, match="vocabulary"):
        RolloutEngine.from_pretrained(TINY_TARGET, EngineConfig(method="retrieval",
                                                                retrieval=RetrievalConfig(prior_path=str(path))))


# ---------------------------------------------------------------------------- the vLLM proposer's files
def _vllm_prior(path, **change) -> None:
    arrays = {"contexts": np.array([[-1, -1, 3, 4], [-1, -1, -1, 4]], dtype=np.int64),
              "successors": np.array([5, 6], dtype=np.int64), "counts": np.array([2, 1], dtype=np.int64),
              "order": np.array([4, 1], dtype=np.int64)}
    arrays.update(change)
    save_numpy({k: v for k, v in arrays.items() if v is not None}, str(path))


@pytest.mark.parametrize("case,change", [
    ("out-of-vocab", {"successors": np.array([5, VOCAB + 3], dtype=np.int64)}),
    ("negative", {"successors": np.array([-2, 6], dtype=np.int64)}),
    ("negative-context", {"contexts": np.array([[-1, -1, 3, -9], [-1, -1, -1, 4]], dtype=np.int64)}),
    ("nan-counts", {"counts": np.array([np.nan, 1.0])}),
    ("zero-count", {"counts": np.array([0, 1], dtype=np.int64)}),
    ("ragged", {"counts": np.array([1], dtype=np.int64)}),
    ("no-order", {"order": None}),
    ("truncated", {}),
    ("not-right-aligned", {"contexts": np.array([[-1, 3, -1, 4], [-1, -1, -1, 4]], dtype=np.int64)}),
    ("not-suffix-closed", {"contexts": np.array([[-1, -1, 3, 4], [-1, -1, -1, 7]], dtype=np.int64)}),
    ("below-min-match", {"order": np.array([4, 2], dtype=np.int64)}),
])
def test_a_bad_vllm_prior_names_the_file_at_config_time(tmp_path, case, change):
    path = tmp_path / "prior.safetensors"
    _vllm_prior(path, **change)
    if case == "truncated":
        path.write_bytes(path.read_bytes()[:-8])
    message = named_error(path, read_prior, path, VOCAB)
    says = {"not-right-aligned": "right-aligned", "not-suffix-closed": "its suffix [4] is not",
            "below-min-match": "fewer than its min_match 2"}
    assert says.get(case, "") in message  # the contexts' checks each name what is wrong
    if case != "out-of-vocab":  # the vocabulary is known only where vLLM runs (the proposer checks it there)
        named_error(path, speculative_config, prior_path=str(path))  # before vLLM starts
        named_error(path, GraftConfig, backend="vllm", prior_path=str(path))


def test_the_engines_adjacency_prior_given_to_vllm_is_named(tmp_path):
    path = tmp_path / "graft_prior.safetensors"
    _prior().save(path)
    assert "adjacency prior" in named_error(path, speculative_config, prior_path=str(path))
    with pytest.raises(ValueError, match="does not exist"):
        speculative_config(prior_path=str(tmp_path / "nope.safetensors"))


def _proposer(**options):
    from rollout_graft.vllm.proposer import RLDraftProposer

    cls = type("P", (RLDraftProposer,), {"config": ChainConfig(**options)})
    return cls(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                               model_config=SimpleNamespace(max_model_len=256, get_vocab_size=lambda: VOCAB)))


def test_the_vllm_proposer_refuses_a_prior_outside_its_vocabulary(tmp_path):
    path = tmp_path / "prior.safetensors"
    _vllm_prior(path, successors=np.array([5, VOCAB + 3], dtype=np.int64))
    named_error(path, _proposer, prior_path=str(path), budget_policy="fixed")


def _step(prop, text: list[int], sampled: list[int], prompt: int = 8) -> list[list[int]]:
    """One step of one request (id "r0", its prompt the first `prompt` tokens of `text`)."""
    ids = np.array([text + sampled], dtype=np.int32)
    prop.set_requests(["r0"], [prompt])
    return prop.propose([sampled], np.array([len(text) + len(sampled)]), ids)


def test_vllm_proposer_state_files_survive_corruption_and_interrupted_saves(tmp_path, monkeypatch):
    prop = _proposer(budget_policy="fixed", recall=2)
    text = [1, 2, 3, 1, 2, 3, 1, 2]
    for token in (3, 1, 2):
        _step(prop, text, [token])
        text = text + [token]
    prop.save_state(tmp_path)
    prior, recall = tmp_path / "prior.safetensors", tmp_path / "recall.json"
    assert read_prior(prior, VOCAB)["counts"].sum() > 0 and json.loads(recall.read_text())
    interrupted_dir = lambda: prop.save_state(tmp_path)  # noqa: E731
    before = {p.name: p.read_bytes() for p in (prior, recall)}
    monkeypatch.setattr(files.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("injected")))
    with pytest.raises(OSError):
        interrupted_dir()
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in (prior, recall)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prior.safetensors", "recall.json"]
    fresh = _proposer(budget_policy="fixed", recall=2)
    fresh.load_state(tmp_path)
    table = fresh.store.table(fresh.prior)
    for content in (b"\x00\x01garbage", b'[{"prompt": [1, 2]', b'[{"prompt": [1, 2]}]', b'{"prompt": []}',
                    b'[{"prompt": [1, -4], "completions": []}]', b'[{"prompt": [1, 99], "completions": [[2]]}]',
                    b'[{"prompt": [1, 2], "completions": [3]}]'):
        recall.write_bytes(content)
        named_error(recall, fresh.load_state, tmp_path)
        assert fresh.store.table(fresh.prior) == table  # nothing changed by a refused load


def test_vllm_counters_skip_a_draft_that_vllm_dropped():
    """The plugin tells the proposer what vLLM verified per row (`scheduled_drafts`): a draft vLLM
    dropped (its request was preempted) is not counted, one it cut counts its verified tokens."""
    counts = {}
    for scheduled in (None, [0], [2]):
        prop = _proposer(budget_policy="fixed")
        text = [1, 2, 3, 1, 2, 3, 1, 2]
        out = _step(prop, text, [3])
        assert len(out[0]) > 2  # a chain 1 2 3 ...
        prop.scheduled_drafts = scheduled
        _step(prop, text + [3], [9])  # rejected at its first token (or never verified)
        counts[str(scheduled)] = (prop.stats.drafts, prop.stats.draft_tokens)
    assert counts["None"] == (1, len(out[0]))
    assert counts["[0]"] == (0, 0)
    assert counts["[2]"] == (1, 2)


# ---------------------------------------------------------------------------- checkpoint state
@pytest.mark.parametrize("content", [b"", b"\xff garbage", b'{"rollouts": ', b"[]", b"{}", b'{"rollouts": -7}',
                                     b'{"rollouts": "3"}', b'{"rollouts": 2.5}', b'{"rollouts": true}'])
def test_resume_from_a_corrupt_rollout_state_names_the_file(tmp_path, content):
    path = tmp_path / "graft_rollout_state.json"
    path.write_bytes(content)
    named_error(path, read_rollout_state, str(path))
    trainer = SimpleNamespace(_rollouts=0, graft_config=GraftConfig(), _resume_prior=None, rollout_engine=None)
    named_error(path, GraftGRPOTrainer._restore_rollout_state, trainer, str(tmp_path))
    assert trainer._rollouts == 0


def test_resume_reads_a_good_rollout_state_and_refuses_a_corrupt_prior(tmp_path):
    (tmp_path / "graft_rollout_state.json").write_text('{"rollouts": 12}')
    trainer = SimpleNamespace(_rollouts=0, graft_config=GraftConfig(), _resume_prior=None, rollout_engine=None)
    GraftGRPOTrainer._restore_rollout_state(trainer, str(tmp_path))
    assert trainer._rollouts == 12
    prior = tmp_path / "graft_prior.safetensors"
    prior.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    named_error(prior, GraftGRPOTrainer._restore_rollout_state, trainer, str(tmp_path))


def test_the_rollout_state_is_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "graft_rollout_state.json"
    monkeypatch.setattr(GraftGRPOTrainer.__mro__[1], "_save_rng_state", lambda self, d: None)  # TRL's RNG states
    trainer = GraftGRPOTrainer.__new__(GraftGRPOTrainer)  # the method on a bare instance
    trainer.__dict__.update(_rollouts=5, accelerator=SimpleNamespace(is_main_process=True))
    trainer._save_rng_state(str(tmp_path))
    assert read_rollout_state(str(path)) == 5
    trainer._rollouts = 9
    monkeypatch.setattr(files.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("injected")))
    with pytest.raises(OSError):
        trainer._save_rng_state(str(tmp_path))
    monkeypatch.undo()
    assert read_rollout_state(str(path)) == 5 and [p.name for p in tmp_path.iterdir()] == [path.name]


# ---------------------------------------------------------------------------- thresholds
def test_pruning_thresholds_corrupt_or_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "thresholds.json"
    save_thresholds(path, (0, 1, 5), (0.3, 0.1, 0.05))
    assert load_thresholds(path, (0, 1, 5)) == (0.3, 0.1, 0.05)
    interrupted(monkeypatch, path, lambda: save_thresholds(path, (0, 1, 5), (0.9, 0.9, 0.9)))
    for content in ('{"checkpoints": [0, 1, 5]', '{"checkpoints": [0, 1, 5]}',
                    '{"checkpoints": [0, 1, 5], "thresholds": [0.3, "x", 0.1]}',
                    '{"checkpoints": [0, 1, 5], "thresholds": [0.3, 0.1]}'):
        path.write_text(content)
        named_error(path, load_thresholds, path, (0, 1, 5))


# ---------------------------------------------------------------------------- datasets
BAD_ROWS = {
    "bad JSON": (b'{"prompt": "Question: 1+1?", "answer": 2', "not valid JSON"),
    "non-UTF-8": (b'{"prompt": "Question: \xff\xfe?", "answer": 2}', "not UTF-8"),
    "not an object": (b'["Question: 1+1?", 2]', "not an object"),
    "missing prompt": (b'{"answer": 2}', "`prompt`"),
    "missing answer": (b'{"prompt": "Question: 1+1?"}', "`answer`"),
    "numeric prompt": (b'{"prompt": 17, "answer": 2}', "`prompt`"),
    "bad chat message": (b'{"prompt": [{"role": "user"}], "answer": 2}', "`prompt`"),
    "empty prompt": (b'{"prompt": "  ", "answer": 2}', "`prompt`"),
    "text answer": (b'{"prompt": "Question: 1+1?", "answer": "two"}', "`answer`"),
    "float answer": (b'{"prompt": "Question: 1+1?", "answer": 2.5}', "`answer`"),
    "null answer": (b'{"prompt": "Question: 1+1?", "answer": null}', "`answer`"),
    "5000-digit answer": (b'{"prompt": "Question: 1+1?", "answer": ' + b"7" * 5000 + b"}", "as a string"),
}


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_a_bad_dataset_row_is_named_by_line_and_field(tmp_path, kind):
    bad, field = BAD_ROWS[kind]
    good = b'{"prompt": "Question: 1+1?", "answer": "2", "split": "train"}'
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\n".join([good, good, b"", bad, good]) + b"\n")  # the bad row is line 4
    message = named_error(path, read_prompt_rows, path, split="train")
    assert "line 4" in message and field in message, message
    assert "byte" not in message and "position" not in message  # a line, not a byte offset


def test_good_datasets_load_and_answers_may_be_ints_or_integer_strings(tmp_path):
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": "Q?", "answer": 3}, {"prompt": [{"role": "user", "content": "Q?"}], "answer": "-4"}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert read_prompt_rows(path) == rows
    assert len(read_prompt_rows(TINY_PROMPTS, split="train")) > 0
    (tmp_path / "code.jsonl").write_text('{"prompt": "Q?", "answer": "assert f() == 1"}\n')
    assert read_prompt_rows(tmp_path / "code.jsonl", integer_answer=False)[0]["answer"] == "assert f() == 1"
    named_error(tmp_path / "missing.jsonl", read_jsonl, tmp_path / "missing.jsonl")
    (tmp_path / "bench.jsonl").write_text('{"prompt": "Q?"}\n{"text": "Q?"}\n')  # benchmark prompts need no answer
    message = named_error(tmp_path / "bench.jsonl", read_prompt_texts, tmp_path / "bench.jsonl", None)
    assert "line 2" in message and "`prompt`" in message


def test_the_recipe_refuses_a_bad_dataset_before_training(tmp_path):
    from conftest import load_script

    recipe = load_script("recipes/grpo_qwen3.py")
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "Question: 1+1?", "answer": "2"}\n{"prompt": "Question: 2+2?", "answer": "four"}\n')
    args = recipe.ScriptArguments(dataset_path=str(path))
    message = named_error(path, recipe.load_prompts, args, "train")
    assert "line 2" in message and "`answer`" in message


# ---------------------------------------------------------------------------- option types
@pytest.mark.parametrize("make", [
    lambda: ChainConfig(share_in_group="no"),
    lambda: ChainConfig(use_prior=1),
    lambda: ChainConfig(recall=2.0),
    lambda: ChainConfig(prior_path=3),
    lambda: speculative_config(share_in_group="no"),
    lambda: GraftConfig(share_in_group="no"),
    lambda: GraftConfig(backend="vllm", share_in_group="false"),
    lambda: GraftConfig(budget="60"),
    lambda: GraftConfig(save_prior="yes"),
    lambda: GraftConfig(method=3),
    lambda: EngineConfig(budget=60.0),
    lambda: EngineConfig(cost_profile_refresh="no"),
    lambda: EngineConfig(retrieval={"top_k": 4}),
    lambda: RetrievalConfig(share_in_group="no"),
    lambda: RetrievalConfig(merge_decay="0.5"),
    lambda: DraftConfig(prune="no"),
    lambda: DraftConfig(depth=7.0),
    lambda: DCutConfig(ratios=(0.5, "1")),
    lambda: DCutConfig(probe_share=None),
])
def test_options_of_the_wrong_type_raise_type_errors(make):
    with pytest.raises(TypeError, match=r"must be"):
        make()


def test_a_vllm_prior_path_for_a_prior_that_is_off_is_refused(tmp_path):
    path = tmp_path / "prior.safetensors"
    _vllm_prior(path)
    with pytest.raises(ValueError, match="use_prior"):
        ChainConfig(prior_path=str(path), use_prior=False)
    assert ChainConfig.from_class_name(ChainConfig(prior_path=str(path)).class_path().rsplit(".", 1)[1]).prior_path == str(path)


# ---------------------------------------------------------------------------- local model directories
@pytest.mark.parametrize("where", ["target", "drafter"])
def test_a_missing_model_directory_says_so_and_never_reaches_the_hub(where, tmp_path):
    from rollout_graft.engine import RolloutEngine

    if where == "target":
        with pytest.raises(FileNotFoundError, match="org/name does not exist"):
            RolloutEngine.from_pretrained("org/name")
    else:
        missing = tmp_path / "draft"
        with pytest.raises(FileNotFoundError, match=f"{missing} does not exist"):
            RolloutEngine.from_pretrained(TINY_TARGET, EngineConfig(method="graft", draft=DraftConfig(draft_model=str(missing))))


def test_the_trainers_drafter_directory_is_local_or_named(tmp_path):
    """GraftGRPOTrainer checks the drafter's vocabulary before training: a Hub id is not read from the
    Hub, it is named as a missing directory."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=4)
    dataset = [{"prompt": "1 + 1 ="}] * 4
    with pytest.raises(FileNotFoundError, match="org/drafter does not exist"):
        GraftGRPOTrainer(str(TINY_TARGET), lambda completions, **kw: [0.0] * len(completions), args=args,
                         graft_config=GraftConfig(method="graft", draft_model_name_or_path="org/drafter"),
                         train_dataset=Dataset.from_list(dataset),
                         processing_class=AutoTokenizer.from_pretrained(TINY_TARGET))


def test_an_answer_of_any_length_as_a_string_loads_and_is_rewarded(tmp_path):
    from rollout_graft.assets.rewards import correctness_reward

    digits = "9" * 5000  # more than Python's int() parses
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"prompt": "Q?", "answer": digits}) + "\n")
    assert read_prompt_rows(path)[0]["answer"] == digits
    completions = [f"#### {digits}", f"#### 0{digits}", f"#### {digits}8", "#### -0"]
    assert correctness_reward(completions, [digits, digits, digits, "0"]) == [1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8])
def test_an_adjacency_prior_with_narrow_integer_ids_loads(tmp_path, dtype):
    path = tmp_path / "graft_prior.safetensors"
    index = _prior()
    save_file({"ids": index.ids.to(dtype) if dtype != torch.uint8 else index.ids.clamp(min=0).to(dtype),
               "probs": index.probs}, str(path))
    if dtype == torch.uint8:  # EMPTY (-1) cannot be stored unsigned: 0 ids stand in, all inside the vocabulary
        assert AdjacencyIndex.load(path).ids[0, 3, 0] == 5
        return
    loaded = AdjacencyIndex.load(path)
    assert torch.equal(loaded.ids, index.ids) and loaded.ids.dtype == torch.long
    ids = index.ids.clone().to(dtype)
    ids[0, 3, 0] = VOCAB + 3  # still outside, named with its real value
    save_file({"ids": ids, "probs": index.probs}, str(path))
    assert f"ids {VOCAB + 3} outside" in named_error(path, AdjacencyIndex.load, path)


def test_a_vllm_prior_with_an_unsigned_count_beyond_int64_is_named(tmp_path):
    path = tmp_path / "prior.safetensors"
    _vllm_prior(path, counts=np.array([2**64 - 1, 1], dtype=np.uint64))
    assert "2**63 - 1" in named_error(path, read_prior, path, VOCAB)
    _vllm_prior(path, counts=np.array([3, 1], dtype=np.uint64), successors=np.array([5, 6], dtype=np.uint32))
    data = read_prior(path, VOCAB)
    assert data["counts"].dtype == np.int64 and data["counts"].tolist() == [3, 1]


def test_a_model_path_that_is_a_file_is_named(tmp_path):
    from rollout_graft.engine import RolloutEngine

    path = tmp_path / "model.safetensors"
    path.write_bytes(b"weights")
    with pytest.raises(ValueError, match=f"{path} is a file, not a directory: pass the directory"):
        RolloutEngine.from_pretrained(path)


def test_warm_prior_names_bad_arguments_and_warms_a_prior(tmp_path, capsys):
    """scripts/warm_prior.py: a folder as --out, a missing prompts file or model folder, a file without
    train rows and a count below 1 end in one line naming the fix; a small run saves a prior that loads."""
    import re

    from conftest import load_script

    script = load_script("scripts/warm_prior.py")
    only_test = tmp_path / "test.jsonl"
    only_test.write_text('{"prompt": "Q:1+1=", "split": "test"}\n')
    out = str(tmp_path / "prior.safetensors")
    for argv, message in ((["--out", str(tmp_path)], "is a folder: name the file"),
                          (["--out", out, "--prompts", str(tmp_path / "none.jsonl")], "does not exist"),
                          (["--out", out, "--model", str(tmp_path / "none")], "--model directory .* does not exist"),
                          (["--out", out, "--prompts", str(only_test)], "has no train rows"),
                          (["--out", out, "--num-prompts", "0"], "--num-prompts: 0: 1 or more")):
        with pytest.raises(SystemExit) as exc:
            script.main(argv)
        said = f"{exc.value.code} {capsys.readouterr().err}"  # our sys.exit's message, or argparse's on stderr
        assert re.search(message, said), said
    script.main(["--out", out, "--num-prompts", "1", "--rounds", "1", "--group-size", "2", "--max-new-tokens", "6"])
    assert AdjacencyIndex.load(out) is not None


def test_a_vllm_prior_given_as_a_path_object_and_a_zero_depth(tmp_path):
    """`prior_path` takes a pathlib.Path on the vLLM backend as on the engine; num_speculative_tokens=0
    (or a million) is refused, not read as the default 8."""
    path = tmp_path / "prior.safetensors"
    _vllm_prior(path)
    spec = speculative_config(prior_path=path)
    assert ChainConfig.from_class_name(spec["model"].rsplit(".", 1)[-1]).prior_path == str(path)
    assert GraftConfig(backend="vllm", prior_path=path).speculative_config()["method"] == "custom_class"
    for bad in (0, 10**6):  # a GRPO config is refused when it is made, before any model loads
        with pytest.raises(ValueError, match=rf"num_speculative_tokens must be an int in \[1, 1024\].*got {bad}"):
            GraftConfig(backend="vllm", num_speculative_tokens=bad)
