"""Where the models run: ``auto``, ``cpu`` or ``cuda[:N]``, parsed once at the edge into a ``torch.device``.

Rules:
- ``auto`` is the first CUDA GPU when torch sees one, else the CPU.
- ``cuda`` (``cuda:N``) must name a GPU torch sees; otherwise a clear error, never a silent fall back to the CPU.
- The native runtime runs on the CPU only; on a GPU the transformers runtime runs the model in bf16 (fp16 where
  the GPU lacks bf16).
- The engine's tensors live where the target's logits are. The host decides what to commit, so a step waits for
  the device at each drafted token and at its verification; tests/gpu counts the synchronizing calls.
"""

from __future__ import annotations

import re

import torch

from quickdraft.errors import ConfigError
from quickdraft.runtime.names import AUTO_DEVICE, DEVICE_FORMS

CPU = torch.device("cpu")
CUDA_PATTERN = re.compile(r"cuda(?::(\d+))?")


def resolve_device(spec: str | torch.device) -> torch.device:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` -> the device models load on; anything else, or a GPU torch does
    not see, raises ``ConfigError``."""
    text = str(spec).strip().lower()
    if text == AUTO_DEVICE:
        return torch.device("cuda", 0) if torch.cuda.is_available() else CPU
    if text == "cpu":
        return CPU
    match = CUDA_PATTERN.fullmatch(text)
    if match is None:
        raise ConfigError(f"unknown device {str(spec)!r}: give {DEVICE_FORMS}", "device")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device {str(spec)!r}: torch {torch.__version__} sees no CUDA GPU here; use device cpu (or auto), "
            f"or install a CUDA build of torch on a machine with an NVIDIA GPU",
            "device",
        )
    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(
            f"device {str(spec)!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s), cuda:0 and up", "device"
        )
    return torch.device("cuda", index)


def model_dtype(device: torch.device) -> torch.dtype:
    """The float type the transformers runtime keeps weights in: fp32 on the CPU (exact, what the native runtime is
    compared with), bf16 on a GPU that has it, else fp16."""
    if device.type == "cpu":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def device_name(device: torch.device) -> str:
    """What a measured cost depends on besides the CPU: the GPU's model name (empty on the CPU)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else ""


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a timer read after it sees the work done); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
