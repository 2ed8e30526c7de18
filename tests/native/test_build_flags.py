"""QUICKDRAFT_NATIVE_NO_AMX and _NO_AVX512 build the kernels without AMX or AVX-512, as their own builds; other values
are refused. Builds of one module take turns."""

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
    kernels.sources_digest.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    kernels.build_flags.cache_clear()
    kernels.sources_digest.cache_clear()


def test_no_amx_is_a_build_of_its_own(fresh_flags: pytest.MonkeyPatch) -> None:
    fresh_flags.delenv(kernels.NO_AMX_VARIABLE, raising=False)
    fresh_flags.delenv(kernels.NO_AVX512_VARIABLE, raising=False)
    usual, usual_digest = kernels.build_flags(), kernels.sources_digest()
    assert usual == kernels.FLAGS
    kernels.build_flags.cache_clear()
    kernels.sources_digest.cache_clear()
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
