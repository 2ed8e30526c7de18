"""A head file keeps what drafting uses: the same 7-bit codes and scales for every linear layer, the rest in
bfloat16; the file is about half a bfloat16 one's size."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import native_from_hf, tiny_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from quickdraft.draft_head.file import QUANTIZED, load_head, save_head
from quickdraft.draft_head.model import DraftHead, HeadConfig
from quickdraft.runtime.native.parts import quantize_weight


def test_a_head_file_round_trips_the_integer_weights_drafting_uses(tmp_path: Path) -> None:
    target = native_from_hf(tiny_model(64, seed=3))
    config = HeadConfig.for_target(target.decoder.config, 96, 2, 40)
    torch.manual_seed(0)
    vocabulary = torch.arange(3, 43)
    head = DraftHead(config, vocabulary, target.lm_head_rows(vocabulary))
    save_head(head, tmp_path / "head.safetensors", (1, 2), "tiny", {"note": "test"})
    loaded, layers, metadata = load_head(tmp_path / "head.safetensors", target)
    assert layers == (1, 2) and metadata["training"] == {"note": "test"}
    assert torch.equal(loaded.vocabulary, vocabulary)
    original, stored = head.state_dict(), loaded.state_dict()
    for name, tensor in original.items():
        if name in QUANTIZED:  # [N, K]: requantizing the stored weights gives the codes drafting had
            codes, scale = quantize_weight(tensor)
            again, scale_again = quantize_weight(stored[name])
            assert torch.equal(again, codes) and torch.allclose(scale_again, scale, rtol=1e-6), name
        elif name == "lm_head":  # not stored: the target's rows, read from it
            assert torch.equal(stored[name], tensor)
        else:
            assert torch.equal(stored[name], tensor.to(torch.bfloat16).float()), name
    as_bfloat16 = sum(t.numel() * 2 for name, t in original.items() if name in QUANTIZED)
    stored_bytes = sum(
        t.numel() * t.element_size()
        for name, t in load_file(str(tmp_path / "head.safetensors")).items()
        if name.endswith((".codes", ".scale"))
    )
    assert stored_bytes < 0.6 * as_bfloat16


def test_format_1_files_with_every_weight_in_bfloat16_still_load(tmp_path: Path) -> None:
    target = native_from_hf(tiny_model(64, seed=3))
    config = HeadConfig.for_target(target.decoder.config, 96, 1, 40)
    torch.manual_seed(1)
    head = DraftHead(config, torch.arange(40), target.lm_head_rows(torch.arange(40)))
    save_head(head, tmp_path / "head.safetensors", (1,), "tiny", {})
    with safe_open(str(tmp_path / "head.safetensors"), framework="pt") as file:
        metadata = {**file.metadata(), "version": "1"}
    tensors = {
        name: tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        for name, tensor in head.state_dict().items()
        if name != "lm_head"
    }
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata=metadata)
    loaded = load_head(tmp_path / "old.safetensors", target)[0].state_dict()
    for name, tensor in tensors.items():
        assert torch.equal(loaded[name], tensor.float() if tensor.is_floating_point() else tensor), name
