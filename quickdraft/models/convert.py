"""Convert a GGUF file once into a transformers directory (fp32 safetensors).

transformers can load GGUF (dequantizing every tensor, about a minute per billion
parameters) but refuses to ``save_pretrained`` such a model, so the weights, config,
generation config and tokenizer are written here directly. A marker file written last
records the source digest: a directory without it is an interrupted conversion.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from quickdraft.errors import ModelFilesError

MARKER = "quickdraft-source.json"


def is_converted(hf_dir: Path, source_sha256: str) -> bool:
    marker = hf_dir / MARKER
    try:
        return json.loads(marker.read_text())["sha256"] == source_sha256
    except (OSError, ValueError, KeyError, TypeError):
        return False


def save_configs(model: Any, directory: Path) -> None:
    """config.json and generation_config.json of a model loaded from GGUF, as ``save_pretrained`` would
    write them: without the GGUF's quantization (the weights are saved dequantized) and naming the model
    class in ``architectures`` (transformers leaves it empty for GGUF; tools such as llama.cpp's
    ``convert_hf_to_gguf.py`` and vLLM need it)."""
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)


def convert_gguf(gguf_path: Path, hf_dir: Path, source_sha256: str, progress: bool = True) -> None:
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    (hf_logging.enable_progress_bar if progress else hf_logging.disable_progress_bar)()
    started = time.perf_counter()
    if progress:
        print(f"converting {gguf_path.name} once into {hf_dir} (takes a few minutes) ...", file=sys.stderr, flush=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    except ImportError as error:
        raise ModelFilesError(f"cannot read GGUF files: {error}; install the `gguf` package") from error
    except Exception as error:  # transformers raises many types for unreadable files
        raise ModelFilesError(f"cannot convert {gguf_path}: {error}") from error
    building = hf_dir.with_name(hf_dir.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    save_model(model, str(building / "model.safetensors"))
    save_configs(model, building)
    tokenizer.save_pretrained(building)
    (building / MARKER).write_text(json.dumps({"sha256": source_sha256, "source": str(gguf_path)}) + "\n")
    shutil.rmtree(hf_dir, ignore_errors=True)
    building.rename(hf_dir)
    if progress:
        print(f"converted in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
