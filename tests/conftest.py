"""Shared fixtures: tiny random Qwen2 models built from a config (no download) and a tokenizer."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
import uvicorn
from scipy.stats import chi2

import quickdraft.engine.engine
from quickdraft.api import Pipeline
from quickdraft.costs import BatchCostModel, CostModel
from quickdraft.drafters import DrafterRecords, DraftState, DraftTask
from quickdraft.drafters.hybrid import COPIES
from quickdraft.engine import Engine, SchedulerSettings
from quickdraft.lossless.adjustments import LogitAdjustments
from quickdraft.lossless.sampling import SamplingParams
from quickdraft.policies import KeepDrafting, Offer
from quickdraft.runtime import HFRuntime, KVCache, Runtime
from quickdraft.runtime.native import NativeRuntime
from quickdraft.runtime.native.config import DecoderConfig
from quickdraft.runtime.native.model import Decoder
from quickdraft.runtime.native.weights import quantize_state_dict
from quickdraft.server.access import OPEN, Access
from quickdraft.server.app import create_app
from quickdraft.server.http_server import uvicorn_config
from quickdraft.server.loop import ServingLoop
from quickdraft.server.protocol import ServerDefaults
from quickdraft.server.setup import serving_engine
from quickdraft.vocabularies import VocabularyBridge

EOS = "<eos>"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist the workers share the cores: each computes on its share (cores ÷ workers threads), it and
    the programs it starts, so that no thread waits for a core another worker's thread holds."""
    if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


# cost models that policy tests plan with (milliseconds)
FLAT = CostModel({1: 100.0, 2: 101.0, 4: 103.0, 8: 107.0, 17: 116.0}, draft_ms=1.0)  # verification nearly free
STEEP = CostModel({1: 100.0, 2: 190.0, 4: 370.0, 8: 730.0}, draft_ms=1.0)  # each verified token costs a step
EXPENSIVE_DRAFT = CostModel(FLAT.target_ms, draft_ms=60.0)
MODERATE = CostModel({1: 100.0, 2: 110.0, 4: 125.0, 8: 160.0, 17: 240.0}, draft_ms=5.0)
# a draft model reading a prompt: 10 ms a token
READS_SLOWLY = CostModel(MODERATE.target_ms, draft_ms=5.0, draft_prefill_ms={100: 1000.0})
# the default pair on the 2-core bench machine: a draft token costs 0.42 of a plain step
DEFAULT_PAIR = CostModel({1: 71.3, 2: 84.7, 3: 96.4, 4: 110.9}, draft_ms=30.1, draft_prefill_ms={128: 602.3})


def tiny_config(config_cls: type, vocab_size: int, num_layers: int, **extra: object):  # -> PretrainedConfig
    """A 32-wide config of any family; the last token id is end-of-sequence."""
    return config_cls(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=vocab_size - 1,
        pad_token_id=vocab_size - 1,
        bos_token_id=None,
        **extra,
    )


def tiny_model(vocab_size: int, seed: int, logit_scale: float = 1.0, num_layers: int = 2) -> torch.nn.Module:
    """A random Qwen2 causal LM; ``logit_scale`` sharpens its distributions."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_config(Qwen2Config, vocab_size, num_layers, tie_word_embeddings=False)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


def answer_text(tokenizer: Any, prompt_ids: list[int], token_ids: list[int]) -> str:
    """The text ``token_ids`` add to ``prompt_ids``' text: an answer's text (a word tokenizer's first word keeps
    the space before it)."""
    before = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    return tokenizer.decode([*prompt_ids, *token_ids], skip_special_tokens=True)[len(before) :]


def word_tokenizer(vocab_size: int, prefix: str = "w"):  # -> PreTrainedTokenizerFast
    """Words ``w0 .. w{V-2}`` and an end-of-sequence token, split on spaces."""
    return listed_tokenizer([f"{prefix}{i}" for i in range(vocab_size - 1)] + [EOS])


def listed_tokenizer(words: list[str]):  # -> PreTrainedTokenizerFast
    """Words split on spaces, with ids in the order given (end of sequence among them; the first is unknown's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(vocab={word: i for i, word in enumerate(words)}, unk_token=words[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS)


def tiny_pipeline(vocab_size: int = 32, logit_scale: float = 1.0, draft_seed: int = 1) -> Pipeline:
    tokenizer = word_tokenizer(vocab_size)
    return Pipeline(
        target=HFRuntime(tiny_model(vocab_size, seed=0, logit_scale=logit_scale)),
        tokenizer=tokenizer,
        eos_token_ids=frozenset({tokenizer.eos_token_id}),
        draft=HFRuntime(tiny_model(vocab_size, seed=draft_seed, logit_scale=logit_scale, num_layers=1)),
    )


def native_from_hf(model: torch.nn.Module, capacity: int = 256) -> NativeRuntime:
    """A tiny transformers model on the native runtime (bitwise the same logits whatever the batch)."""
    config = DecoderConfig.from_hf(model.config.to_dict())
    tensors = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    return NativeRuntime(Decoder.from_native_state(config, quantize_state_dict(config, tensors), capacity))


def native_pipeline(vocab_size: int = 48, draft_noise: float = 0.1) -> Pipeline:
    """A tiny random target on the native runtime, drafted by a copy of it whose LM head carries noise (of
    ``draft_noise`` times the weights' scale): its drafts are accepted often, not always. No end-of-sequence
    token: answers run to their budgets."""
    return Pipeline(
        target=native_from_hf(tiny_model(vocab_size, seed=0)),
        tokenizer=word_tokenizer(vocab_size),
        eos_token_ids=frozenset(),
        draft=native_from_hf(noisy_copy(vocab_size, draft_noise)),
    )


def noisy_copy(vocab_size: int, draft_noise: float = 0.1) -> torch.nn.Module:
    """:func:`native_pipeline`'s draft: its target with ``draft_noise`` times the weights' scale of noise on its
    LM head."""
    draft = tiny_model(vocab_size, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        weight = draft.lm_head.weight
        weight.add_(draft_noise * weight.std() * torch.randn(weight.shape, generator=generator))
    return draft


FOREIGN_EXTRA_WORDS = ("x0", "x1")  # words only a foreign draft has


def foreign_pipeline(vocab_size: int = 48) -> tuple[Pipeline, Pipeline]:
    """The same pair twice: :func:`native_pipeline`'s, and its draft with its vocabulary shuffled and two words of
    its own (their rows zero) behind a bridge. A draft id means there what the target's id it came from means."""
    direct = native_pipeline(vocab_size)
    target_words = direct.tokenizer.convert_ids_to_tokens(list(range(vocab_size)))
    order = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(0)).tolist()  # draft id -> target id
    draft_words = [target_words[i] for i in order] + list(FOREIGN_EXTRA_WORDS)
    shuffled = tiny_model(len(draft_words), seed=0)
    state = noisy_copy(vocab_size).state_dict()
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        state[name] = torch.cat([state[name][order], torch.zeros(len(FOREIGN_EXTRA_WORDS), state[name].shape[1])])
    shuffled.load_state_dict(state)
    draft_tokenizer = listed_tokenizer(draft_words)
    bridge = VocabularyBridge(direct.tokenizer, draft_tokenizer, vocab_size, len(draft_words))
    foreign = Pipeline(
        target=direct.target,
        tokenizer=direct.tokenizer,
        eos_token_ids=direct.eos_token_ids,
        draft=native_from_hf(shuffled),
        bridge=bridge,
        mismatch="their token ids mean different text",
    )
    return direct, foreign


def native_chat_pipeline() -> Pipeline:
    """:func:`native_pipeline` with a chat template of role and content: what the server tests chat with."""
    pipeline = native_pipeline()
    pipeline.tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
    return pipeline


def sharp_native_pipeline() -> Pipeline:
    """Tiny target and draft on the native runtime, different models with sharp logits: their drafts are accepted
    often, and an end-of-sequence token may end an answer."""
    tokenizer = word_tokenizer(64)
    return Pipeline(
        target=native_from_hf(tiny_model(64, seed=3, logit_scale=8.0)),
        tokenizer=tokenizer,
        eos_token_ids=frozenset({tokenizer.eos_token_id}),
        draft=native_from_hf(tiny_model(64, seed=4, logit_scale=8.0, num_layers=1)),
    )


CHAT_VOCAB = 64
# words "0" .. "62" and an end-of-sequence token; a user turn opens with "60" and closes with "61 62"
CHAT_TEMPLATE = "{% for m in messages %}60 {{ m['content'] }} 61 62 {% endfor %}"


def chat_pipeline() -> Pipeline:
    """A tiny native target with a chat template, sharp enough that its own text has structure (for collecting
    training data: train-draft's tests)."""
    tokenizer = word_tokenizer(CHAT_VOCAB, prefix="")
    tokenizer.chat_template = CHAT_TEMPLATE
    return Pipeline(
        target=native_from_hf(tiny_model(CHAT_VOCAB, seed=3, logit_scale=8.0, num_layers=4), capacity=512),
        tokenizer=tokenizer,
        eos_token_ids=frozenset({tokenizer.eos_token_id}),
    )


def random_draft_head(target: Runtime, path: Path, seed: int = 0) -> Path:
    """An untrained draft head for ``target`` (features after its first layer), saved at ``path``: its drafts are
    seldom right, which changes how many are accepted, never the output."""
    from quickdraft.draft_head.file import save_head
    from quickdraft.draft_head.model import DraftHead, HeadConfig

    config = HeadConfig.for_target(target.decoder.config, 16, 1, target.vocab_size // 2)  # type: ignore[attr-defined]
    torch.manual_seed(seed)
    vocabulary = torch.arange(target.vocab_size // 2)
    save_head(DraftHead(config, vocabulary, target.lm_head_rows(vocabulary)), path, (1,), "random", {})
    return path


def save_tiny_model_dir(path: Path, vocab_size: int, seed: int, prefix: str = "w") -> Path:
    """A local model directory of a family the native runtime does not run (OLMo 1: layer norms without weights),
    whose AutoTokenizer is the generic one."""
    from transformers import OlmoConfig, OlmoForCausalLM

    torch.manual_seed(seed)
    OlmoForCausalLM(tiny_config(OlmoConfig, vocab_size, num_layers=2)).save_pretrained(path)
    word_tokenizer(vocab_size, prefix).save_pretrained(path)
    return path


def save_tiny_llama_dir(path: Path, vocab_size: int, seed: int, num_layers: int = 4) -> Path:
    """A local Llama directory: a family the native runtime runs, with a toy tokenizer AutoTokenizer loads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(LlamaConfig, vocab_size, num_layers))
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # sharp distributions: drafts get accepted
    model.save_pretrained(path)
    tokenizer = word_tokenizer(vocab_size)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(path)
    return path


# GGUF tensor types of the tiny GGUF files, by layer: one of each kind the default pair holds, and more
GGUF_LAYER_TYPES = (
    {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q5_0", "ffn_gate": "Q4_K", "ffn_up": "Q8_0",
     "ffn_down": "Q4_K"},
    {"attn_q": "F16", "attn_k": "BF16", "attn_v": "Q4_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K", "ffn_up": "Q4_K",
     "ffn_down": "Q6_K"},
)  # fmt: skip
GGUF_EXPERT_TYPES = {"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q6_K", "ffn_down_exps": "Q8_0"}
GGUF_TOKENS = [*"abcdefghijklmnopqrstuvwxyz", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ", *"0123456789", "ab", "<|endoftext|>"]


# Types gguf-py does not quantize, written as random blocks: where each block's float16 scales are
GGUF_BLOCK_SCALES = {
    "Q2_K": slice(80, 84), "Q3_K": slice(108, 110), "Q4_K": slice(0, 4), "Q5_K": slice(0, 4),
    "Q6_K": slice(208, 210), "IQ1_S": slice(0, 2), "IQ2_XXS": slice(0, 2), "IQ2_XS": slice(0, 2),
    "IQ2_S": slice(0, 2), "IQ3_XXS": slice(0, 2), "IQ3_S": slice(0, 2), "IQ4_NL": slice(0, 2), "IQ4_XS": slice(0, 2),
}  # fmt: skip
IQ1_M_SCALES = slice(48, 56)  # IQ1_M's float16 scale: the top 4 bits of these four uint16, in order


def gguf_tensor(generator: np.random.Generator, kind: str, rows: int, width: int) -> tuple[np.ndarray, Any]:
    """Random data of a GGUF tensor ``[rows, width]`` of type ``kind`` and the type to write it as (K-quants and
    IQ4 as random bytes with small positive float16 scales; the rest quantized from random floats)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    if kind == "F32":
        values = generator.normal(1.0, 0.1, size=(rows, width)).astype(np.float32)
        return (values[0] if rows == 1 else values * 0.05), qtype  # a norm's [width], or a weight matrix
    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    if kind == "IQ1_M":
        data = generator.integers(0, 256, size=(rows, width // block_weights, block_bytes), dtype=np.uint8)
        words = data[..., IQ1_M_SCALES].copy().view(np.uint16)  # [rows, blocks, 4]
        scale = int(np.float16(5e-4).view(np.uint16))
        nibbles = np.array([(scale >> shift) & 0xF for shift in (0, 4, 8, 12)], dtype=np.uint16)
        data[..., IQ1_M_SCALES] = ((words & 0x0FFF) | (nibbles << 12)).view(np.uint8)
        return data.reshape(rows, -1), qtype
    if kind == "NVFP4":  # scale bytes of exponents 4 and 5: every superblock's scales share a power (gguf_fp4)
        data = generator.integers(0, 256, size=(rows, width // block_weights, block_bytes), dtype=np.uint8)
        data[..., :4] = generator.integers(0x20, 0x30, size=(rows, width // block_weights, 4), dtype=np.uint8)
        return data.reshape(rows, -1), qtype
    if kind not in GGUF_BLOCK_SCALES:
        values = generator.normal(0.0, 0.05, size=(rows, width)).astype(np.float32)
        try:
            return gguf.quants.quantize(values, qtype), qtype
        except NotImplementedError:  # a type gguf-py neither writes nor reads here: random bytes of its size
            return generator.integers(0, 256, (rows, width // block_weights * block_bytes), dtype=np.uint8), qtype
    scales = GGUF_BLOCK_SCALES[kind]
    data = generator.integers(0, 256, size=(rows, width // block_weights, block_bytes), dtype=np.uint8)
    half = generator.uniform(1e-4, 1e-3, size=(rows, width // block_weights, (scales.stop - scales.start) // 2))
    data[..., scales] = half.astype(np.float16).view(np.uint8)
    return data.reshape(rows, -1), qtype


def write_tiny_gguf(
    path: Path,
    architecture: str = "qwen2",
    tied: bool = False,
    seed: int = 0,
    heads: int = 4,
    extra: tuple[str, ...] = (),
    experts: int = 0,
) -> Path:
    """A random two-layer GGUF model (256 wide, vocabulary of 64 byte-level tokens, the last one end-of-sequence)
    with the tensor types of :data:`GGUF_LAYER_TYPES`: ``qwen2`` with q/k/v biases, or ``llama``; ``tied``
    leaves out ``output.weight`` and stores the embedding, which is then the LM head too, as Q6_K (else Q8_0).
    ``heads`` query heads of 64 (other than 4: heads not as wide as the model over their count, the file says so).
    ``extra``: more tensors by name, each 64 F32 weights. ``experts`` (for ``qwen3moe``, with q/k norms): that many
    experts of 256 in place of each MLP, 2 a token, stored as :data:`GGUF_EXPERT_TYPES`, and an F32 router."""
    import gguf

    generator = np.random.default_rng(seed)
    hidden, ffn, widths = 256, 512, {"ffn_down": 512, "attn_output": 64 * heads}
    rows = {"attn_q": 64 * heads, "attn_k": 128, "attn_v": 128, "ffn_gate": ffn, "ffn_up": ffn}  # 2 key-value heads
    writer = gguf.GGUFWriter(path, architecture)
    for key, value in (("context_length", 512), ("embedding_length", hidden), ("feed_forward_length", ffn),
                       ("block_count", 2), ("attention.head_count", heads),
                       ("attention.head_count_kv", 2)):  # fmt: skip
        writer.add_uint32(f"{architecture}.{key}", value)
    if heads != 4:
        writer.add_uint32(f"{architecture}.attention.key_length", 64)
        writer.add_uint32(f"{architecture}.attention.value_length", 64)
    writer.add_float32(f"{architecture}.rope.freq_base", 10000.0)
    writer.add_float32(f"{architecture}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(GGUF_TOKENS)
    writer.add_token_types([1] * (len(GGUF_TOKENS) - 1) + [3])
    writer.add_token_merges(["a b"])
    writer.add_eos_token_id(len(GGUF_TOKENS) - 1)
    embedding = ("Q6_K" if tied else "Q8_0", len(GGUF_TOKENS), hidden)
    tensors = {"token_embd.weight": embedding, "output_norm.weight": ("F32", 1, hidden)}
    if not tied:
        tensors["output.weight"] = ("Q6_K", len(GGUF_TOKENS), hidden)
    if experts:
        writer.add_uint32(f"{architecture}.expert_count", experts)
        writer.add_uint32(f"{architecture}.expert_used_count", 2)
        writer.add_uint32(f"{architecture}.expert_feed_forward_length", 256)
    for layer, types in enumerate(GGUF_LAYER_TYPES):
        tensors |= {f"blk.{layer}.{norm}.weight": ("F32", 1, hidden) for norm in ("attn_norm", "ffn_norm")}
        for name, kind in types.items():
            if experts and name.startswith("ffn_"):
                continue
            tensors[f"blk.{layer}.{name}.weight"] = (kind, rows.get(name, hidden), widths.get(name, hidden))
            if architecture == "qwen2" and name in ("attn_q", "attn_k", "attn_v"):
                tensors[f"blk.{layer}.{name}.bias"] = ("F32", 1, rows.get(name, hidden))
        if experts:
            tensors |= {f"blk.{layer}.attn_{qk}_norm.weight": ("F32", 1, 64) for qk in "qk"}
            tensors[f"blk.{layer}.ffn_gate_inp.weight"] = ("F32", experts, hidden)
            for name, kind in GGUF_EXPERT_TYPES.items():  # every expert's rows, one after another
                tensors[f"blk.{layer}.{name}.weight"] = (kind, experts * (hidden if "down" in name else 256),
                                                         256 if "down" in name else hidden)  # fmt: skip
    tensors |= {name: ("F32", 1, 64) for name in extra}
    for name, (kind, count, width) in tensors.items():
        data, qtype = gguf_tensor(generator, kind, count, width)
        if "_exps." in name:
            data = data.reshape(experts, count // experts, -1)  # [E, rows, width or bytes]
        if "ffn_gate_inp" in name:  # a router that prefers some experts, as trained ones do
            data = generator.normal(0.0, 0.5, size=(count, width)).astype(np.float32)
        writer.add_tensor(name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def native_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny Llama target and draft directories (the native runtime's families) sharing a tokenizer."""
    root = tmp_path_factory.mktemp("llama")
    return {
        "target": save_tiny_llama_dir(root / "target", 32, seed=0),
        "draft": save_tiny_llama_dir(root / "draft", 32, seed=1, num_layers=1),
    }


@pytest.fixture(autouse=True)
def calibrations_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tests measure costs on a busy machine: never save them where a user's goodput would load them."""
    directory = tmp_path / "calibrations"
    monkeypatch.setattr("quickdraft.files.calibrations_dir", lambda: directory)
    return directory


@pytest.fixture
def steady_timings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny model's forward takes a millisecond, and on a busy machine some take ten times that: for tests of
    what is saved and loaded, take every calibration as measured on a steady machine, and a saved one as timed on
    no busier cores than now's (the check that refuses to save an unsteady one is tested on a fake clock, the one
    that measures a busier one again on saved times far from a tiny model's)."""
    monkeypatch.setattr("quickdraft.costs.calibration.STEADY_TOLERANCE", math.inf)


def use_records(
    monkeypatch: pytest.MonkeyPatch, pipeline: Pipeline, drafter: str, records: DrafterRecords | None = None
) -> DrafterRecords:
    """Give the drafter called ``drafter`` these records (fresh ones by default) for one test: its name's entry in
    the pipeline and every drafter of that name already made (a session's pipeline keeps other tests' records)."""
    records = records if records is not None else DrafterRecords()
    monkeypatch.setitem(pipeline.records, drafter, records)
    for (name, _), made in pipeline._drafters.items():
        if name == drafter:
            monkeypatch.setattr(made, "records", records)
    return records


COPIES_IF_ANY = Offer(COPIES, free=True)  # a task that takes a hybrid's copies where its context offers some


def draft_task(
    state: DraftState,
    context: list[int],
    num_tokens: int,
    sampling: SamplingParams | None = None,
    generator: torch.Generator | None = None,
    keep_drafting: KeepDrafting = lambda step: True,
    offer: Offer = COPIES_IF_ANY,
) -> DraftTask:
    """What the engine asks of a drafter for one request in a step (greedy, drafting to γ, by default; a hybrid's
    copies where it has some)."""
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    return DraftTask(state, tuple(context), num_tokens, sampling or SamplingParams(), generator, keep_drafting, offer)


@pytest.fixture(scope="session")
def pipeline() -> Pipeline:
    return tiny_pipeline()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Local transformers directories: a target, a draft sharing its tokenizer, one that does not."""
    root = tmp_path_factory.mktemp("models")
    return {
        "target": save_tiny_model_dir(root / "target", 32, seed=0),
        "draft": save_tiny_model_dir(root / "draft", 32, seed=1),
        "other": save_tiny_model_dir(root / "other", 32, seed=2, prefix="x"),
    }


class TokenCache(KVCache):
    """The 'cache' of a table model is just the tokens it has seen."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []

    @property
    def lengths(self) -> torch.Tensor:
        return torch.tensor([len(self.token_ids)])

    def truncate(self, lengths: torch.Tensor | int) -> None:
        del self.token_ids[int(torch.as_tensor(lengths).reshape(-1)[0]) :]


class BigramTableRuntime(Runtime):
    """A tiny random language model: logits of the next token = table[previous, current].

    Microseconds per forward, so statistical tests can afford tens of thousands of runs
    through the real engine, drafters and verification.
    """

    name = "bigram-table"

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table  # [V, V, V]
        self.vocab_size = table.shape[-1]
        self.max_context = 1024
        self.device = torch.device("cpu")

    @classmethod
    def random(cls, vocab_size: int, seed: int, scale: float) -> BigramTableRuntime:
        generator = torch.Generator().manual_seed(seed)
        return cls(scale * torch.randn(vocab_size, vocab_size, vocab_size, generator=generator))

    @classmethod
    def load(cls, path: Path) -> BigramTableRuntime:
        raise NotImplementedError

    def new_cache(self, batch_size: int = 1) -> TokenCache:
        return TokenCache()

    def forward(self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False) -> torch.Tensor:
        assert isinstance(cache, TokenCache)
        start = len(cache.token_ids)
        cache.token_ids.extend(token_ids[0].tolist())
        history = torch.tensor([0, *cache.token_ids])  # a virtual token 0 before the first
        current = history[start + 1 :]
        previous = history[start:-1]
        logits = self.table[previous, current][None]  # [1, K, V]
        return logits[:, -1:] if last_only else logits


# -- a server on loopback ------------------------------------------------------------------------

MODEL = "tiny"
TIMEOUT = 60.0
# a batch whose forward costs little more for more tokens: drafting pays whatever the batch (goodput drafts)
CHEAP_BATCH = BatchCostModel({1: 100.0, 16: 101.0, 256: 110.0}, {1: 1.0, 64: 1.5})


@dataclass
class Server:
    url: str
    engine: Engine
    loop: ServingLoop

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


@contextlib.contextmanager
def serving(
    pipeline: Pipeline,
    prefix_cache_mb: int = 0,
    access: Access = OPEN,
    names: tuple[str, ...] = (MODEL,),
    split_reasoning: bool = True,
    **settings: int,
) -> Iterator[Server]:
    """A server on 127.0.0.1 (a free port) in a thread, stopped at the end; its drafters' costs measured as
    ``quickdraft serve`` measures them, a cheap batch curve given; ``split_reasoning`` false: --reasoning-format
    none."""
    scheduler = SchedulerSettings(**settings)
    engine, _ = serving_engine(pipeline, scheduler, batch_costs=CHEAP_BATCH, prefix_cache_mb=prefix_cache_mb)
    loop = ServingLoop(engine)
    app = create_app(pipeline, loop, ServerDefaults(names, max_tokens=12, split_reasoning=split_reasoning), access)
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", 0))  # as quickdraft serve runs it
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Server(f"http://127.0.0.1:{port}", engine, loop)
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)


# -- statistical tests ----------------------------------------------------------------------------


def adjusted_by_hand(
    adjustments: LogitAdjustments, logits: list[float], prompt_ids: list[int], answer_ids: list[int]
) -> list[float]:
    """:mod:`quickdraft.lossless.adjustments`' rule written out token by token, the oracle of ``adjust_logits``:
    one position's logits after ``answer_ids``."""
    bias, penalty = dict(adjustments.logit_bias), adjustments.repetition_penalty
    adjusted = []
    for token, logit in enumerate(logits):
        logit += bias.get(token, 0.0)
        count = answer_ids.count(token)
        if penalty != 1 and (count > 0 or token in prompt_ids):
            logit = logit / penalty if logit > 0 else logit * penalty
        logit -= adjustments.frequency_penalty * count + (adjustments.presence_penalty if count > 0 else 0.0)
        adjusted.append(logit)
    return adjusted


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tens of thousands of tiny forwards: on a busy machine every multi-threaded op waits for the other core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def numbered_generators(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unseeded requests draw from generators seeded 0, 1, 2, ... in turn: repeatable tests of the unseeded rule."""
    seeds = itertools.count()
    monkeypatch.setattr(
        quickdraft.engine.engine,
        "make_generator",
        lambda seed, device="cpu": torch.Generator(device).manual_seed(next(seeds)),
    )


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit; cells expected below 5 are pooled. A count where p = 0 gives 0."""
    if counts[probs == 0].sum() > 0:
        return 0.0
    expected = probs * counts.sum()
    large = expected >= 5
    observed_cells = torch.cat([counts[large], counts[~large & (probs > 0)].sum()[None]])
    expected_cells = torch.cat([expected[large], expected[~large & (probs > 0)].sum()[None]])
    statistic = float(((observed_cells - expected_cells) ** 2 / expected_cells.clamp(min=1e-12)).sum())
    return float(chi2.sf(statistic, df=len(observed_cells) - 1))
