"""Files in quickdraft's cache that runs share: named by what their content depends on, written atomically,
made one run at a time under a lock; and a file a user names to be read, checked to be one."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from quickdraft.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows: files are still written atomically, but not locked
    fcntl = None  # type: ignore[assignment]


def input_file(flag: str, path: str | Path) -> Path:
    """``path`` as a file to read for ``flag``: a ``ConfigError`` saying what it is instead (missing, a directory)."""
    path = Path(path)
    if not path.is_file():
        what = f"{path} is a directory; give a file" if path.is_dir() else f"no such file: {path}"
        raise ConfigError(f"{flag}: {what}")
    return path


def cache_root() -> Path:
    """quickdraft's cache: ``$QUICKDRAFT_CACHE``, by default ``~/.cache/quickdraft``; ``ConfigError`` if it is
    not a directory."""
    root = Path(os.environ.get("QUICKDRAFT_CACHE") or Path.home() / ".cache" / "quickdraft").expanduser()  # "": unset
    if root.is_dir():
        return root
    if root.exists() or root.is_symlink():  # a file, a symlink to nowhere or in a loop, or made since the first look
        if root.is_dir():  # by another run
            return root
        raise ConfigError(f"the cache {root} ($QUICKDRAFT_CACHE) is not a directory; set QUICKDRAFT_CACHE to one")
    existing = next(parent for parent in root.parents if parent.exists())
    if not existing.is_dir():
        raise ConfigError(f"the cache {root} ($QUICKDRAFT_CACHE) cannot be made under the file {existing}")
    return root


def calibrations_dir() -> Path:
    """Where measured cost models and learned files are saved: ``$QUICKDRAFT_CACHE/calibrations``."""
    return cache_root() / "calibrations"


def keyed_file(key: Mapping[str, Any], suffix: str) -> Path:
    """A file in :func:`calibrations_dir` named by the hash of everything its content depends on."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return calibrations_dir() / f"{digest}{suffix}"


def lock_file(path: Path) -> Path:
    """The lock file beside ``path``: ``<path>.lock``."""
    return path.with_name(f"{path.name}.lock")


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file at ``path`` (made if missing) through the ``with`` block: another
    process taking it waits until the block ends. Where the lock cannot be had (a read-only directory, a
    system without ``fcntl``) the block runs unlocked."""
    handle = None
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another process holds it: say why this one waits
                what = path.name.removesuffix(".lock")
                print(f"quickdraft: waiting for another quickdraft process ({what})", file=sys.stderr)
                fcntl.flock(handle, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if handle is not None:
            os.close(handle)  # releases the lock


def make_once(path: Path, is_made: Callable[[], bool], make: Callable[[], None]) -> None:
    """``make()`` ``path`` unless ``is_made()``: one process at a time, under the lock beside it; another that asks
    meanwhile waits, then finds it made."""
    if is_made():
        return
    with exclusive_lock(lock_file(path)):
        if not is_made():
            make()


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`save_atomically`); raises OSError."""
    save_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def save_atomically(path: Path, save: Callable[[Path], None]) -> None:
    """Make ``path`` by ``save``-ing into a temporary file beside it and moving that into place, so a reader (or
    a process stopped mid-write) sees the old file or the new one, never a cut one; raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = new_temporary(path)
    try:
        save(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def new_temporary(path: Path) -> str:
    """A new empty file beside ``path``, named after it, with the mode ``open()`` gives under the umask (mkstemp's
    is the owner's alone, unreadable to a group sharing the directory)."""
    for _ in range(100):
        temporary = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return temporary
    raise FileExistsError(f"no free temporary name beside {path}")


def model_key(target_path: Path) -> str:
    """A model's name for what quickdraft trains for it (heads, data, checkpoints): the packaged name
    (``models/<name>/hf``), a GGUF file's digest (``converted/<digest>/hf``), or a local directory's name and a digest
    of where it is and what its config and weight files are (another model of the same name, or new weights in
    place, is another name)."""
    if target_path.name == "hf":
        return target_path.parent.name
    identity = hashlib.sha256(str(target_path.resolve()).encode())
    for path in sorted(target_path.iterdir()):
        if path.suffix in (".safetensors", ".bin", ".gguf", ".json") and path.is_file():  # config, weights, tokenizer
            stat = path.stat()
            identity.update(f"{path.name} {stat.st_size} {stat.st_mtime_ns}".encode())
    return f"{target_path.name}-{identity.hexdigest()[:12]}"
