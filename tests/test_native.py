"""The native runtime: exact row-invariant int8 linears, bit-exact logits across block sizes, rollback."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import native_from_hf, sharp_native_pipeline, tiny_model

from quickdraft.config import GenerationConfig
from quickdraft.runtime.base import BatchRow, KVCache
from quickdraft.runtime.native import NativeRuntime
from quickdraft.runtime.native.cache import key_rows
from quickdraft.runtime.native.config import DecoderConfig
from quickdraft.runtime.native.kernels import native_kernels
from quickdraft.runtime.native.linear import combine_passes
from quickdraft.runtime.native.model import ACTIVATION_FUNCTIONS


@pytest.fixture(
    scope="module",
    params=[(True, torch.float16), (False, torch.float16), (True, torch.float32)],
    ids=["kernels", "torch-ops", "kernels-float32-cache"],
)
def runtime(request: pytest.FixtureRequest) -> NativeRuntime:
    """The tiny model on the compiled kernels or the PyTorch reference operations, with a float16 KV cache (the
    default) or a float32 one."""
    runtime = native_from_hf(tiny_model(64, seed=3))
    use_kernel, runtime.decoder.kv_dtype = request.param
    runtime.decoder.use_kernel = use_kernel
    for layer in runtime.decoder.layers:
        for linear in (layer.qkv, layer.out, layer.gate_up, layer.down):
            linear.use_kernel = use_kernel
    runtime.decoder.lm_head.use_kernel = use_kernel
    return runtime


# --- the decoder ------------------------------------------------------------------------------------


def test_config_rejects_unsupported_models() -> None:
    base = tiny_model(64, seed=3).config.to_dict()
    DecoderConfig.from_hf(base)
    unsupported = (
        {"model_type": "gpt2"},
        {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},  # NTK by length: not a static table
        {"mlp_bias": True},
    )
    for change in unsupported:
        with pytest.raises(ValueError):
            DecoderConfig.from_hf(base | change)


def test_logits_close_to_transformers_fp32() -> None:
    model = tiny_model(64, seed=3)
    runtime = native_from_hf(model)
    token_ids = torch.tensor([[5, 9, 2, 33, 7, 1, 60, 12]])
    native = runtime.forward(token_ids, runtime.new_cache())
    with torch.no_grad():
        reference = model(token_ids).logits
    assert (native - reference).abs().max() < 0.02 * reference.abs().max()
    assert torch.equal(native.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernels", "torch-ops"])
def test_llama_attention_biases_are_all_loaded(use_kernel: bool) -> None:
    from conftest import tiny_config
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    model = LlamaForCausalLM(tiny_config(LlamaConfig, 64, 2, attention_bias=True)).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.bias.normal_()  # o_proj's bias too: dropping it would be silently wrong
    runtime = native_from_hf(model)
    runtime.decoder.use_kernel = use_kernel
    token_ids = torch.tensor([[5, 9, 2, 33, 7, 1, 60, 12]])
    native = runtime.forward(token_ids, runtime.new_cache())
    with torch.no_grad():
        reference = model(token_ids).logits
    assert (native - reference).abs().max() < 0.02 * reference.abs().max()


def test_logits_are_bitwise_equal_across_block_sizes_and_offsets(runtime: NativeRuntime) -> None:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (1, 40), generator=generator)
    reference = torch.cat([runtime.forward(tokens[:, :1], cache := runtime.new_cache())] +
                          [runtime.forward(tokens[:, i : i + 1], cache) for i in range(1, 40)], dim=1)  # fmt: skip
    for split in ([40], [7, 33], [3, 1, 16, 4, 16], [12, 5, 5, 5, 13]):
        cache, start, pieces = runtime.new_cache(), 0, []
        for size in split:
            pieces.append(runtime.forward(tokens[:, start : start + size], cache))
            start += size
        assert torch.equal(torch.cat(pieces, dim=1), reference), split


def test_rollback_and_recompute_is_bitwise_equal(runtime: NativeRuntime) -> None:
    tokens = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7]])
    cache = runtime.new_cache()
    runtime.forward(tokens[:, :6], cache)
    first = runtime.forward(tokens[:, 6:], cache)  # [1, 4, V]
    cache.truncate(6)
    assert cache.lengths.tolist() == [6]
    runtime.forward(torch.tensor([[1, 2, 3]]), cache)  # a rejected draft block overwrites those positions
    cache.truncate(6)
    again = runtime.forward(tokens[:, 6:], cache)
    assert torch.equal(first, again)
    with pytest.raises(ValueError):
        cache.truncate(11)


def test_positions_past_a_rows_length_are_never_read(runtime: NativeRuntime) -> None:
    """A new cache is uninitialized (no zeroing of 8192 positions per request): whatever lies past the
    written positions, NaN included, the logits are the same, through prefill, steps, rollback and early exit."""

    def run(fill: float) -> list[torch.Tensor]:
        cache = runtime.new_cache(1)
        cache.static.keys.fill_(fill)
        cache.static.values.fill_(fill)
        tokens = torch.tensor([[4, 8, 15, 16, 23, 42]])
        outputs = [runtime.forward(tokens, cache), runtime.forward(tokens[:, :2], cache)]
        cache.truncate(7)
        outputs.append(runtime.forward_early_exit(tokens[:, :3], cache, start=7, exit_layer=1))
        outputs.append(runtime.forward(tokens[:, 2:5], cache))
        return outputs

    for clean, poisoned in zip(run(0.0), run(float("nan")), strict=True):
        assert torch.equal(clean, poisoned)


def test_rows_of_a_batch_are_independent(runtime: NativeRuntime) -> None:
    tokens = torch.tensor([[4, 8, 15, 16, 23, 42], [1, 2, 3, 4, 5, 6]])
    batched = runtime.forward(tokens, runtime.new_cache(2))
    for row in range(2):
        alone = runtime.forward(tokens[row : row + 1], runtime.new_cache(1))
        assert torch.equal(batched[row : row + 1], alone)


def test_a_batched_forward_gives_every_request_its_own_logits_bitwise(runtime: NativeRuntime) -> None:
    """Requests of different lengths, at different positions, some reading a prompt and some a verify block:
    side by side in one pass, each gets bitwise the logits of its own forward alone."""
    generator = torch.Generator().manual_seed(8)
    histories = [torch.randint(0, 64, (n,), generator=generator).tolist() for n in (5, 17, 1, 9)]
    new_tokens = [[7, 3, 9], [11], [4, 4, 4, 4, 4, 4], [2, 60]]
    last_only = [False, False, True, False]

    def cache_after(history: list[int]) -> KVCache:
        cache = runtime.new_cache(1)
        runtime.forward(torch.tensor([history]), cache)
        return cache

    alone = [
        runtime.forward(torch.tensor([new]), cache_after(history), last_only)[0]
        for history, new, last_only in zip(histories, new_tokens, last_only, strict=True)
    ]
    caches = [cache_after(history) for history in histories]
    rows = [BatchRow(cache, new, last) for cache, new, last in zip(caches, new_tokens, last_only, strict=True)]
    batched = runtime.forward_batch(rows)
    for expected, got in zip(alone, batched, strict=True):
        assert torch.equal(got, expected)
    assert [int(cache.lengths[0]) for cache in caches] == [5 + 3, 17 + 1, 1 + 6, 9 + 2]
    # and the caches go on from there as if each request had run alone
    after = runtime.forward_batch([BatchRow(cache, [1]) for cache in caches])
    for cache_alone, history, new, got in zip(range(4), histories, new_tokens, after, strict=True):
        expected = runtime.forward(torch.tensor([[1]]), cache_after(history + new))[0]
        assert torch.equal(got, expected), cache_alone


def test_last_only_matches_the_full_logits(runtime: NativeRuntime) -> None:
    tokens = torch.tensor([[4, 8, 15, 16, 23, 42]])
    full = runtime.forward(tokens, runtime.new_cache())
    last = runtime.forward(tokens, runtime.new_cache(), last_only=True)
    assert torch.equal(last, full[:, -1:])


def test_the_runtime_reports_the_width_of_its_hidden_states(runtime: NativeRuntime) -> None:
    hidden = runtime.forward_with_hidden(torch.tensor([[1, 2, 3]]), runtime.new_cache())[1]  # [1, 3, H]
    assert runtime.hidden_size == hidden.shape[-1] == 32


def test_cache_capacity_is_enforced() -> None:
    runtime = native_from_hf(tiny_model(64, seed=3), capacity=8)
    assert runtime.max_context == 8
    with pytest.raises(ValueError, match="holds 8"):
        runtime.forward(torch.zeros(1, 9, dtype=torch.long), runtime.new_cache())


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_native_kernels_matches_the_pytorch_path(kv_dtype: torch.dtype) -> None:
    runtime = native_from_hf(tiny_model(64, seed=3))
    decoder = runtime.decoder
    decoder.kv_dtype = kv_dtype
    assert native_kernels() is not None, "the C++ kernel should build on the test machines"
    generator = torch.Generator().manual_seed(2)
    cache = decoder.new_cache(2)
    cache.keys.normal_(generator=generator)
    cache.values.normal_(generator=generator)
    q = torch.randn(6, 4, 8, generator=generator)  # [R, heads, D]: rows of two slots at various positions
    row_slot, row_position = [0, 0, 1, 1, 1, 0], [3, 4, 11, 12, 0, 30]
    row_index = [3, 4, 20, 12, 0, 47]  # two of them a tree's leaves, their keys kept past their positions
    keys, values = cache.slots()
    decoder.use_kernel = True
    compiled = decoder._attend(1, q, keys, values, row_slot, row_position, row_index)
    decoder.use_kernel = False
    reference = decoder._attend(1, q, keys, values, row_slot, row_position, row_index)
    assert torch.allclose(compiled, reference, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_rows_attended_together_equal_each_row_attended_alone(kv_dtype: torch.dtype) -> None:
    """attend_rows: the rows of a slot (a verify block, a prompt chunk) take turns on each tile of keys and values;
    every row's result is bitwise what it gets alone, across the tiles of 256 keys and 64 values, the runs of 16
    rows, and rows of other slots between them."""
    runtime = native_from_hf(tiny_model(64, seed=3), capacity=512)
    decoder = runtime.decoder
    decoder.kv_dtype = kv_dtype
    generator = torch.Generator().manual_seed(5)
    cache = decoder.new_cache(2)
    cache.keys.normal_(generator=generator)
    cache.values.normal_(generator=generator)
    row_slot = [0] * 20 + [1] * 3 + [0] * 2
    row_position = [*range(300, 320), 5, 63, 64, 400, 511]  # [R]: 20 rows of a verify block, others
    q = torch.randn(len(row_slot), 4, 8, generator=generator)  # [R, heads, D]
    keys, values = cache.slots()
    decoder.use_kernel = True
    row_index = [*row_position[:19], 330, *row_position[20:]]  # the block's last row a leaf
    together = decoder._attend(1, q, keys, values, row_slot, row_position, row_index)
    for r, (slot, position, own) in enumerate(zip(row_slot, row_position, row_index, strict=True)):
        alone = decoder._attend(1, q[r : r + 1], keys, values, [slot], [position], [own])
        assert torch.equal(together[r : r + 1], alone), r


def cached(values: torch.Tensor, kv_dtype: torch.dtype) -> torch.Tensor:
    """What a cache of ``kv_dtype`` holds of float ``values``, as floats: themselves, or their nearest halves."""
    return values.to(kv_dtype).float()


@pytest.mark.parametrize(("passes", "kv_dtype"), [(1, torch.float32), (2, torch.float32), (1, torch.float16)])
def test_layer_kernels_equal_the_reference_operations(passes: int, kv_dtype: torch.dtype) -> None:
    """Each fused kernel against the PyTorch operations of ``Decoder._layer`` on the same inputs: bitwise where
    both sides do the same float operations (RoPE, cache writes, residual adds; a float16 cache holds the halves
    PyTorch rounds them to), to float error for RMSNorm's sum and the activations' exp; GEMM outputs of one or two
    activation passes."""
    kernels = native_kernels()
    assert kernels is not None
    decoder = native_from_hf(tiny_model(64, seed=3)).decoder
    decoder.kv_dtype = kv_dtype
    config, generator = decoder.config, torch.Generator().manual_seed(6)
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    layer, starts, num_new = decoder.layers[0], [3, 11], 4
    rows = len(starts) * num_new
    x = torch.randn(rows, config.hidden_size, generator=generator) * 2  # [B·K, H]

    normed = kernels.rms_norm(x, layer.input_norm, config.rms_norm_eps)
    assert torch.allclose(normed, decoder._rms_norm(x, layer.input_norm), rtol=1e-5, atol=1e-6)
    assert torch.equal(kernels.rms_norm(x, torch.empty(0), config.rms_norm_eps), x)  # no norm (OLMo 2's inputs)
    unnormed = kernels.rms_norm_quantize(x, torch.empty(0), config.rms_norm_eps, passes)
    assert all(torch.equal(a, b) for a, b in zip(unnormed, kernels.quantize_rows(x, passes), strict=True))
    quantized, row_scale = kernels.rms_norm_quantize(x, layer.input_norm, config.rms_norm_eps, passes)
    expected_quantized, expected_scale = kernels.quantize_rows(normed, passes)
    assert torch.equal(quantized, expected_quantized) and torch.equal(row_scale, expected_scale)

    gemm_out = layer.qkv.matmul_rows(quantized)  # [P·B·K, (heads + 2·kv_heads)·D]
    cache = decoder.new_cache(len(starts))
    cache.keys.zero_()  # a new cache is uninitialized: zeros show what the kernel writes
    cache.values.zero_()
    keys, values = cache.slots()
    row_slot = [row for row in range(len(starts)) for _ in range(num_new)]
    row_position = [start + i for start in starts for i in range(num_new)]
    rope_cos, rope_sin = decoder.layer_rope[0]
    q = kernels.qkv_rope_cache(
        gemm_out, row_scale, layer.qkv.kernel_bias, torch.empty(0), torch.empty(0), config.rms_norm_eps,
        rope_cos, rope_sin, keys, values, 0, row_slot, row_position, row_position, heads,
    )  # fmt: skip
    projected = kernels.combine_rows(gemm_out, row_scale, layer.qkv.kernel_bias, passes)
    projected = projected.reshape(len(starts), num_new, -1)
    q_ref, k_ref, v_ref = projected.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    positions = torch.tensor(starts)[:, None] + torch.arange(num_new)  # [B, K]
    cos, sin = rope_cos[positions][:, :, None], rope_sin[positions][:, :, None]
    q_heads = q_ref.reshape(len(starts), num_new, heads, head_dim)
    assert torch.equal(q, decoder._rotate(q_heads, cos, sin).reshape(rows, heads, head_dim))
    q_norm, k_norm = torch.rand(head_dim, generator=generator) + 0.5, torch.rand(head_dim, generator=generator) + 0.5
    normed_q = kernels.qkv_rope_cache(
        gemm_out, row_scale, layer.qkv.kernel_bias, q_norm, k_norm, config.rms_norm_eps,
        rope_cos, rope_sin, keys, values, 0, row_slot, row_position, row_position, heads,
    )  # fmt: skip
    expected_q = decoder._rotate(decoder._rms_norm(q_heads, q_norm), cos, sin).reshape(rows, heads, head_dim)
    assert torch.allclose(normed_q, expected_q, rtol=1e-5, atol=1e-5)  # Qwen3's and Gemma's q/k norms
    written = key_rows(cache.keys[0, 0], cache.capacity)[:, starts[0]].float()  # [kv_heads, D]: normed k, rotated
    k_heads = k_ref.reshape(len(starts), num_new, kv_heads, head_dim)
    expected_k = decoder._rotate(decoder._rms_norm(k_heads, k_norm), cos, sin)[0, 0]
    assert torch.allclose(written, cached(expected_k, kv_dtype), rtol=1e-3, atol=1e-5)
    q_norm, k_norm = (torch.rand(n * head_dim, generator=generator) + 0.5 for n in (heads, kv_heads))  # OLMo's
    normed_q = kernels.qkv_rope_cache(
        gemm_out, row_scale, layer.qkv.kernel_bias, q_norm, k_norm, config.rms_norm_eps,
        rope_cos, rope_sin, keys, values, 0, row_slot, row_position, row_position, heads,
    )  # fmt: skip
    expected_q = decoder._rotate(decoder._rms_norm(q_ref, q_norm).reshape(q_heads.shape), cos, sin)
    assert torch.allclose(normed_q, expected_q.reshape(rows, heads, head_dim), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(normed_q, decoder._rotate(decoder._rms_norm(q_heads, q_norm[:head_dim]), cos, sin)
                              .reshape(rows, heads, head_dim), rtol=1e-3, atol=1e-3)  # fmt: skip
    written = key_rows(cache.keys[0, 0], cache.capacity)[:, starts[0]].float()
    expected_k = decoder._rotate(decoder._rms_norm(k_ref, k_norm).reshape(k_heads.shape), cos, sin)[0, 0]
    assert torch.allclose(written, cached(expected_k, kv_dtype), rtol=1e-3, atol=1e-5)
    with pytest.raises(RuntimeError, match="as wide as all its heads"):  # neither one head nor all of them
        kernels.qkv_rope_cache(
            gemm_out, row_scale, layer.qkv.kernel_bias, q_norm[: 2 * head_dim], k_norm, config.rms_norm_eps,
            rope_cos, rope_sin, keys, values, 0, row_slot, row_position, row_position, heads,
        )  # fmt: skip
    kernels.qkv_rope_cache(
        gemm_out, row_scale, layer.qkv.kernel_bias, torch.empty(0), torch.empty(0), config.rms_norm_eps,
        rope_cos, rope_sin, keys, values, 0, row_slot, row_position, row_position, heads,
    )  # fmt: skip
    k_ref = decoder._rotate(k_ref.reshape(len(starts), num_new, kv_heads, head_dim), cos, sin)
    for row, start in enumerate(starts):
        written_keys = key_rows(cache.keys[0, row], cache.capacity)
        assert torch.equal(written_keys[:, start : start + num_new], k_ref[row].transpose(0, 1).to(kv_dtype))
        expected_values = v_ref[row].reshape(num_new, kv_heads, head_dim).transpose(0, 1)
        assert torch.equal(cache.values[0, row, :, start : start + num_new], expected_values.to(kv_dtype))
        assert not written_keys[:, start + num_new :].any()  # nothing written past the block

    gemm_out = torch.randn(passes * rows, config.hidden_size, generator=generator) * 50
    bias = torch.randn(config.hidden_size, generator=generator)
    no_norm, eps = torch.empty(0), config.rms_norm_eps
    for kernel_bias in (torch.empty(0), bias):
        combined = kernels.combine_residual(gemm_out, row_scale, kernel_bias, no_norm, eps, 1.0, x)
        assert torch.equal(combined, x + kernels.combine_rows(gemm_out, row_scale, kernel_bias, passes))
        scaled = kernels.combine_residual(gemm_out, row_scale, kernel_bias, no_norm, eps, 0.25, x)  # Granite's
        assert torch.equal(scaled, x + 0.25 * kernels.combine_rows(gemm_out, row_scale, kernel_bias, passes))
    out_norm = torch.rand(config.hidden_size, generator=generator) + 0.5  # Gemma's norm of a sublayer's output
    combined = kernels.combine_residual(gemm_out, row_scale, bias, out_norm, eps, 1.0, x)
    expected = x + decoder._rms_norm(kernels.combine_rows(gemm_out, row_scale, bias, passes), out_norm)
    assert torch.allclose(combined, expected, rtol=1e-5, atol=1e-5)

    gate_up = torch.randn(passes * rows, 2 * config.intermediate_size + 6, generator=generator) * 50  # 6: a tail
    gate, up = combine_passes(gate_up, row_scale, passes).chunk(2, dim=-1)
    for code, function in ACTIVATION_FUNCTIONS.items():  # SiLU, tanh-approximated GELU
        quantized, scale = kernels.gated_quantize(gate_up, row_scale, code, passes)
        activated = function(gate) * up  # [B·K, I]
        assert quantized.dtype == torch.int8 and quantized.shape[0] == passes * rows
        assert torch.allclose(scale[:rows], activated.abs().amax(1, keepdim=True) / 127, rtol=1e-5)
        approximation = combine_passes(quantized.float(), scale, passes)
        float_error = 1e-5 * activated.abs().amax(1, keepdim=True)  # the kernel's exp against torch's
        half_level = scale[-rows:] * 0.5 * (1 + 1e-3)  # the last pass's
        assert (approximation - activated).abs().le(half_level + float_error).all()


def test_fused_layers_are_close_to_the_reference_path() -> None:
    runtime = native_from_hf(tiny_model(64, seed=3))
    tokens = torch.tensor([[5, 9, 2, 33, 7, 1, 60, 12], [3, 3, 4, 40, 41, 2, 9, 9]])
    fused, hidden = runtime.forward_with_hidden(tokens, runtime.new_cache(2))
    runtime.decoder.use_kernel = False
    reference, reference_hidden = runtime.forward_with_hidden(tokens, runtime.new_cache(2))
    assert torch.allclose(hidden, reference_hidden, rtol=1e-3, atol=1e-3)
    assert (fused - reference).abs().max() < 1e-3 * reference.abs().max()
    assert torch.equal(fused.argmax(-1), reference.argmax(-1))


def test_features_cost_the_logits_nothing_and_do_not_depend_on_the_batch(runtime: NativeRuntime) -> None:
    """A draft head's features: capturing them leaves the logits' bits alone, and a position's features are the
    same bits read in one block, split over steps, or beside another request."""
    tokens = [5, 9, 2, 33, 7, 1, 60, 12, 4]
    (plain,) = runtime.forward_batch([BatchRow(runtime.new_cache(1), tokens)])
    (logits,), (features,) = runtime.forward_batch_with_features([BatchRow(runtime.new_cache(1), tokens)], [1])
    assert torch.equal(plain, logits) and features.shape == (9, runtime.hidden_size)
    cache = runtime.new_cache(1)
    _, (first,) = runtime.forward_batch_with_features([BatchRow(cache, tokens[:4], last_only=True)], [1])
    _, (second, _) = runtime.forward_batch_with_features(
        [BatchRow(cache, tokens[4:]), BatchRow(runtime.new_cache(1), [3, 3])], [1]
    )
    assert torch.equal(torch.cat([first, second]), features)  # last_only rows still give every position's


def test_captured_layers_are_the_hidden_states_after_them() -> None:
    runtime = native_from_hf(tiny_model(64, seed=3))
    tokens = torch.tensor([5, 9, 2, 33])
    keys, values = runtime.new_cache(1).static.slots()
    *captured, last = runtime.decoder._decode_rows(tokens, keys, values, [0] * 4, list(range(4)), None, [1, 2])
    reference_keys, reference_values = runtime.new_cache(1).static.slots()
    runtime.decoder.use_kernel = False
    after_one = runtime.decoder._decode_rows(tokens, reference_keys, reference_values, [0] * 4, list(range(4)), 1)
    assert torch.allclose(captured[0], after_one[-1], rtol=1e-3, atol=1e-3)
    assert torch.equal(captured[1], last)  # the tiny model has two layers
    with pytest.raises(ValueError, match="ascending"):
        runtime.decoder._decode_rows(tokens, keys, values, [0] * 4, list(range(4)), None, [2, 1])


@pytest.mark.parametrize("prompt_ids", [[1, 2, 3], [5, 9, 5, 9, 5, 9, 5], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]])
def test_greedy_speculation_on_the_native_runtime_equals_plain(prompt_ids: list[int]) -> None:
    pipeline = sharp_native_pipeline()
    plain = pipeline.generate(prompt_ids, GenerationConfig(max_new_tokens=32), drafter="none")
    for drafter, gamma in itertools.product(["draft-model", "prompt-lookup"], [1, 3, 6]):
        config = GenerationConfig(max_new_tokens=32, num_draft_tokens=gamma)
        result = pipeline.generate(prompt_ids, config, drafter=drafter)
        assert result.token_ids == plain.token_ids, (drafter, gamma)


def test_a_vocabulary_subset_leaves_out_tokens_past_the_models_rows(native_model_dirs: dict) -> None:
    """A tokenizer may name more tokens than the model has rows (its added tokens), and the default subset takes
    every added token: those the model cannot produce are left out, not an error about a subset nobody asked for."""
    from quickdraft.errors import ConfigError
    from quickdraft.runtime.base import LoadOptions

    path = native_model_dirs["draft"]
    rows = DecoderConfig.from_dir(path).vocab_size
    restricted = NativeRuntime.load(path, LoadOptions(vocabulary=(0, 1, 2, rows, rows + 1)))
    assert restricted.decoder.vocabulary is not None and restricted.decoder.vocabulary.tolist() == [0, 1, 2]
    with pytest.raises(ConfigError, match="must name token ids in"):
        NativeRuntime.load(path, LoadOptions(vocabulary=(rows,)))
