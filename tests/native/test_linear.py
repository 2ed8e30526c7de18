"""Quantized linear layers: rows never mix, the kernels equal the PyTorch operations bitwise, every format."""

from __future__ import annotations

import pytest
import torch

from quickdraft.runtime.native import parts
from quickdraft.runtime.native.formats import PART_KINDS
from quickdraft.runtime.native.iquants import IQ4_VALUES, IQ4Part
from quickdraft.runtime.native.kernels import native_kernels
from quickdraft.runtime.native.kquants import Q4Part, Q5Part, Q6Part
from quickdraft.runtime.native.linear import QuantizedLinear, quantize_rows
from quickdraft.runtime.native.parts import CODE_ROWS, BlockPart, Int8Part, Q8MinPart, Q8Part, quantize_weight
from quickdraft.runtime.native.q2k import Q2Part
from quickdraft.runtime.native.q4tables import Q4TableMinPart, Q4TablePart


def with_kernels(linear: QuantizedLinear, use_kernel: bool) -> QuantizedLinear:
    linear.use_kernel = use_kernel
    return linear


def in_passes(linear: QuantizedLinear, passes: int) -> QuantizedLinear:
    return QuantizedLinear(linear.parts, linear.bias, passes)


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("kind", list(PART_KINDS))
@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernels", "torch-ops"])
def test_a_rows_result_does_not_depend_on_the_other_rows(kind: str, use_kernel: bool, passes: int) -> None:
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 128, generator=generator), torch.randn(96, generator=generator)
    weight[3, 7] = 40.0  # an outlier weight: its channel's (or group's) other weights get few levels
    linear = with_kernels(in_passes(QuantizedLinear.from_float(weight, bias, kind), passes), use_kernel)
    x = torch.randn(17, 128, generator=generator) * torch.logspace(-2, 2, 17)[:, None]  # rows of very different scale
    full = linear(x)
    for rows in (0, 1, 2, 5, 16):
        assert torch.equal(linear(x[:rows]), full[:rows])
    for row in range(17):
        assert torch.equal(linear(x[row : row + 1])[0], full[row])
        assert torch.equal(linear(torch.cat([torch.randn(3, 128), x[row : row + 1]]))[-1], full[row])
    # close to the float layer: the quantization error itself
    relative = (full - (x @ weight.T + bias)).norm() / (x @ weight.T).norm()
    assert float(relative) < {"int8": 0.03, "q8": 0.03, "q8m": 0.08, "q5": 0.08, "q2": 0.35}.get(kind, 0.15)


def test_int8_parts_are_exact_integer_arithmetic() -> None:
    generator = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(40, 24, generator=generator), torch.randn(40, generator=generator)
    linear = QuantizedLinear.from_float(weight, bias)
    x = torch.randn(9, 24, generator=generator) * 3
    weight_int8, weight_scale = quantize_weight(weight)
    assert int(weight_int8.abs().max()) == 63  # 7-bit weights: AVX2's 16-bit pair sums cannot saturate
    rows, row_scale = quantize_rows(x)
    exact = ((rows.double() @ weight_int8.double().T).float() * weight_scale) * row_scale + bias  # float32 steps
    assert torch.equal(linear(x), exact)


def test_a_second_pass_quantizes_what_the_first_left() -> None:
    """Two passes: the second pass's rows are the first pass's rounding error, quantized by the same rule; together
    they are within half the second scale of x (about 15 bits), and a row with an outlier gains the most."""
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(6, 256, generator=generator)
    x[0, 3] = 60.0  # an outlier
    rows, row_scale = quantize_rows(x, 2)  # [12, 256], [12, 1]
    first, first_scale = quantize_rows(x)
    assert torch.equal(rows[:6], first) and torch.equal(row_scale[:6], first_scale)
    second, second_scale = quantize_rows(x - first * first_scale)
    assert torch.equal(rows[6:], second) and torch.equal(row_scale[6:], second_scale)
    approximation = rows[:6] * row_scale[:6] + rows[6:] * row_scale[6:]
    assert (approximation - x).abs().le(row_scale[6:] * 0.5 * (1 + 1e-3)).all()
    assert (second_scale <= first_scale / 2 / 127 * (1 + 1e-3)).all()  # the rounding error is at most half a level
    kernels = native_kernels()
    assert kernels is not None
    compiled_rows, compiled_scale = kernels.quantize_rows(x, 2)
    assert torch.equal(compiled_rows.float(), rows) and torch.equal(compiled_scale, row_scale)
    with pytest.raises(ValueError, match="1 or 2 passes"):
        quantize_rows(x, 3)
    with pytest.raises(RuntimeError, match="1 or 2 passes"):
        kernels.quantize_rows(x, 3)


def test_q4_parts_are_exact_integer_group_sums() -> None:
    """The q4 result against its definition in float64: integer group sums, then the scales."""
    generator = torch.Generator().manual_seed(2)
    part = Q4Part.from_float(torch.randn(32, 512, generator=generator))
    x = torch.randn(5, 512, generator=generator)
    rows, _ = quantize_rows(x)
    exact = rows.double() @ part.dequantize().double().T
    assert torch.allclose(part.reference(rows).double(), exact, rtol=1e-5, atol=1e-5 * float(exact.abs().max()))


def test_q4_parts_hold_fewer_levels_as_stretched_codes() -> None:
    """Codes of 8 levels (3 bits) are stored as even Q4_K codes, so a group's weights take at most 8 values, within
    half a step of the float weights; more than 15 levels do not fit and are refused."""
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(16, 256, generator=generator)
    groups = weight.reshape(16, 8, 32)
    low = groups.amin(dim=-1).clamp(max=0.0)
    step = (groups.amax(dim=-1) - low) / 7  # [N, G]
    part = Q4Part.from_groups(weight, low, step, levels=7)
    codes = part.blocks()[0]  # [N, K]
    assert int(codes.max()) <= 14 and not bool((codes % 2).any())
    values = part.dequantize().reshape(16, 8, 32)
    assert max(len(torch.unique(group)) for group in values.reshape(-1, 32)) <= 8
    assert bool(((values - groups).abs() <= 0.51 * step[..., None] + 1e-3).all())
    with pytest.raises(ValueError, match="1 to 15 levels"):
        Q4Part.from_groups(weight, low, step, levels=16)


def test_q4_rounding_keeps_each_row_to_itself_across_its_slices() -> None:
    """from_groups rounds CODE_ROWS rows at a time: a matrix a slice and a bit longer is quantized as its rows
    would be on their own (the last rows alone)."""
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(CODE_ROWS + 21, 64, generator=generator)
    whole, tail = Q4Part.from_float(weight), Q4Part.from_float(weight[-21:])
    for mine, alone in zip(whole.blocks(), tail.blocks(), strict=True):
        assert torch.equal(mine[-21:], alone)


def test_q6_parts_are_exact_integer_sub_block_sums() -> None:
    """The q6 result against the float64 product of the rows and its weights (exact integer sub-block sums, each
    then scaled by d · sub_scale in float32); and its weights are within half a step of the float weights they
    were quantized from."""
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(32, 640, generator=generator)
    part = Q6Part.from_float(weight)
    _, sub_scale, d = part.blocks()
    step = (d.repeat_interleave(16, dim=1)[:, : 640 // 16] * sub_scale.float()).repeat_interleave(16, dim=1)
    assert bool(((part.dequantize() - weight).abs() <= step / 2 + 1e-6).all())
    rows, _ = quantize_rows(torch.randn(5, 640, generator=generator))
    exact = rows.double() @ part.dequantize().double().T
    assert torch.allclose(part.reference(rows).double(), exact, rtol=1e-5, atol=1e-5 * float(exact.abs().max()))


def test_q2_parts_are_exact_integer_superblock_sums() -> None:
    """The q2 result against the float64 product of the rows and its weights (exact integer superblock totals,
    scaled by d and dmin in float32); its weights lie within half a step of the float weights, or at the end of a
    sub-block's four levels."""
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(32, 640, generator=generator)
    part = Q2Part.from_float(weight)
    codes, sub_scale, sub_min, d, _ = part.blocks()
    assert int(codes.max()) == 3 and int(sub_scale.max()) == 15 and int(sub_min.max()) == 15
    step = (d.repeat_interleave(16, dim=1)[:, :40] * sub_scale.float()).repeat_interleave(16, dim=1)  # [N, K]
    error = (part.dequantize() - weight).abs()
    assert bool(((error <= step / 2 + 1e-6) | (codes == 0) | (codes == 3)).all())
    assert float(error.mean()) < 0.4 * float(weight.abs().mean())  # four levels: about a third
    rows, _ = quantize_rows(torch.randn(5, 640, generator=generator))
    exact = rows.double() @ part.dequantize().double().T
    assert torch.allclose(part.reference(rows).double(), exact, rtol=1e-5, atol=1e-5 * float(exact.abs().max()))


def test_q2_blocks_round_trip_and_bad_fields_are_refused() -> None:
    generator = torch.Generator().manual_seed(4)
    rows, width = 24, 640
    blocks = (
        torch.randint(0, 4, (rows, width), generator=generator, dtype=torch.uint8),
        torch.randint(0, 16, (rows, width // 16), generator=generator, dtype=torch.uint8),
        torch.randint(0, 16, (rows, width // 16), generator=generator, dtype=torch.uint8),
        torch.rand(rows, 3, generator=generator),
        -torch.rand(rows, 3, generator=generator),
    )
    part = Q2Part.from_blocks(*blocks)
    for got, expected in zip(part.blocks(), blocks, strict=True):
        assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="at most 3"):
        Q2Part.from_blocks(blocks[0] + 1, *blocks[1:])
    with pytest.raises(ValueError, match=r"sub-mins are in \[0, 15\]"):
        Q2Part.from_blocks(*blocks[:2], blocks[2] + 16, *blocks[3:])
    with pytest.raises(ValueError, match="multiple of 32"):
        Q2Part.from_float(torch.randn(4, 48))


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("kind", list(PART_KINDS))
def test_the_kernels_equal_the_pytorch_operations_bitwise(kind: str, passes: int) -> None:
    generator = torch.Generator().manual_seed(5)
    linear = QuantizedLinear.from_float(
        torch.randn(40, 64, generator=generator), torch.randn(40, generator=generator), kind
    )
    linear = in_passes(linear, passes)
    x = torch.randn(9, 64, generator=generator) * 3
    x[2, 5] = 80.0  # an outlier: the other activations of its row get few levels in one pass
    assert native_kernels() is not None
    assert torch.equal(with_kernels(linear, True)(x), with_kernels(linear, False)(x))


def test_parts_of_both_formats_side_by_side() -> None:
    """A fused projection whose rows come in two formats (a GGUF file's Q4_K q/k and Q6_K v) and sizes that are not
    multiples of 16: each part's columns land where they belong."""
    generator = torch.Generator().manual_seed(3)
    weights = [torch.randn(rows, 64, generator=generator) for rows in (20, 8, 36)]
    weights += [torch.randn(rows, 64, generator=generator) for rows in (12, 5)]
    parts = [
        Q4Part.from_float(weights[0]),
        Int8Part.from_float(weights[1]),
        Q6Part.from_float(weights[2]),
        Q5Part.from_float(weights[3]),
        Q8Part.from_float(weights[4]),
    ]
    linear = QuantizedLinear(parts, torch.randn(81, generator=generator))
    x = torch.randn(7, 64, generator=generator)
    y = linear(x)
    assert y.shape == (7, 81)
    for part, start, stop in zip(parts, (0, 20, 28, 64, 76), (20, 28, 64, 76, 81), strict=True):
        alone = QuantizedLinear([part], linear.bias[start:stop])
        assert torch.equal(y[:, start:stop], alone(x))
    assert torch.equal(y, with_kernels(linear, False)(x))
    restored = QuantizedLinear.from_state("proj", linear.state("proj"))
    assert torch.equal(restored(x), y)


@pytest.mark.parametrize("part", [Q4Part, Q5Part])
def test_q4_and_q5_blocks_round_trip_through_the_packed_layout(part: type[Q4Part]) -> None:
    """Every code comes back, its fifth bit too (q5: the nibbles are q4's, the fifth bits a plane of their own)."""
    generator = torch.Generator().manual_seed(4)
    rows, width = 24, 640  # 20 groups: two full superblocks and one of four groups
    blocks = (
        torch.randint(0, part.max_code + 1, (rows, width), generator=generator, dtype=torch.uint8),
        torch.randint(0, 256, (rows, width // 32), generator=generator, dtype=torch.uint8),
        torch.randint(0, 256, (rows, width // 32), generator=generator, dtype=torch.uint8),
        torch.rand(rows, 3, generator=generator),
        -torch.rand(rows, 3, generator=generator),
    )
    packed = part.from_blocks(*blocks)
    for got, expected in zip(packed.blocks(), blocks, strict=True):
        assert torch.equal(got, expected)
    assert torch.equal(packed.codes, Q4Part.from_blocks(blocks[0] & 0x0F, *blocks[1:]).codes)
    if part is Q5Part:
        with pytest.raises(ValueError, match="at most 15"):
            Q4Part.from_blocks(*blocks)


def random_fields(part: type[BlockPart], rows: int, width: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Plain fields of ``part`` (q4, q5, q6, q2, q8 or q8m) with every code and sub-scale random."""

    def ints(low: int, high: int, columns: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        return torch.randint(low, high, (rows, columns), generator=generator, dtype=dtype)

    def floats(columns: int) -> torch.Tensor:
        return torch.rand(rows, columns, generator=generator).to(torch.float16).float()

    supers = -(-width // 256)
    if part is Q6Part:
        return ints(0, 64, width), ints(-128, 128, width // 16, torch.int8), floats(supers)
    if part is Q2Part:
        return ints(0, 4, width), ints(0, 16, width // 16), ints(0, 16, width // 16), floats(supers), -floats(supers)
    if part in (Q8Part, Q8MinPart):
        return ints(-128, 128, width, torch.int8), *(floats(width // 32) for _ in part.tensor_names[1:])
    max_code = part.max_code  # type: ignore[attr-defined]
    return (
        ints(0, max_code + 1, width),
        ints(0, 256, width // 32),
        ints(0, 256, width // 32),
        floats(supers),
        -floats(supers),
    )


@pytest.mark.parametrize("part", [Q4Part, Q5Part, Q6Part, Q2Part, Q8Part, Q8MinPart])
def test_packing_a_few_rows_at_a_time_gives_the_panels_of_packing_all_at_once(
    part: type[BlockPart], monkeypatch: pytest.MonkeyPatch
) -> None:
    """from_blocks packs CODE_ROWS rows at a time: with 16 at a time, 37 rows (two whole chunks and a last one of 5
    rows, zero-padded to a panel) pack into the same tensors as all 37 at once."""
    blocks = random_fields(part, 37, 512, torch.Generator().manual_seed(6))
    whole = part.from_blocks(*blocks)
    monkeypatch.setattr(parts, "CODE_ROWS", 16)
    chunked = part.from_blocks(*blocks)
    for name, tensor in whole.tensors().items():
        assert torch.equal(chunked.tensors()[name], tensor), name
    for got, expected in zip(chunked.blocks(), blocks, strict=True):
        assert torch.equal(got, expected)


def test_q8_blocks_round_trip_through_the_packed_layout() -> None:
    generator = torch.Generator().manual_seed(4)
    rows, width = 24, 96
    blocks = (
        torch.randint(-128, 128, (rows, width), generator=generator, dtype=torch.int8),
        torch.rand(rows, width // 32, generator=generator).to(torch.float16).float(),
    )
    part = Q8Part.from_blocks(*blocks)
    for got, expected in zip(part.blocks(), blocks, strict=True):
        assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="float16"):
        Q8Part.from_blocks(blocks[0], blocks[1] + 1e-5)
    mins = -torch.rand(rows, width // 32, generator=generator).to(torch.float16).float()
    with_mins = Q8MinPart.from_blocks(*blocks, mins)
    for got, expected in zip(with_mins.blocks(), (*blocks, mins), strict=True):
        assert torch.equal(got, expected)


def test_q4t_blocks_round_trip_through_the_packed_layout() -> None:
    """Codes, a table shared by every row, scales (and q4tm's mins) come back as given; a table that differs between
    rows, values outside int8 and codes outside 4 bits are refused."""
    generator = torch.Generator().manual_seed(4)
    rows, width = 24, 96
    table = torch.randint(-128, 128, (16,), generator=generator, dtype=torch.int8)
    blocks = (
        torch.randint(0, 16, (rows, width), generator=generator, dtype=torch.uint8),
        table.expand(rows, 16),
        torch.rand(rows, width // 32, generator=generator).to(torch.float16).float(),
    )
    mins = -torch.rand(rows, width // 32, generator=generator).to(torch.float16).float()
    for part, fields in (
        (Q4TablePart.from_blocks(*blocks), blocks),
        (Q4TableMinPart.from_blocks(*blocks, mins), (*blocks, mins)),
    ):
        for got, expected in zip(part.blocks(), fields, strict=True):
            assert torch.equal(got, expected)
    other = blocks[1].clone()
    other[5, 3] += 1
    with pytest.raises(ValueError, match="one table"):
        Q4TablePart.from_blocks(blocks[0], other, blocks[2])
    with pytest.raises(ValueError, match=r"codes are in \[0, 15\]"):
        Q4TablePart.from_blocks(blocks[0] + 16, *blocks[1:])
    with pytest.raises(ValueError, match="int8"):
        Q4TablePart.from_blocks(blocks[0], torch.full((rows, 16), 200), blocks[2])


def test_q6_blocks_round_trip_through_the_packed_layout() -> None:
    generator = torch.Generator().manual_seed(4)
    rows, width = 24, 640
    blocks = (
        torch.randint(0, 64, (rows, width), generator=generator, dtype=torch.uint8),
        torch.randint(-128, 128, (rows, width // 16), generator=generator, dtype=torch.int8),
        torch.rand(rows, 3, generator=generator),
    )
    part = Q6Part.from_blocks(*blocks)
    for got, expected in zip(part.blocks(), blocks, strict=True):
        assert torch.equal(got, expected)


def test_weights_outside_7_bits_are_refused() -> None:
    for value in (64, -64, -128):  # AVX2's 16-bit pair sums could saturate
        weight = torch.zeros(4, 8, dtype=torch.int8)
        weight[1, 2] = value
        with pytest.raises(ValueError, match=r"\[-63, 63\]"):
            Int8Part.from_int8(weight, torch.ones(4))


def test_widths_the_formats_cannot_pack_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        Int8Part.from_float(torch.randn(4, 6))
    with pytest.raises(ValueError, match="multiple of 64"):
        Q4Part.from_float(torch.randn(4, 96))
    with pytest.raises(ValueError, match="q5 weights need a multiple of 64"):
        Q5Part.from_float(torch.randn(4, 96))
    with pytest.raises(ValueError, match="q8 weights need a multiple of 32"):
        Q8Part.from_float(torch.randn(4, 48))
    with pytest.raises(ValueError, match="multiple of 32"):
        Q6Part.from_blocks(torch.zeros(4, 48, dtype=torch.uint8), torch.zeros(4, 3, dtype=torch.int8), torch.ones(4, 1))
    with pytest.raises(ValueError, match="iq4 weights need a multiple of 32"):
        IQ4Part.from_float(torch.randn(4, 48))
    scales = torch.zeros(4, 2, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"iq4 codes are in \[0, 15\]"):
        IQ4Part.from_blocks(
            torch.full((4, 64), 16, dtype=torch.uint8), IQ4_VALUES.expand(4, 16), scales, torch.ones(4, 1)
        )
    tables = torch.stack([IQ4_VALUES, IQ4_VALUES.flip(0), IQ4_VALUES, IQ4_VALUES])
    with pytest.raises(ValueError, match="one table of 16 values for all their rows"):
        IQ4Part.from_blocks(torch.zeros(4, 64, dtype=torch.uint8), tables, scales, torch.ones(4, 1))


@pytest.mark.parametrize("kind", list(PART_KINDS))
def test_zero_rows_give_the_bias(kind: str) -> None:
    linear = QuantizedLinear.from_float(torch.randn(8, 64), torch.ones(8), kind)
    assert torch.equal(linear(torch.zeros(2, 64)), torch.ones(2, 8))


@pytest.mark.parametrize("kind", list(PART_KINDS))
def test_selected_rows_keep_their_weights_and_their_results(kind: str) -> None:
    """Rows picked from a few 16-row panels of a larger layer (an LM head's focus): each keeps its weights, so
    its output is bitwise the whole layer's at that row."""
    torch.manual_seed(4)
    layer = QuantizedLinear.from_float(torch.randn(100, 128), kind=kind)
    x = torch.randn(3, 128)
    for index in ([0], [5, 17, 99], [31, 32, 33, 64, 98], list(range(100))):
        chosen = layer.select_rows(torch.tensor(index))
        assert chosen.out_features == len(index)
        assert torch.equal(chosen.parts[0].dequantize(), layer.parts[0].dequantize()[index])
        assert torch.equal(chosen(x), layer(x)[:, index])


@pytest.mark.parametrize("kind", list(PART_KINDS))
def test_the_runtimes_build_gives_the_operations_bits_for_many_rows(kind: str) -> None:
    """The kernels as the runtime compiles them (its own flags, not the GEMM tests'), at row counts on both sides of
    every tile path's threshold, AMX's from 4 to 48 rows included: the PyTorch operations' bits."""
    generator = torch.Generator().manual_seed(1)
    linear = QuantizedLinear.from_float(torch.randn(48, 640, generator=generator), None, kind)
    x = torch.randn(85, 640, generator=generator)
    expected = with_kernels(linear, False)(x)
    with_kernels(linear, True)
    for rows in (1, 16, 17, 31, 32, 47, 48, 49, 63, 64, 65, 85):
        assert torch.equal(linear(x[:rows]), expected[:rows]), rows
