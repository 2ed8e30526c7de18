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

NATIVE_FORMAT = "parts-v17"  # bump when the cached layout changes (v16: iq4 tables; v17: IQ2_XS, IQ2_S, IQ1 as iq4)
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
    def generation(self) -> int:
        """The N of ``parts-vN``; 0 for the layouts before weight parts."""
        number = self.format.removeprefix("parts-v")
        return int(number) if self.format.startswith("parts-v") and number.isdigit() else 0


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


def drop_superseded(entry: Path) -> None:
    """Delete the other entries whose notes name ``entry``'s model and weight format and whose cache format is
    ``entry``'s or older: packed from the model's earlier file or by an earlier version, no load reads them again. A
    newer version's entry stays, so a machine that runs two versions packs each once. What cannot be deleted
    (permissions) is left for ``quickdraft cache --prune`` to report."""
    own = read_note(entry)
    if own is None:
        return
    for other in entry.parent.iterdir():
        if other == entry or other.is_symlink() or not other.is_dir() or being_written(other):
            continue
        note = read_note(other)
        if note is not None and note[:2] == own[:2] and note.generation <= own.generation:
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
