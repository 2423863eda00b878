"""Files we write and read: atomic writes, and reads that name the file when it is bad.

Every file rollout_graft writes (the cost cache, priors, recalled completions, checkpoint state,
thresholds, benchmark JSONs) goes through `atomic_path`: it is written to a temporary file in the
same directory and renamed over the target (`os.replace`, atomic on POSIX and Windows), so a run
interrupted mid-write (an exception, Ctrl-C, kill -9, a full disk) leaves the old file intact or
no file, never a truncated one.

Readers raise `ValueError` naming the file and what is wrong with it (never a raw
`JSONDecodeError`/`KeyError`/`IndexError`): `read_json`, `load_safetensors`, `local_dir`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once (os.umask can only be read by setting it)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write `path`'s new content to; on a clean exit it replaces `path`
    (creating its directory), on an exception it is deleted and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    # mkstemp makes the file private (0600); the file it replaces keeps its mode, a new one gets what
    # open() would give it (0666 less the umask): a checkpoint stays readable by whoever could read it
    os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_UMASK)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically (see `atomic_path`), flushed to disk before the rename."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj, **dumps_kwargs) -> None:
    """`json.dumps(obj, **dumps_kwargs)` to `path` atomically (benchmark JSONs, checkpoint state)."""
    atomic_write_text(path, json.dumps(obj, **dumps_kwargs))


def atomic_save_safetensors(tensors: dict, path: str | Path, numpy: bool = False) -> None:
    """`safetensors.{torch,numpy}.save_file(tensors, path)` atomically."""
    if numpy:
        from safetensors.numpy import save_file
    else:
        from safetensors.torch import save_file
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp))


def read_json(path: str | Path, what: str = "JSON file"):
    """The parsed content of `path`; ValueError naming it when it is missing, not UTF-8 or not JSON."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ValueError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {path} is a folder: pass the file") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path} is not UTF-8 text (a corrupt or binary file): delete or rewrite it") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}; "
                         "truncated or corrupt): delete or rewrite it") from None


def load_safetensors(path: str | Path, what: str, numpy: bool = False, device: str = "cpu") -> dict:
    """The tensors of a safetensors file; ValueError naming it when it is missing, truncated or corrupt."""
    if not Path(path).is_file():
        raise ValueError(f"{what} {path} does not exist (or is not a file)")
    try:
        if numpy:
            from safetensors.numpy import load_file

            return load_file(str(path))
        from safetensors.torch import load_file

        return load_file(str(path), device=device)
    except Exception as e:  # SafetensorError, OSError, …: the header or the data is corrupt
        raise ValueError(f"{what} {path} is not a readable safetensors file ({type(e).__name__}: {e}; truncated or "
                         "corrupt): save it again") from None


def require_keys(data, keys: tuple[str, ...], path: str | Path, what: str) -> None:
    """ValueError naming `path` when `data` is not a dict holding every key of `keys`."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path} must hold a JSON object with {list(keys)}, got {type(data).__name__}")
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(f"{what} {path} lacks {missing} (has {sorted(data)}): it is corrupt or from another tool")


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def local_dir(path: str | Path, what: str) -> Path:
    """`path` as a local directory; FileNotFoundError naming it when it does not exist (we never
    download: a Hub id such as "org/name" is not a directory here), ValueError when it is a file,
    TypeError when it is no path at all."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} directory must be a local path (str), got {type(path).__name__} {path!r}")
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ValueError(f"{what} path {path} is a file, not a directory: pass the directory that holds its "
                         f"config.json and weights (e.g. {p.parent})")
    if not p.is_dir():
        hint = (" (rollout_graft never downloads from the Hugging Face Hub: download it first, e.g. "
                "`huggingface-cli download org/name --local-dir DIR`, and pass DIR)") if not p.exists() else ""
        raise FileNotFoundError(f"{what} directory {path} does not exist{hint}")
    return p
