"""What quickdraft keeps under ``$QUICKDRAFT_CACHE`` and how much of it is fp32 copies made for transformers.

Each packaged model (``models/<name>``) and each ``.gguf`` file given on the command line (``converted/<sha>``)
is one entry: its GGUF file (packaged models) and its directory of configs and tokenizer, plus the fp32
``model.safetensors`` if transformers ever loaded it. Every other top-level folder (``native``, ``calibrations``,
...) is one entry too. Everything in the cache is rebuilt when missing; the fp32 copies are the part worth
deleting (transformers' runtime makes them again, once, when it needs them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from quickdraft.files import cache_root

MODEL_FOLDERS = ("models", "converted")  # one entry per model inside these


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    size_bytes: int  # all its files
    fp32_bytes: int  # of which fp32 weights made for transformers (``hf/*.safetensors``)
    source: str | None = None  # the .gguf file a converted entry was made from, as its conversion marker says


def files_size(paths: list[Path]) -> int:
    return sum(path.stat().st_size for path in paths if path.is_file() and not path.is_symlink())


def entry(path: Path) -> CacheEntry:
    files = list(path.rglob("*")) if path.is_dir() else [path]
    fp32 = list(path.glob("hf/*.safetensors")) if path.parent.name in MODEL_FOLDERS else []
    return CacheEntry(path, files_size(files), files_size(fp32), converted_from(path))


def converted_from(path: Path) -> str | None:
    """The source its conversion marker names, for an entry of ``converted/``; None for others, or a marker that
    cannot be read."""
    from quickdraft.models.convert import MARKER

    if path.parent.name != "converted":
        return None
    try:
        source = json.loads((path / "hf" / MARKER).read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    return source if isinstance(source, str) else None


def cache_usage(root: Path | None = None) -> list[CacheEntry]:
    """The cache's entries in name order (none if the cache does not exist yet), but those that hold nothing (a lock
    a file that was not a model left)."""
    root = cache_root() if root is None else root
    if not root.is_dir():
        return []
    entries = []
    for top in sorted(root.iterdir()):
        inside = top.name in MODEL_FOLDERS and top.is_dir()
        entries.extend(entry(path) for path in (sorted(top.iterdir()) if inside else [top]))
    return [found for found in entries if found.size_bytes > 0]
