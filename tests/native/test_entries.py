"""The packed-weight cache's entries: the notes they keep, which entries a new one supersedes, and what --prune
deletes."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import tiny_model

import quickdraft.runtime.native.entries as entries
from quickdraft.runtime import LoadOptions
from quickdraft.runtime.native import NativeRuntime


def fake_entry(native, name: str, model, weights: str, format: str, partial: bool = False):
    """An entry of a few bytes whose note names ``model``, ``weights`` and ``format``."""
    entry = native / name
    entry.mkdir()
    (entry / "weights.safetensors").write_bytes(b"x" * 10)
    if partial:
        (entry / "weights.partial").write_bytes(b"x")
    (entry / entries.ENTRY_SOURCE).write_text(json.dumps({"format": format, "weights": weights, "model": str(model)}))
    return entry


def test_packing_deletes_the_entries_it_supersedes(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new entry deletes the same model's entries in the same weight format of an older cache format (an earlier
    version) or of its own written before it (the model's earlier file); it keeps other formats, newer versions'
    entries, one of its own format written after it (a later pack), formats it cannot place, entries being written,
    entries without a note and other models'."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    model, other = tmp_path / "tiny", tmp_path / "other"
    tiny_model(64, seed=1).save_pretrained(model)
    NativeRuntime.load(model)
    first = entries.native_cache_dir(model)
    native = first.parent
    older = fake_entry(native, "a000000000000001", model.resolve(), "auto", "parts-v1")
    later = fake_entry(native, "b000000000000006", model.resolve(), "auto", entries.NATIVE_FORMAT)
    os.utime(later / "weights.safetensors", (time.time() + 3600, time.time() + 3600))
    kept = {
        later,
        fake_entry(native, "b000000000000001", model.resolve(), "int8", "parts-v1"),
        fake_entry(native, "b000000000000002", model.resolve(), "auto", "parts-v999"),
        fake_entry(native, "b000000000000003", model.resolve(), "auto", "parts-v1", partial=True),
        fake_entry(native, "b000000000000004", other.resolve(), "auto", "parts-v1"),
        fake_entry(native, "b000000000000007", model.resolve(), "auto", "int7-per-channel-v3"),
        fake_entry(native, "b000000000000008", model.resolve(), "auto", "parts-v18a"),
        fake_entry(native, "b000000000000009", model.resolve(), "auto", "parts-v\u00b2"),  # a digit int() refuses
    }
    noteless = native / "b000000000000005"
    noteless.mkdir()
    kept.add(noteless)
    assert entries.read_note(older).generation == 1 and entries.read_note(noteless) is None
    assert [entries.read_note(entry).generation for entry in sorted(kept)[-3:]] == [None, None, None]
    NativeRuntime.load(model)  # read back: nothing packed, nothing deleted
    assert older.exists() and first.exists()
    tiny_model(64, seed=2).save_pretrained(model)  # the model's new weights: a new entry
    NativeRuntime.load(model)
    second = entries.native_cache_dir(model)
    assert second != first
    assert set(native.iterdir()) == kept | {second}


def test_prune_deletes_only_packed_weights_no_load_reads(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Kept: a model in the cache (in any format) and a directory outside it that its entry's note names. Deleted:
    an entry without a note (an older version's), one whose note names a removed model, one of an older format."""
    import json
    import shutil

    from quickdraft.cli import main

    cache = tmp_path / "cache"
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(cache))
    inside, outside, removed = cache / "models" / "tiny" / "hf", tmp_path / "outside", tmp_path / "removed"
    for seed, directory in enumerate((inside, outside, removed)):
        tiny_model(64, seed=seed).save_pretrained(directory)
        NativeRuntime.load(directory, LoadOptions("int8" if directory is inside else "auto"))
    shutil.rmtree(removed)
    native = cache / "native"
    noteless = native / "0123456789abcdef"
    noteless.mkdir()
    (noteless / "weights.safetensors").write_bytes(b"x" * 10)
    older = native / "fedcba9876543210"
    older.mkdir()
    (older / entries.ENTRY_SOURCE).write_text(
        json.dumps({"format": "parts-v1", "weights": "auto", "model": str(outside)})
    )
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "no-builds"))  # the kernels loaded: prune none of theirs
    kept = {entries.native_cache_dir(inside, "int8"), entries.native_cache_dir(outside)}
    stale = set(entries.stale_native_entries())
    assert stale == set(native.iterdir()) - kept and len(stale) == 3  # removed's, the noteless and the older one
    assert main(["cache", "--prune", "--json"]) == 0
    assert {row["path"] for row in json.loads(capsys.readouterr().out)} == {str(path) for path in stale}
    assert set(native.iterdir()) == kept
    assert main(["cache", "--prune"]) == 0 and "freed 0 B: 0 stale packed weights" in capsys.readouterr().out
    (entries.native_cache_dir(outside) / entries.ENTRY_SOURCE).unlink()  # as packed before notes: written on a load
    NativeRuntime.load(outside)
    assert entries.stale_native_entries() == []


def test_prune_says_which_entries_it_could_not_delete(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """An entry rmtree cannot delete is reported with why, counts only the bytes that went, and fails the command."""
    import json
    import shutil

    from quickdraft.cli import main

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "no-builds"))
    stale = tmp_path / "cache" / "native" / "0123456789abcdef"
    stale.mkdir(parents=True)
    (stale / "weights.safetensors").write_bytes(b"x" * 10)
    real_rmtree = shutil.rmtree

    def refuse(path, ignore_errors=False, onerror=None):
        onerror(real_rmtree, str(path), (PermissionError, PermissionError(13, "Permission denied"), None))

    monkeypatch.setattr(shutil, "rmtree", refuse)
    assert main(["cache", "--prune", "--json"]) == 1
    out, err = capsys.readouterr()
    (row,) = json.loads(out)
    assert row["bytes"] == 0 and "Permission denied" in row["error"] and stale.exists()
    assert "1 stale entries could not be deleted" in err
    assert main(["cache", "--prune"]) == 1
    out = capsys.readouterr().out
    assert "not deleted: " in out and "freed 0 B: 0 stale packed weights" in out  # counts what went, not what was met
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    stray = tmp_path / "cache" / "native" / "stray.txt"  # a file where an entry would be: deleted as one
    stray.write_bytes(b"y" * 5)
    assert main(["cache", "--prune"]) == 0 and not stray.exists() and not stale.exists()
    assert "freed 15 B: 2 stale packed weights" in capsys.readouterr().out
    elsewhere = tmp_path / "elsewhere"  # a link to a directory: the link goes; what it points at stays, uncounted
    elsewhere.mkdir()
    (elsewhere / "kept.bin").write_bytes(b"z" * 7)
    (tmp_path / "cache" / "native" / "linked").symlink_to(elsewhere)
    assert main(["cache", "--prune"]) == 0 and (elsewhere / "kept.bin").exists()
    assert "freed 0 B: 1 stale packed weights" in capsys.readouterr().out
    assert not (tmp_path / "cache" / "native" / "linked").is_symlink()
