"""A trained draft head on disk: one safetensors file with its weights, its vocabulary and, as metadata, its
shape, the target layers it reads, the target it was trained for and how (data, settings, results).

The target's LM head rows over the head's vocabulary are not stored: they are the target's, read from it at
load time (frozen in training). The linear layers are stored as the integer kernels draft with them (7-bit codes
and a scale per output channel: ``<name>.codes`` int8, ``<name>.scale`` float32), the rest in bfloat16, which
keeps the file about half the size of bfloat16 weights and loses nothing drafting would keep. The file's sha256
names what was measured.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from quickdraft.draft_head.model import DraftHead, HeadConfig
from quickdraft.draft_head.native import LINEARS
from quickdraft.errors import ConfigError, ModelFilesError
from quickdraft.files import cache_root, save_atomically
from quickdraft.models.catalog import file_sha256
from quickdraft.runtime.base import Runtime
from quickdraft.runtime.native.parts import quantize_weight

FORMAT = "quickdraft-draft-head"
FORMAT_VERSION = 2
READABLE_VERSIONS = ("1", "2")  # 1: every weight in bfloat16
NOT_STORED = ("lm_head",)
QUANTIZED = tuple(f"{name}.weight" for name in LINEARS)


def default_head_path(target_name: str) -> Path:
    """Where ``train-draft`` writes a target's head and the ``eagle`` drafter looks for it."""
    return cache_root() / "draft-heads" / f"{target_name}.safetensors"


def save_head(
    head: DraftHead, path: Path, feature_layers: tuple[int, ...], target: str, training: dict[str, Any]
) -> str:
    """Write the head atomically (linear layers as 7-bit codes, the rest bfloat16); returns the file's sha256."""
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in head.state_dict().items():  # detached: the weights, the vocabulary, the LM head rows
        if name in QUANTIZED:
            stem = name.removesuffix(".weight")
            codes, scale = quantize_weight(tensor)  # [N, K] int8, [N] float32
            tensors[f"{stem}.codes"], tensors[f"{stem}.scale"] = codes.contiguous(), scale.contiguous()
        elif name not in NOT_STORED:
            tensors[name] = (tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor).contiguous()
    metadata = {
        "format": FORMAT,
        "version": str(FORMAT_VERSION),
        "config": json.dumps(asdict(head.config)),
        "feature_layers": json.dumps(list(feature_layers)),
        "target": target,
        "training": json.dumps(training),
    }
    save_atomically(path, lambda temporary: save_file(tensors, str(temporary), metadata=metadata))
    return file_sha256(path, progress=False)


def read_metadata(path: Path) -> dict[str, Any]:
    try:
        with safe_open(str(path), framework="pt") as file:
            metadata = file.metadata() or {}
    except (OSError, SafetensorError) as error:
        raise ModelFilesError(f"cannot read the draft head {path}: {error}") from None
    if metadata.get("format") != FORMAT or metadata.get("version") not in READABLE_VERSIONS:
        raise ModelFilesError(f"{path} is not a quickdraft draft head of version {' or '.join(READABLE_VERSIONS)}")
    return {
        "config": json.loads(metadata["config"]),
        "feature_layers": tuple(json.loads(metadata["feature_layers"])),
        "target": metadata["target"],
        "training": json.loads(metadata["training"]),
    }


def load_head(path: Path, target: Runtime) -> tuple[DraftHead, tuple[int, ...], dict[str, Any]]:
    """(the head for ``target``, the target layers it reads, its metadata); clear errors for a file of another
    shape than the target's."""
    if not path.is_file():
        raise ModelFilesError(f"no draft head at {path}: train one with 'quickdraft train-draft'")
    metadata = read_metadata(path)
    config = HeadConfig(**metadata["config"])
    if config.hidden_size != target.hidden_size or config.target_vocab_size != target.vocab_size:
        raise ConfigError(
            f"the draft head {path} was trained for a target of width {config.hidden_size} and "
            f"{config.target_vocab_size} tokens, not this one ({target.hidden_size}, {target.vocab_size})"
        )
    if not target.provides_features:
        raise ConfigError(f"a draft head reads the target's hidden states: the {target.name} runtime gives none")
    tensors = load_file(str(path))
    vocabulary = tensors["vocabulary"].long()
    head = DraftHead(config, vocabulary, target.lm_head_rows(vocabulary))
    state = {
        name: tensor.float() if tensor.is_floating_point() else tensor
        for name, tensor in tensors.items()
        if not name.endswith((".codes", ".scale"))
    }
    for name in QUANTIZED:
        stem = name.removesuffix(".weight")
        if f"{stem}.codes" in tensors:  # [N, K] int8 codes times their channel's scale [N]
            state[name] = tensors[f"{stem}.codes"].float() * tensors[f"{stem}.scale"].float()[:, None]
    state["lm_head"] = head.lm_head
    head.load_state_dict(state)
    head.eval()
    return head, metadata["feature_layers"], metadata
