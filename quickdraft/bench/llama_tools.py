"""llama.cpp's own executables, compiled once from the llama.cpp that the pinned llama-cpp-python sdist vendors.

``llama-speculative-simple`` (its draft-model speculation, a ``bench`` peer) and ``llama-server`` (a
``bench-serve`` peer) are built together, with the same options, into
``$QUICKDRAFT_CACHE/llama.cpp/VERSION-OPTIONS/bin/``: CPU only, ``-march=native`` without AMX (ggml's AMX
backend crashes on our Q4_K_M files: llama.cpp issue #20824), static libraries, and nothing fetched from the
network at build time (no prebuilt web UI, no OpenSSL).
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from quickdraft.bench.peers import run_quietly, settings_key
from quickdraft.errors import ConfigError
from quickdraft.files import cache_root, make_once
from quickdraft.runtime.native.kernels import NO_AMX_FLAGS

LLAMA_CPP_PYTHON = "0.3.36"  # the version of the `peers` extra (llama.cpp is vendored in its sdist)
NO_AMX = " ".join(NO_AMX_FLAGS)
SPECULATIVE_TOOL = "llama-speculative-simple"
SERVER_TOOL = "llama-server"
TOOLS = (SPECULATIVE_TOOL, SERVER_TOOL)
CMAKE_OPTIONS = (  # in this order: they name the build's cache (tool_dir)
    "-DCMAKE_BUILD_TYPE=Release",
    f"-DCMAKE_C_FLAGS={NO_AMX}",
    f"-DCMAKE_CXX_FLAGS={NO_AMX}",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # the web UI would be downloaded at build time
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
)


def tool_dir() -> Path:
    """The build's cache, keyed by the version and the CMake options (an older build with AMX is not reused)."""
    return cache_root() / "llama.cpp" / f"{LLAMA_CPP_PYTHON}-{settings_key(*CMAKE_OPTIONS)}"


def missing_build_tools() -> list[str]:
    return [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]


def check_tool(name: str, user: str) -> None:
    """A clear error before anything is loaded when ``name`` is neither built nor buildable here."""
    missing = missing_build_tools()
    if missing and not (tool_dir() / "bin" / name).is_file():
        raise ConfigError(f"{user} builds llama.cpp's {name} once: it needs {' and '.join(missing)}, not found")


def scratch_dir(parent: Path, prefix: str = "tmp") -> tempfile.TemporaryDirectory[str]:
    """A scratch folder in ``parent``, removed when its ``with`` block ends however it ends, after removing the
    ``prefix``-named ones that runs killed mid-build left there (hundreds of MB each). The caller holds the lock
    (:func:`make_once`) under which no other process works in ``parent``."""
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f"{prefix}*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.TemporaryDirectory(dir=parent, prefix=prefix, ignore_cleanup_errors=True)


def vendored_source(work: Path, what: str, parts: tuple[str, ...] = ("",)) -> Path:
    """Download the pinned llama-cpp-python sdist into ``work`` and extract the llama.cpp it vendors (only the paths
    under it that start with one of ``parts``); returns that llama.cpp directory."""
    run_quietly(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(work)], what
    )  # fmt: skip
    (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if any(f"/vendor/llama.cpp/{part}" in m.name for part in parts)]
        archive.extractall(work, members=members, filter="data")
    (source,) = work.glob("llama_cpp_python-*/vendor/llama.cpp")
    return source


CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def llama_converter() -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py`` (transformers directory -> GGUF, F32/F16/BF16/Q8_0), with the modules
    and the gguf-py it imports, from the pinned sdist: extracted once into the cache (:func:`make_once`), no build."""
    directory = cache_root() / "llama.cpp" / f"{LLAMA_CPP_PYTHON}-converter"
    script = directory / "convert_hf_to_gguf.py"

    def extract() -> None:
        with scratch_dir(directory.parent, f".{directory.name}-") as scratch:  # this version's only: its lock's
            source = vendored_source(Path(scratch), "extracting llama.cpp's converter", CONVERTER_PARTS)
            shutil.rmtree(directory, ignore_errors=True)
            source.rename(directory)

    make_once(directory, script.is_file, extract)
    return script


def llama_tool(name: str, progress: bool = True) -> Path:
    """The path of llama.cpp's executable ``name`` (one of ``TOOLS``), building all of them on first use."""
    if name not in TOOLS:
        raise ValueError(f"unknown llama.cpp tool {name!r}")
    binary = tool_dir() / "bin" / name
    if binary.is_file():
        return binary
    check_tool(name, f"using {name}")
    make_once(tool_dir(), binary.is_file, lambda: build_tools(binary.parent, progress))
    return binary


def build_tools(bin_dir: Path, progress: bool) -> None:
    """Build every tool of ``TOOLS`` from the pinned sdist into ``bin_dir``, each moved into place when built."""
    started = time.perf_counter()
    what = f"building llama.cpp's {' and '.join(TOOLS)}"
    if progress:
        print(f"{what} once into {bin_dir} (about 7 minutes on two cores) ...", file=sys.stderr, flush=True)
    with scratch_dir(tool_dir()) as scratch:
        work = Path(scratch)
        source = vendored_source(work, what)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        run_quietly(["cmake", "-S", str(source), "-B", str(work / "build"), *generator, *CMAKE_OPTIONS], what)
        jobs = str(len(os.sched_getaffinity(0)))
        targets = [part for tool in TOOLS for part in ("--target", tool)]
        run_quietly(["cmake", "--build", str(work / "build"), *targets, "-j", jobs], what)
        bin_dir.mkdir(parents=True, exist_ok=True)
        for tool in TOOLS:
            building = (bin_dir / tool).with_suffix(".building")
            shutil.copy2(work / "build" / "bin" / tool, building)
            building.replace(bin_dir / tool)
    if progress:
        print(f"built them in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
