"""The decoder families the native runtime runs, each described once: what marks it in ``config.json`` and in a
GGUF file, its defaults, and what llama.cpp stores differently. The config reader (``model.DecoderConfig``) and the
weight loaders (``weights``, ``gguf_weights``) read these descriptions, and the layers (the PyTorch reference and
``layers.cpp``) take every difference from the weights and the config they make; no module tests a family's name.
A family is added by describing it here, with whatever its layers need that this description does not yet say.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    model_type: str  # config.json's
    gguf_architecture: str  # general.architecture in its GGUF files
    attention_bias: bool = False  # q/k/v projections carry biases unless config.json's attention_bias says otherwise
    sliding_window_keys: tuple[str, ...] = ("use_sliding_window",)  # config.json keys that turn sliding windows on
    # llama.cpp's converter interleaves the two rotary halves of each head's q and k rows: the loader undoes it
    gguf_interleaves_rotary: bool = False


ARCHITECTURES = {
    family.model_type: family
    for family in (
        Architecture("llama", "llama", gguf_interleaves_rotary=True),
        Architecture(
            "mistral",
            "llama",
            sliding_window_keys=("use_sliding_window", "sliding_window"),
            gguf_interleaves_rotary=True,
        ),
        Architecture("qwen2", "qwen2", attention_bias=True),
    )
}
# GGUF architectures whose q and k rows come interleaved (those of the families above that say so)
GGUF_INTERLEAVED_ROTARY = frozenset(a.gguf_architecture for a in ARCHITECTURES.values() if a.gguf_interleaves_rotary)
