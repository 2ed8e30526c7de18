"""C++ kernels of the native runtime, compiled once on first use (needs a C++ compiler and ninja). One process
builds a module; another waits for it.

If compilation fails the runtime falls back to the same algorithm in PyTorch operations: still
bit-stable, only slower. A warning says so. ``QUICKDRAFT_NATIVE_NO_AMX=1`` builds them without AMX on a
processor that has it: what a CPU with the same AVX-512 VNNI and no AMX runs (its own build and calibrations).
``QUICKDRAFT_NATIVE_NO_AVX512=1`` builds them with neither AVX-512, AVX-VNNI nor AMX: what an AVX2 CPU runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quickdraft.errors import ConfigError
from quickdraft.machine import cpu_fingerprint
from quickdraft.models.usage import files_size

# -ffp-contract=off: no fused multiply-adds but those written out (attention.h's, the same on every path it runs), so
# the compiler cannot make one path's bits differ from another's; -fopenmp: at::parallel_for runs the work
# on torch's threads only when the extension is compiled with OpenMP (without it, every kernel ran on one thread)
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]
NO_AMX_FLAGS = ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]
NO_AMX_VARIABLE = "QUICKDRAFT_NATIVE_NO_AMX"
NO_AVX512_FLAGS = ["-mno-avx512f", "-mno-avxvnni", *NO_AMX_FLAGS]  # -mno-avx512f turns every AVX-512 subset off
NO_AVX512_VARIABLE = "QUICKDRAFT_NATIVE_NO_AVX512"
FLAG_SETS = (FLAGS, FLAGS + NO_AMX_FLAGS, FLAGS + NO_AVX512_FLAGS)  # every set build_flags may give
MODULE_PREFIX = "quickdraft_native_"  # a build's module: the prefix, the processor's fingerprint, the sources' digest
COMPILED = ("kernels.cpp", "module.cpp")  # two sources, compiled side by side (module.cpp: the Python bindings)
SOURCES = (
    *COMPILED,
    "kernels.h",
    "layers.h",
    "gemm.h",
    "gemm_iq4.h",
    "gemm_q6.h",
    "gemm_q2.h",
    "gemm_q8.h",
    "gemm_amx.h",
    "attention.h",
    "simd.h",
)


@functools.cache
def build_flags() -> list[str]:
    """The compiler flags: :data:`FLAGS`, with :data:`NO_AVX512_FLAGS` when ``$QUICKDRAFT_NATIVE_NO_AVX512`` is 1,
    else with :data:`NO_AMX_FLAGS` when ``$QUICKDRAFT_NATIVE_NO_AMX`` is 1."""
    values = {name: os.environ.get(name, "") for name in (NO_AVX512_VARIABLE, NO_AMX_VARIABLE)}
    for name, value in values.items():
        if value not in ("", "0", "1"):
            raise ConfigError(f"{name} must be 0 or 1, got {value!r}")
    if values[NO_AVX512_VARIABLE] == "1":
        return FLAGS + NO_AVX512_FLAGS
    return FLAGS + NO_AMX_FLAGS if values[NO_AMX_VARIABLE] == "1" else list(FLAGS)


def sources_digest() -> str:
    """A digest of the kernels' sources and flags: torch rebuilds when a compiled source changes, not when a header
    it includes does, so the module's name carries it; measured costs are keyed by it too."""
    return flags_digest(tuple(build_flags()))


@functools.cache
def flags_digest(flags: tuple[str, ...]) -> str:
    """:func:`sources_digest` for the flags ``flags``."""
    here = Path(__file__).parent
    digest = hashlib.sha256(b"".join((here / name).read_bytes() for name in SOURCES) + str(list(flags)).encode())
    return digest.hexdigest()[:8]


@functools.cache
def native_kernels() -> Any | None:
    """The compiled module (the GEMMs, ``attend``, ``quantize_rows``, ...), or None when it cannot be built."""
    here = Path(__file__).parent
    name = f"{MODULE_PREFIX}{cpu_fingerprint()}_{sources_digest()}"
    try:
        from torch.utils.cpp_extension import load

        directory = build_directory(name)
        with held_build(directory):
            return load(  # -march=native: a build per processor kind, never one compiled for another CPU
                name=name,
                sources=[str(here / source) for source in COMPILED],
                extra_cflags=build_flags(),
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                verbose=False,
            )
    except Exception as error:  # a missing compiler or ninja surfaces as many exception types
        warnings.warn(
            f"quickdraft: the native runtime's kernels could not be compiled ({type(error).__name__}: {error}); "
            f"using the slower PyTorch path",
            stacklevel=2,
        )
        return None


def build_directory(name: str) -> Path:
    """Where the module ``name`` is built: under :func:`extensions_root`, in a folder per Python and torch version,
    since a module built against another torch may not load."""
    import torch

    return extensions_root() / f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}" / name


def extensions_root() -> Path:
    """``$TORCH_EXTENSIONS_DIR``, else torch's extensions cache on Linux (``$XDG_CACHE_HOME``, else ``~/.cache``, then
    ``torch_extensions``), found without importing torch (``quickdraft cache`` does not)."""
    if chosen := os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(chosen)
    return Path(
        os.path.realpath(os.path.join(os.getenv("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "torch_extensions"))
    )


@dataclass(frozen=True)
class KernelBuild:
    path: Path  # the build's folder: its module, objects and build files
    size_bytes: int
    current: bool  # built from these sources, with one of FLAG_SETS (for any processor): a load may read it again


def kernel_builds() -> list[KernelBuild]:
    """Every build of the kernels under :func:`extensions_root`, for any Python and torch version, in path order."""
    current = {flags_digest(tuple(flags)) for flags in FLAG_SETS}
    return [
        KernelBuild(path, files_size(list(path.rglob("*"))), path.name.rsplit("_", 1)[-1] in current)
        for path in sorted(extensions_root().glob(f"*/{MODULE_PREFIX}*"))
        if path.is_dir()
    ]


@contextlib.contextmanager
def unused_build(directory: Path) -> Iterator[bool]:
    """Whether no process is building ``directory`` now (its lock beside it taken without waiting), held so until the
    block ends, when the lock file goes too: a stale build is deleted inside it. Only for a build of other sources:
    a build this version loads may have a process waiting on that lock file, and unlinking it would let a later one
    lock a new file and build beside it."""
    lock = directory.with_name(f"{directory.name}.lock")
    try:
        held = open(lock, "a")  # noqa: SIM115 - closed below, after the lock file is unlinked
    except OSError:
        yield False
        return
    with held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
        lock.unlink(missing_ok=True)


@contextlib.contextmanager
def held_build(directory: Path) -> Iterator[None]:
    """Hold the build in ``directory`` against other processes: a lock on a file beside it, which the system frees
    when its holder ends, however it ends. While it is held, torch's own lock file in ``directory`` can only be one
    that a killed build left behind, on which torch would wait forever: it is removed."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(f"{directory.name}.lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process building the same module: wait for it, then load its build
        (directory / "lock").unlink(missing_ok=True)
        yield


BUILD_NOTICE_S = 3.0  # a load of the kernels longer than this is a build, and is said to be one


def load_kernels(progress: bool = False) -> Any | None:
    """:func:`native_kernels`, saying on stderr (``progress``) when getting them takes long: a build happens once per
    processor kind and kernel source."""
    if not progress or native_kernels.cache_info().currsize:
        return native_kernels()

    def notice() -> None:
        print("quickdraft: building the native kernels for this processor (once; up to a minute)", file=sys.stderr)

    timer = threading.Timer(BUILD_NOTICE_S, notice)
    start = time.perf_counter()
    timer.start()
    try:
        kernels = native_kernels()
    finally:
        timer.cancel()
    if (seconds := time.perf_counter() - start) > BUILD_NOTICE_S:
        print(f"quickdraft: native kernels ready in {seconds:.0f} s", file=sys.stderr)
    return kernels
