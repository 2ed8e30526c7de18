"""The native runtime's packed-weight cache, entry by entry: where a model's packed weights live, the note each
entry keeps of what it was packed from, and which entries no load would read again.

An entry is ``$QUICKDRAFT_CACHE/native/<key>/``, the key a digest of the cache format, the weight format and the
model's weights (``native_cache_dir``). Rules: writing an entry deletes the entries of the same model and weight
format that an earlier version or the model's earlier file left (``drop_superseded``), so upgrading quickdraft does
not leave a copy per version; ``quickdraft cache --prune`` deletes the rest no load would read
(``stale_native_entries``). An entry being written (a ``*.partial`` file in it) is never deleted.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import NamedTuple

from quickdraft.files import cache_root
from quickdraft.models.convert import gguf_source, read_marker
from quickdraft.models.usage import MODEL_FOLDERS
from quickdraft.runtime.names import WEIGHT_FORMATS

NATIVE_FORMAT = "parts-v20"  # bump when the cached layout changes (v18: MXFP4 as q4t; v19, v20: NVFP4 as iq4h)
ENTRY_SOURCE = "source.json"  # in each packed entry: the format, weights and model it was packed from


def native_cache_dir(path: Path, weights: str = "auto") -> Path:
    """Where the quantized form of the model in ``path`` is kept: keyed by its config, the format and its weights:
    the GGUF file it reads them from (digest, size, modification time), else its path and safetensors files
    (names, sizes, modification times)."""
    import hashlib

    source = gguf_source(path)
    if source is None:
        identity, files = str(path.resolve()), sorted(path.glob("*.safetensors"))
    else:
        identity, files = f"gguf {(read_marker(path) or {}).get('sha256')}", [source]
    digest = hashlib.sha256(f"{NATIVE_FORMAT}|{weights}|{identity}".encode())
    digest.update((path / "config.json").read_bytes())
    for file in files:
        stat = file.stat()
        digest.update(f"|{file.name}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return cache_root() / "native" / digest.hexdigest()[:16]


def note_source(entry: Path, path: Path, weights: str) -> None:
    """Write what the packed ``entry`` was packed from (what ``quickdraft cache --prune`` reads); a read-only cache
    keeps no note."""
    note = {"format": NATIVE_FORMAT, "weights": weights, "model": str(path.resolve())}
    with contextlib.suppress(OSError):
        (entry / ENTRY_SOURCE).write_text(json.dumps(note))


class Note(NamedTuple):
    """What an entry's ``source.json`` says it was packed from."""

    model: Path
    weights: str
    format: str

    @property
    def generation(self) -> int | None:
        """The N of ``parts-vN``; None for a format this version cannot place (never deleted as older)."""
        number = self.format.removeprefix("parts-v")
        known = self.format.startswith("parts-v") and number.isascii() and number.isdecimal()
        return int(number) if known else None


def read_note(entry: Path) -> Note | None:
    """What an entry's note says; None without a readable one."""
    try:
        note = json.loads((entry / ENTRY_SOURCE).read_text())
        return Note(Path(note["model"]), str(note["weights"]), str(note["format"]))
    except (OSError, ValueError, KeyError, TypeError):  # no note, or a damaged one
        return None


def being_written(entry: Path) -> bool:
    """Whether a load is writing into ``entry`` now."""
    return any(entry.glob("*.partial"))


def superseded(other: Note, own: Note, other_written: float, own_written: float) -> bool:
    """Whether an entry noted ``other`` is superseded by one noted ``own``: the same model and weight format, and an
    older cache format, or the same one written earlier (the model's earlier file; a pack of the earlier file that
    finishes last leaves the current file's entry alone). A format either note cannot place is never superseded."""
    if other[:2] != own[:2] or other.generation is None or own.generation is None:
        return False
    return other.generation < own.generation or (other.generation == own.generation and other_written < own_written)


def written_at(entry: Path) -> float:
    """When an entry's weights were written (0 if they are not there)."""
    try:
        return (entry / "weights.safetensors").stat().st_mtime
    except OSError:
        return 0.0


def drop_superseded(entry: Path) -> None:
    """Delete the other entries that ``entry`` supersedes (:func:`superseded`): packed from the model's earlier file
    or by an earlier version, no load reads them again. A newer version's entry stays, so a machine that runs two
    versions packs each once. An entry being written is left, and what cannot be deleted (permissions) is left for
    ``quickdraft cache --prune`` to report."""
    own = read_note(entry)
    if own is None:
        return
    own_written = written_at(entry)
    for other in entry.parent.iterdir():
        if other == entry or other.is_symlink() or not other.is_dir() or being_written(other):
            continue
        note = read_note(other)
        if note is not None and superseded(note, own, written_at(other), own_written):
            shutil.rmtree(other, ignore_errors=True)


def cached_models() -> list[Path]:
    """The model directories in the cache: packaged models and ``.gguf`` files given on the command line."""
    configs = [config for folder in MODEL_FOLDERS for config in cache_root().glob(f"{folder}/*/hf/config.json")]
    return sorted(config.parent for config in configs)


def stale_native_entries() -> list[Path]:
    """Entries of ``$QUICKDRAFT_CACHE/native`` no load would read again: not the entry of a model in the cache in
    any weight format, nor of the model directory its source note names (an older format's, a removed model's). An
    entry packed before notes, of a directory outside the cache, counts as stale until a load writes its note."""
    native = cache_root() / "native"
    if not native.is_dir():
        return []
    live = set()
    for model in cached_models():
        with contextlib.suppress(OSError):  # a directory being written, or damaged: its entries are judged by notes
            live.update(native_cache_dir(model, weights) for weights in WEIGHT_FORMATS)
    for entry in native.iterdir():
        if being_written(entry):
            live.add(entry)
            continue
        note = read_note(entry)
        if note is None or note.weights not in WEIGHT_FORMATS:
            continue
        with contextlib.suppress(OSError):  # its model gone
            if native_cache_dir(note.model, note.weights) == entry:
                live.add(entry)
    return sorted(entry for entry in native.iterdir() if entry not in live)
