"""``quickdraft cache``: what the cache holds, entry by entry, and how to shrink it."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from quickdraft.errors import CacheError
from quickdraft.files import cache_root
from quickdraft.models.usage import cache_usage


def add_command(commands: Any, name: str, summary: str) -> None:
    cache = commands.add_parser(
        name,
        help=summary,
        description="Show the size of each entry of $QUICKDRAFT_CACHE (default ~/.cache/quickdraft): the packaged "
        "models (GGUF file and its directory), .gguf files given on the command line, the native runtime's "
        "packed weights, calibrations, ... and the fp32 copies made only for the transformers runtime. --prune deletes "
        "packed weights no load would read again. The native kernels' builds, in torch's extensions cache, are listed "
        "after the cache's entries.",
    )
    cache.add_argument(
        "--prune",
        action="store_true",
        help="delete the native runtime's packed weights that no load would read again (packed by an older version, "
        "or for a model no longer there) and the kernel builds of other versions' sources, and say what was freed",
    )
    cache.add_argument("--json", action="store_true", help="print a JSON list (with --prune: what was deleted)")
    cache.set_defaults(handler=run)


def size_text(size_bytes: int) -> str:
    """A size in GB from 0.1 GB, in MB from 0.1 MB, in kB from 1 kB, else in bytes."""
    if size_bytes >= 100_000_000:
        return f"{size_bytes / 1e9:.2f} GB"
    if size_bytes >= 100_000:
        return f"{size_bytes / 1e6:.1f} MB"
    return f"{size_bytes / 1e3:.1f} kB" if size_bytes >= 1000 else f"{size_bytes} B"


def remove(path: Path) -> str | None:
    """Delete the directory ``path`` (or a stray file or link in its place); None, or why part of it is still there
    (the first file that could not go)."""
    import shutil

    if path.is_symlink() or not path.is_dir():
        try:
            path.unlink()
        except OSError as error:
            return f"{path}: {error.strerror or error}"
        return None
    failures: list[str] = []
    shutil.rmtree(path, onerror=lambda _function, name, info: failures.append(f"{name}: {info[1]}"))
    return failures[0] if failures else None


def prune(args: argparse.Namespace) -> None:
    """Delete the stale packed weights (``entries.stale_native_entries``) and kernel builds (not ``current``; one being
    built now is left), each reported with the bytes it freed; an entry that could not be deleted (whole) is reported
    with why, and the command then fails."""
    from quickdraft.models.usage import entry
    from quickdraft.runtime.native.entries import stale_native_entries
    from quickdraft.runtime.native.kernels import kernel_builds, unused_build

    rows = []
    for path in stale_native_entries():
        size = 0 if path.is_symlink() else entry(path).size_bytes  # a link's target is not the cache's to free
        error = remove(path)
        left = entry(path).size_bytes if path.exists() and not path.is_symlink() else 0
        rows.append({"path": str(path), "bytes": size - left} | ({"error": error} if error else {}))
    for build in (build for build in kernel_builds() if not build.current):
        with unused_build(build.path) as unused:
            if not unused:  # another version is building it now
                continue
            error = remove(build.path)
        left = entry(build.path).size_bytes if build.path.exists() else 0
        freed = {"path": str(build.path), "bytes": build.size_bytes - left, "kernels": True}
        rows.append(freed | ({"error": error} if error else {}))
    failed = [row for row in rows if "error" in row]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            done = f"not deleted: {row['error']}" if "error" in row else "deleted"
            print(f"{size_text(row['bytes']):>10}  {done} {row['path']}")
        freed = sum(row["bytes"] for row in rows)
        deleted_builds = sum(1 for row in rows if "kernels" in row and "error" not in row)
        deleted = len(rows) - len(failed) - deleted_builds
        print(f"freed {size_text(freed)}: {deleted} stale packed weights, {deleted_builds} stale kernel builds")
    if failed:
        raise CacheError(f"{len(failed)} stale entries could not be deleted: the reason is beside each above")


def run(args: argparse.Namespace) -> None:
    from quickdraft.runtime.native.kernels import extensions_root, kernel_builds

    if args.prune:
        prune(args)
        return
    root, entries, builds = cache_root(), cache_usage(), kernel_builds()
    if args.json:
        rows = [{"path": str(e.path), "bytes": e.size_bytes, "fp32_bytes": e.fp32_bytes} | source(e) for e in entries]
        rows += [{"path": str(b.path), "bytes": b.size_bytes, "kernels": True, "stale": not b.current} for b in builds]
        print(json.dumps(rows, indent=2))
        return
    print(f"{root}: {size_text(sum(e.size_bytes for e in entries))}")
    for e in entries:
        fp32 = f" (fp32 copy for transformers {size_text(e.fp32_bytes)})" if e.fp32_bytes else ""
        origin = f" (from {e.source})" if e.source else ""
        print(f"{size_text(e.size_bytes):>10}  {e.path.relative_to(root)}{origin}{fp32}")
    fp32_total = sum(e.fp32_bytes for e in entries)
    if fp32_total:
        print(
            f"fp32 copies, made only for the transformers runtime and remade when needed: {size_text(fp32_total)}; "
            f"delete them with rm {shlex.quote(str(root))}/*/*/hf/model.safetensors"
        )
    if builds:
        extensions = extensions_root()
        print(f"native kernel builds in {extensions}: {size_text(sum(b.size_bytes for b in builds))}")
        for b in builds:
            stale = "" if b.current else " (stale: another version's sources; --prune deletes it)"
            print(f"{size_text(b.size_bytes):>10}  {b.path.relative_to(extensions)}{stale}")


def source(entry: Any) -> dict[str, str]:
    """A converted entry's ``source`` (the .gguf file it was made from) for its JSON row; nothing for others."""
    return {"source": entry.source} if entry.source else {}
