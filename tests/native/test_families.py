"""Each family the native runtime runs, built as a tiny random model with transformers' own class: its logits
against transformers' (to the int8 weights' error), its greedy choices over 64 steps transformers' except at near-ties,
a position's logits the same bits alone and in a block (sliding windows included, and a mixture of experts' rows routed
to different experts), and speculation equal to plain decoding, greedy and seeded.

The native runtime's weights are 7-bit integers, so its logits are transformers' to that error (about 2 % of their
range; Gemma's and OLMo 2's about 6 %: their norms bring each sublayer's output to unit scale, so no layer's error is
damped by a small output; a mixture of experts' about 3 %: a token's MLP output is mostly one small expert's, which
averages fewer weights' errors), and a random model's near-ties (top two within 1 % of the range) may go either way."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import native_from_hf, tiny_config, word_tokenizer

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.runtime.native import NativeRuntime
from quickdraft.runtime.native.architecture import POST_NORMS, SANDWICH_NORMS
from quickdraft.runtime.native.config import DecoderConfig, Rope

VOCAB = 64


def llama3(vocab: int) -> torch.nn.Module:  # Llama 3.1's RoPE scaling, an explicit head_dim (as Mistral NeMo's)
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
    return LlamaForCausalLM(tiny_config(LlamaConfig, vocab, 2, head_dim=16, rope_parameters=rope))


def qwen3(vocab: int) -> torch.nn.Module:  # q/k norms, head_dim 16 with 4 heads in a 32-wide model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(tiny_config(Qwen3Config, vocab, 2, head_dim=16, tie_word_embeddings=False))


def qwen3_yarn(vocab: int) -> torch.nn.Module:  # YaRN: a 4x context over an original 16 positions
    from transformers import Qwen3Config, Qwen3ForCausalLM

    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
    return Qwen3ForCausalLM(tiny_config(Qwen3Config, vocab, 2, head_dim=16, rope_parameters=rope))


def mistral(vocab: int) -> torch.nn.Module:  # a sliding window on every layer
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(tiny_config(MistralConfig, vocab, 2, sliding_window=5))


def smollm3(vocab: int) -> torch.nn.Module:  # every 4th layer without RoPE (the released pattern; llama.cpp's rule)
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    return SmolLM3ForCausalLM(tiny_config(SmolLM3Config, vocab, 4))


def gemma3(vocab: int) -> torch.nn.Module:  # Gemma 3: sandwich norms (1 + w), GELU, 5 local layers and a global one
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    config = tiny_config(Gemma3TextConfig, vocab, 6, head_dim=16, sliding_window=5, query_pre_attn_scalar=24,
                         rope_parameters=rope, final_logit_softcapping=30.0)  # fmt: skip
    return Gemma3ForCausalLM(config)


def phi3(vocab: int) -> torch.nn.Module:  # fused q/k/v and gate/up, LongRoPE (long factors: 40 positions > 16)
    from transformers import Phi3Config, Phi3ForCausalLM

    half = 4  # head_dim 8: 4 frequencies
    rope = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0][:half], "long_factor": [1.0, 2.0, 4.0, 8.0],
            "original_max_position_embeddings": 16, "rope_theta": 10000.0}  # fmt: skip
    return Phi3ForCausalLM(tiny_config(Phi3Config, vocab, 2, rope_parameters=rope, original_max_position_embeddings=16))


def phi4(vocab: int) -> torch.nn.Module:  # Phi-4-mini's partial rotary: 6 of each head's 8 dimensions turn
    from transformers import Phi3Config, Phi3ForCausalLM

    return Phi3ForCausalLM(tiny_config(Phi3Config, vocab, 2, partial_rotary_factor=0.75))


def gemma(vocab: int) -> torch.nn.Module:  # Gemma 1: (1 + w) norms, embeddings × √hidden, "gelu" (run as tanh GELU)
    from transformers import GemmaConfig, GemmaForCausalLM

    return GemmaForCausalLM(tiny_config(GemmaConfig, vocab, 2, head_dim=16, hidden_act="gelu"))


def gemma2(vocab: int) -> torch.nn.Module:  # Gemma 2: sandwich norms, local and global layers, both softcaps
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = tiny_config(Gemma2Config, vocab, 2, head_dim=16, sliding_window=5, query_pre_attn_scalar=24,
                         attn_logit_softcapping=2.0, final_logit_softcapping=30.0)  # fmt: skip
    return Gemma2ForCausalLM(config)


def granite(vocab: int) -> torch.nn.Module:  # Granite 3: Llama's layers with its four scalars (released ones' sizes)
    from transformers import GraniteConfig, GraniteForCausalLM

    scalars = {"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0625,
               "logits_scaling": 8.0}  # fmt: skip
    return GraniteForCausalLM(tiny_config(GraniteConfig, vocab, 2, tie_word_embeddings=True, **scalars))


def qwen3_moe(vocab: int, dense_layers: tuple[int, ...] = ()) -> torch.nn.Module:  # 6 experts, 2 a token, renormalized
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    experts = {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True}
    config = tiny_config(Qwen3MoeConfig, vocab, 2 + len(dense_layers), head_dim=16, mlp_only_layers=list(dense_layers),
                         tie_word_embeddings=False, **experts)  # fmt: skip
    return Qwen3MoeForCausalLM(config)


def qwen3_moe_dense(vocab: int) -> torch.nn.Module:  # the middle layer a dense MLP (mlp_only_layers)
    return qwen3_moe(vocab, dense_layers=(1,))


def mixtral(vocab: int) -> torch.nn.Module:  # Llama's attention, 4 experts of 64 in every layer, 2 a token
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(tiny_config(MixtralConfig, vocab, 2, num_local_experts=4, num_experts_per_tok=2))


def qwen2_moe(vocab: int) -> torch.nn.Module:  # 4 experts of 32, 2 a token, not renormalized; a shared expert of 48
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    experts = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": False,
               "shared_expert_intermediate_size": 48}  # fmt: skip
    model = Qwen2MoeForCausalLM(tiny_config(Qwen2MoeConfig, vocab, 2, tie_word_embeddings=False, **experts))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("_proj.bias"):
                parameter.normal_(0.0, 0.5)  # q/k/v biases (transformers starts them at zero)
            if "shared_expert" in name:  # a shared expert that moves the logits well past the tolerance, its gate
                parameter.mul_(50.0 if "gate.weight" in name else 2.0)  # away from 1/2 and different by row
    return model


def olmo2(vocab: int) -> torch.nn.Module:  # OLMo 2: the sublayers' outputs normed, q and k across all heads
    from transformers import Olmo2Config, Olmo2ForCausalLM

    return Olmo2ForCausalLM(tiny_config(Olmo2Config, vocab, 2, tie_word_embeddings=False))


def olmo3(vocab: int) -> torch.nn.Module:  # OLMo 3: OLMo 2's layers, 3 sliding and 1 global, YaRN on the global one
    from transformers import Olmo3Config, Olmo3ForCausalLM

    rope = {"full_attention": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0,
                               "original_max_position_embeddings": 16},
            "sliding_attention": {"rope_type": "default", "rope_theta": 5e5}}  # fmt: skip
    return Olmo3ForCausalLM(tiny_config(Olmo3Config, vocab, 4, sliding_window=5, rope_parameters=rope))


def olmoe(vocab: int) -> torch.nn.Module:  # OLMoE: Llama's norms, OLMo's q/k norms, 8 experts of 64, 2 a token
    from transformers import OlmoeConfig, OlmoeForCausalLM

    return OlmoeForCausalLM(tiny_config(OlmoeConfig, vocab, 2, num_experts=8, num_experts_per_tok=2))


# families whose sublayers' outputs are normed before their residual adds
OUTPUT_NORMED = ("gemma", "gemma2", "gemma3", "olmo2", "olmo3")
SPARSE = ("qwen3-moe", "qwen3-moe-dense", "mixtral", "qwen2-moe", "olmoe")  # the families with a mixture of experts
FAMILIES = {
    "llama3": llama3, "qwen3": qwen3, "qwen3-yarn": qwen3_yarn, "mistral": mistral, "smollm3": smollm3,
    "gemma3": gemma3, "phi3": phi3, "phi4": phi4, "gemma": gemma, "gemma2": gemma2, "granite": granite,
    "qwen3-moe": qwen3_moe, "qwen3-moe-dense": qwen3_moe_dense, "mixtral": mixtral, "qwen2-moe": qwen2_moe,
    "olmo2": olmo2, "olmo3": olmo3, "olmoe": olmoe,
}  # fmt: skip


def build(family: str, logit_scale: float = 1.0, seed: int = 0, vocab: int = VOCAB) -> torch.nn.Module:
    """A random model of ``family`` with random norm weights (zeros or ones would hide a norm's offset)."""
    torch.manual_seed(seed)
    model = FAMILIES[family](vocab).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(torch.rand_like(parameter) * 0.5 + (0.75 if "gemma" not in family else 0.0))
            if family == "gemma2" and "q_proj" in name:
                parameter.mul_(8.0)  # scores past the softcap of 2
            if name.endswith("mlp.gate.weight"):
                parameter.mul_(50.0)  # a router that prefers some experts, as trained ones do (not a uniform softmax)
        model.get_output_embeddings().weight.mul_(logit_scale)
    return model


def native(model: torch.nn.Module, use_kernel: bool = True) -> NativeRuntime:
    runtime = native_from_hf(model)
    runtime.decoder.use_kernel = use_kernel
    return runtime


@pytest.mark.parametrize("family", FAMILIES)
def test_the_config_says_what_the_family_needs(family: str) -> None:
    config = DecoderConfig.from_hf(build(family).config.to_dict())
    if family == "gemma3":
        assert config.layer_windows == (5, 5, 5, 5, 5, 0) and config.norm_offset == 1.0
        assert config.norms == SANDWICH_NORMS
        local, global_ = config.layer_ropes[0], config.layer_ropes[5]
        assert (local.theta, global_.theta, global_.scaling) == (1e4, 1e6, "linear")
        assert config.attention_scale == 24**-0.5 and config.embedding_scale == 32**0.5
    if family == "smollm3":
        assert [rope is None for rope in config.layer_ropes] == [False, False, False, True]
    if family == "mistral":
        assert config.layer_windows == (5, 5)
    if family == "phi3":
        rope = config.layer_ropes[0]
        assert rope.scaling == "longrope" and rope.attention_factor == pytest.approx(1.5)  # sqrt(1 + ln 32 / ln 16)
    if family == "phi4":
        assert config.layer_ropes[0].rotary_dims(config.head_dim) == 6
    if family == "qwen3-yarn":  # transformers' frequencies and scale of cos and sin
        rope, rotary = config.layer_ropes[0], build(family).model.rotary_emb
        assert rope.scaling == "yarn" and rope.attention_factor == pytest.approx(rotary.attention_scaling)
        assert torch.allclose(rope.inverse_frequencies(config.head_dim), rotary.inv_freq.double(), rtol=1e-6)
        assert not torch.allclose(rope.inverse_frequencies(config.head_dim), Rope(10000.0).inverse_frequencies(16))
    if family == "gemma2":
        assert config.attention_softcap == 2.0 and config.layer_windows == (5, 0)
    if family == "granite":
        assert (config.embedding_scale, config.residual_scale, config.attention_scale, config.logits_divisor) == (
            12.0, 0.22, 0.0625, 8.0)  # fmt: skip
    else:
        assert (config.residual_scale, config.logits_divisor) == (1.0, 1.0)
    if family == "olmo3":
        assert config.layer_windows == (5, 5, 5, 0) and config.norms == POST_NORMS
        assert [rope.scaling for rope in config.layer_ropes] == ["default", "default", "default", "yarn"]
    qk_normed = ("qwen3", "qwen3-yarn", "gemma3", "qwen3-moe", "qwen3-moe-dense", "olmo2", "olmo3", "olmoe")
    assert config.qk_norm == (family in qk_normed)
    sparse = {"qwen3-moe": ((True,) * 2, 6, 2, 32), "qwen3-moe-dense": ((True, False, True), 6, 2, 32),
              "mixtral": ((True, True), 4, 2, 64), "qwen2-moe": ((True, True), 4, 2, 32),
              "olmoe": ((True, True), 8, 2, 64)}.get(family)  # fmt: skip
    experts = (config.layer_experts, config.num_experts, config.experts_per_token, config.expert_intermediate_size)
    assert experts == (sparse or ((), 0, 0, 0)), family
    assert config.normalize_expert_weights == (sparse is not None and family not in ("qwen2-moe", "olmoe")), family
    assert config.shared_expert_intermediate_size == (48 if family == "qwen2-moe" else 0), family
    assert config.attention_bias == (family == "qwen2-moe"), family


def test_a_clamp_of_q_k_and_v_is_refused() -> None:  # OLMoE's clip_qkv (null in the released models)
    config = build("olmoe").config.to_dict() | {"clip_qkv": 8.0}
    with pytest.raises(ValueError, match=r"clip_qkv \(8.0\) is not supported"):
        DecoderConfig.from_hf(config)


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernels", "torch-ops"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_are_close_to_transformers(family: str, use_kernel: bool) -> None:
    model = build(family)
    runtime = native(model, use_kernel)
    token_ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(1))  # past the windows
    logits = runtime.forward(token_ids, runtime.new_cache())
    with torch.no_grad():
        reference = model(token_ids).logits
    tolerance = 0.08 if family in OUTPUT_NORMED else 0.04 if family in SPARSE else 0.03
    assert (logits - reference).abs().max() < tolerance * reference.abs().max(), family


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_choices_are_transformers_but_at_near_ties_over_64_steps(family: str) -> None:
    model = build(family, logit_scale=8.0)
    runtime = native(model)
    tokens = [5, 9, 2, 33, 7]
    cache = runtime.new_cache()
    logits = runtime.forward(torch.tensor([tokens]), cache)
    for _ in range(64):  # the native runtime's greedy decoding, step by step
        tokens.append(int(logits[0, -1].argmax()))
        logits = runtime.forward(torch.tensor([[tokens[-1]]]), cache)
    with torch.no_grad():
        reference = model(torch.tensor([tokens])).logits[0, 4:-1]  # transformers' logits at each choice
    chosen = torch.tensor(tokens[5:])
    best = reference.max(-1).values
    gap = best - reference.gather(1, chosen[:, None])[:, 0]  # 0 where the choices agree
    span = best - reference.min(-1).values
    assert (gap <= 0.02 * span).all(), (family, gap.max())  # 8-bit activations, float16 keys and values
    assert (gap == 0).float().mean() >= 0.85, family


@pytest.mark.parametrize("family", FAMILIES)
def test_a_positions_logits_are_the_same_bits_alone_and_in_a_block(family: str) -> None:
    runtime = native(build(family))
    token_ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    whole = runtime.forward(token_ids, runtime.new_cache())
    cache, pieces, start = runtime.new_cache(), [], 0
    for size in itertools.cycle([1, 3, 7, 2, 16]):  # blocks that start anywhere in a window and a key block
        if start >= 40:
            break
        pieces.append(runtime.forward(token_ids[:, start : start + size], cache))
        start += size
    assert torch.equal(torch.cat(pieces, dim=1), whole), family
    cache.truncate(17)  # a rollback into the window, then the same tokens again
    again = runtime.forward(token_ids[:, 17:], cache)
    assert torch.equal(again, whole[:, 17:]), family


@pytest.mark.parametrize("family", FAMILIES)
def test_speculation_equals_plain_decoding(family: str) -> None:
    target = build(family, logit_scale=8.0)
    draft = build(family, logit_scale=8.0)
    with torch.no_grad():  # a noisy copy: drafts accepted often, not always
        weight = draft.get_output_embeddings().weight
        weight.add_(0.1 * weight.std() * torch.randn(weight.shape, generator=torch.Generator().manual_seed(3)))
    tokenizer = word_tokenizer(VOCAB)
    pipeline = Pipeline(target=native(target), tokenizer=tokenizer, eos_token_ids=frozenset(), draft=native(draft))
    prompt = [5, 9, 5, 9, 2, 33]
    for sampling in (SamplingParams(), SamplingParams(temperature=1.0, seed=11)):  # greedy, seeded
        plain = pipeline.generate(prompt, GenerationConfig(max_new_tokens=24, sampling=sampling), drafter="none")
        for drafter, gamma in itertools.product(["draft-model", "prompt-lookup"], [1, 4]):
            config = GenerationConfig(max_new_tokens=24, num_draft_tokens=gamma, sampling=sampling)
            result = pipeline.generate(prompt, config, drafter=drafter)
            assert result.token_ids == plain.token_ids, (family, sampling, drafter, gamma)


def older_gemma3(config: dict) -> None:  # Gemma 3 1B's file: RoPE bases by name, windows by a pattern
    del config["rope_parameters"], config["layer_types"]
    scaling = {"rope_type": "linear", "factor": 8.0}
    config.update(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling=scaling, sliding_window_pattern=6)


def older_layer_types(
    config: dict,
) -> None:  # Gemma 2's and Qwen2's files: no layer types, windows by the family's rule
    del config["layer_types"]


def qwen2_windows(vocab: int) -> torch.nn.Module:  # sliding windows from layer max_window_layers on
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = tiny_config(Qwen2Config, vocab, 2, use_sliding_window=True, sliding_window=5, max_window_layers=1)
    return Qwen2ForCausalLM(config)


@pytest.mark.parametrize(
    ("make", "older"),
    [(gemma3, older_gemma3), (gemma2, older_layer_types), (qwen2_windows, older_layer_types)],
    ids=["gemma3", "gemma2", "qwen2"],
)
def test_older_config_key_names_read_as_transformers_reads_them(
    tmp_path: Path, make: Callable[[int], torch.nn.Module], older: Callable[[dict], None]
) -> None:
    """Released models' config.json files keep older names that transformers still reads: read alone, the file
    would give every layer full attention and one RoPE base, and the logits would be wrong with no error."""
    current, rewritten = tmp_path / "current", tmp_path / "older"
    make(VOCAB).config.save_pretrained(current)
    config = json.loads((current / "config.json").read_text())
    older(config)
    rewritten.mkdir()
    (rewritten / "config.json").write_text(json.dumps(config))
    assert DecoderConfig.from_dir(rewritten) == DecoderConfig.from_dir(current)
    assert any(DecoderConfig.from_dir(current).layer_windows)
