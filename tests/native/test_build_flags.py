"""QUICKDRAFT_NATIVE_NO_AMX and _NO_AVX512 build the kernels without AMX or AVX-512, as their own builds; other values
are refused. Builds of one module take turns. ``quickdraft cache`` lists the builds, ``--prune`` deletes other
sources' builds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quickdraft.errors import ConfigError
from quickdraft.runtime.native import kernels


@pytest.fixture
def fresh_flags(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    kernels.build_flags.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    kernels.build_flags.cache_clear()


def test_no_amx_is_a_build_of_its_own(fresh_flags: pytest.MonkeyPatch) -> None:
    fresh_flags.delenv(kernels.NO_AMX_VARIABLE, raising=False)
    fresh_flags.delenv(kernels.NO_AVX512_VARIABLE, raising=False)
    usual, usual_digest = kernels.build_flags(), kernels.sources_digest()
    assert usual == kernels.FLAGS
    kernels.build_flags.cache_clear()
    fresh_flags.setenv(kernels.NO_AMX_VARIABLE, "1")
    assert kernels.build_flags() == kernels.FLAGS + kernels.NO_AMX_FLAGS
    assert kernels.sources_digest() != usual_digest  # its own module name and calibrations


def test_other_values_are_refused(fresh_flags: pytest.MonkeyPatch) -> None:
    fresh_flags.setenv(kernels.NO_AMX_VARIABLE, "yes")
    with pytest.raises(ConfigError, match="must be 0 or 1"):
        kernels.build_flags()


def test_no_avx512_is_an_avx2_build_of_its_own(fresh_flags: pytest.MonkeyPatch) -> None:
    fresh_flags.setenv(kernels.NO_AMX_VARIABLE, "0")
    fresh_flags.setenv(kernels.NO_AVX512_VARIABLE, "1")
    assert kernels.build_flags() == kernels.FLAGS + kernels.NO_AVX512_FLAGS
    assert "-mno-avx512f" in kernels.build_flags() and "-mno-amx-tile" in kernels.build_flags()


@pytest.mark.parametrize(("seconds", "progress", "said"), [(0.3, True, True), (0.0, True, False), (0.3, False, False)])
def test_a_long_kernel_load_is_said_to_be_a_build(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], seconds: float, progress: bool, said: bool
) -> None:
    """A first build takes a minute: with progress on, stderr says so while it runs and when it is done."""
    import functools
    import time

    @functools.cache
    def slow_build() -> str:
        time.sleep(seconds)
        return "kernels"

    monkeypatch.setattr(kernels, "native_kernels", slow_build)
    monkeypatch.setattr(kernels, "BUILD_NOTICE_S", 0.1)
    assert kernels.load_kernels(progress) == "kernels"
    err = capsys.readouterr().err
    assert ("building the native kernels" in err and "ready in" in err) == said
    assert kernels.load_kernels(progress) == "kernels" and capsys.readouterr().err == ""  # loaded: nothing to say


def test_a_build_waits_for_another_and_clears_a_lock_a_killed_build_left(tmp_path: Path) -> None:
    """Builds of one module take turns (a lock the system frees when its holder ends); the holder removes torch's
    own lock file, which a build killed midway leaves and on which torch would wait forever."""
    directory = tmp_path / "quickdraft_native_x"
    directory.mkdir()
    (directory / "lock").touch()  # left by a killed build
    order: list[str] = []
    inside = threading.Event()

    def first() -> None:
        with kernels.held_build(directory):
            order.append("first in")
            inside.set()
            time.sleep(0.3)
            order.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(10)
    with kernels.held_build(directory):
        order.append("second in")
        assert not (directory / "lock").exists()
    thread.join()
    assert order == ["first in", "first out", "second in"]


def test_the_extensions_root_is_torchs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found without importing torch, the same folder torch builds in."""
    from torch.utils.cpp_extension import get_default_build_root

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    for cache_home in (None, str(tmp_path / "xdg")):
        if cache_home is None:
            monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        else:
            monkeypatch.setenv("XDG_CACHE_HOME", cache_home)
        assert kernels.extensions_root() == Path(get_default_build_root())
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "chosen"))
    assert kernels.extensions_root() == tmp_path / "chosen"


def test_cache_lists_the_builds_and_prunes_other_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kept: builds of these sources under any flag set and folder, and a stale one being built now (its lock held).
    Deleted: a stale one, with its lock file. Another extension in the same folders is not quickdraft's."""
    import fcntl
    import json

    from quickdraft.cli import main

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    no_amx = kernels.flags_digest(tuple(kernels.FLAGS + kernels.NO_AMX_FLAGS))
    names = {
        f"py311-torch9/{kernels.MODULE_PREFIX}cpu_{kernels.sources_digest()}": 1_000_000,
        f"py310-torch8/{kernels.MODULE_PREFIX}other_{no_amx}": 2_000_000,
        f"py311-torch9/{kernels.MODULE_PREFIX}cpu_deadbeef": 3_000_000,
        f"py311-torch9/{kernels.MODULE_PREFIX}cpu_0badf00d": 4_000_000,
        "py311-torch9/someone_elses_extension": 5_000_000,
    }
    for name, size in names.items():
        (tmp_path / "ext" / name).mkdir(parents=True)
        (tmp_path / "ext" / name / "module.so").write_bytes(b"\0" * size)
    builds = [tmp_path / "ext" / name for name in names]
    (builds[2].with_name(f"{builds[2].name}.lock")).touch()
    assert main(["cache", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    listed = [(row["path"], row["bytes"], row["stale"]) for row in rows]
    expected = [
        (str(path), size, stale) for path, size, stale in zip(builds, names.values(), (0, 0, 1, 1), strict=False)
    ]
    assert listed == sorted(expected)  # in path order
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"native kernel builds in {tmp_path / 'ext'}: 10.0 MB" in out
    assert f"3.0 MB  py311-torch9/{builds[2].name} (stale" in out and f"{builds[0].name}\n" in out
    with open(builds[3].with_name(f"{builds[3].name}.lock"), "a") as building:
        fcntl.flock(building, fcntl.LOCK_EX)  # another version building it now
        assert main(["cache", "--prune", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == [{"path": str(builds[2]), "bytes": 3_000_000, "kernels": True}]
        assert not builds[2].exists() and not builds[2].with_name(f"{builds[2].name}.lock").exists()
    assert main(["cache", "--prune"]) == 0
    assert "freed 4.0 MB: 0 stale packed weights, 1 stale kernel builds" in capsys.readouterr().out
    assert [path.exists() for path in builds] == [True, True, False, False, True]
