"""The integer GEMMs of gemm.h on every instruction set this machine runs: each build (AVX-512 VNNI, AVX-VNNI,
AVX2, plain C++) must give the bits of the element-by-element definitions, whatever the number of rows."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from quickdraft.machine import cpu_description
from quickdraft.runtime.native.formats import FORMATS
from quickdraft.runtime.native.iquants import IQ4_VALUES, IQ4HalfPart, IQ4Part
from quickdraft.runtime.native.kquants import Q4Part, Q5Part, Q6Part
from quickdraft.runtime.native.parts import Int8Part, Q8MinPart, Q8Part, WeightPart
from quickdraft.runtime.native.q2k import Q2Part
from quickdraft.runtime.native.q4tables import Q4TableMinPart, Q4TablePart

HERE = Path(__file__).parent
HEADER_DIR = Path(__file__).parents[2] / "quickdraft" / "runtime" / "native"


def isa_builds() -> dict[str, list[str]]:
    """Compiler flags of each instruction set this machine can run, by the name the build reports."""
    isa = set(cpu_description()["isa"])
    builds = {"scalar": ["-march=native", "-mno-avx2", "-mno-avx512f"]}
    if "avx2" in isa:
        builds["avx2"] = ["-march=native", "-mno-avx512f", "-mno-avxvnni"]
    if "avx_vnni" in isa:
        builds["avx-vnni"] = ["-march=native", "-mno-avx512f"]
    if {"avx512f", "avx512bw", "avx512_vnni"} <= isa:
        builds["avx512-vnni"] = ["-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]
        if "amx_int8" in isa:
            builds["avx512-vnni+amx"] = ["-march=native"]
    return builds


def compile_capi(
    source: str, builds: dict[str, list[str]], directory: Path, isa_function: str
) -> dict[str, ctypes.CDLL]:
    """``source`` (beside this file) compiled once per build (name -> compiler flags) into ``directory``; each build
    must report its name from ``isa_function`` (it took the path it was compiled for). Skips without a compiler."""
    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    built = {}
    for name, flags in builds.items():
        library = directory / f"{Path(source).stem}_{name}.so"
        command = ["g++", "-std=c++17", "-O2", "-ffp-contract=off", *flags, "-shared", "-fPIC", f"-I{HEADER_DIR}"]
        subprocess.run([*command, str(HERE / source), "-o", str(library)], check=True)
        built[name] = ctypes.CDLL(str(library))
        getattr(built[name], isa_function).restype = ctypes.c_char_p
        assert getattr(built[name], isa_function)().decode() == name
    return built


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ctypes.CDLL]:
    return compile_capi("gemm_capi.cpp", isa_builds(), tmp_path_factory.mktemp("gemm"), "isa")


def pointer(tensor: torch.Tensor) -> ctypes.c_void_p:
    assert tensor.is_contiguous()
    return ctypes.c_void_p(tensor.data_ptr())


def run(library: ctypes.CDLL, part: WeightPart, x: torch.Tensor, which: int) -> torch.Tensor:
    """which: 0 the fast path, 1 the element-by-element definition."""
    rows, n, k = x.shape[0], part.padded_rows, part.in_features
    out = torch.empty(rows, n)
    size = [ctypes.c_int64(n), ctypes.c_int64(k), pointer(x), ctypes.c_int64(rows), pointer(out), ctypes.c_int(which)]
    gemms = {Int8Part: "int8_gemm", Q8Part: "q8_gemm", Q8MinPart: "q8m_gemm", Q4Part: "q4_gemm", Q5Part: "q5_gemm",
             Q6Part: "q6_gemm", IQ4Part: "iq4_gemm", IQ4HalfPart: "iq4h_gemm", Q4TablePart: "q4t_gemm",
             Q4TableMinPart: "q4tm_gemm", Q2Part: "q2_gemm"}  # fmt: skip
    gemm = getattr(library, gemms[type(part)])
    gemm(*(pointer(tensor) for tensor in part.tensors().values()), *size)
    return out[:, : part.rows]


@pytest.mark.parametrize("kind", FORMATS)
def test_every_instruction_set_gives_the_bits_of_the_definition(libraries: dict[str, ctypes.CDLL], kind: type) -> None:
    generator = torch.Generator().manual_seed(0)
    part = kind.from_float(torch.randn(48, 640, generator=generator))  # q4-q6: two full superblocks, a short one
    # int8 on AMX from 4 rows, iq4 from 32, q4, q5 and q8's family from 48 (pairs of 16-row tiles, one more, the
    # rest): up to 4 · 16 + 16 + 5 rows
    x = torch.randint(-127, 128, (85, 640), generator=generator, dtype=torch.int8)
    expected = run(libraries["scalar"], part, x, which=1)
    assert torch.equal(expected, part.reference(x.float()))  # the C++ definition is the PyTorch one
    for name, library in libraries.items():
        whole = run(library, part, x, which=0)
        assert torch.equal(whole, expected), name
        for rows in range(1, 86):  # every split into tiles, alone and after others
            assert torch.equal(run(library, part, x[-rows:].contiguous(), which=0), expected[-rows:]), (name, rows)


@pytest.mark.parametrize("width", [20, 72, 100])
def test_int8_widths_that_are_not_a_multiple_of_the_unrolling(libraries: dict[str, ctypes.CDLL], width: int) -> None:
    """int8 takes any multiple of 4 input features (q4 takes multiples of 64): the vector paths unroll over 16
    or 8 of them and must handle the rest without reading past a row."""
    generator = torch.Generator().manual_seed(width)
    part = Int8Part.from_float(torch.randn(32, width, generator=generator))
    x = torch.randint(-127, 128, (5, width), generator=generator, dtype=torch.int8)
    expected = part.reference(x.float())
    for name, library in libraries.items():
        for rows in (1, 2, 3, 5):  # 4 partial sums a row for 1-2 rows, 2 for 3-4, 1 beyond
            assert torch.equal(run(library, part, x[:rows].contiguous(), which=0), expected[:rows]), (name, rows)


def test_extreme_values_stay_exact(libraries: dict[str, ctypes.CDLL]) -> None:
    """The largest codes against the largest activations: no 16-bit pair sum saturates, no int32 sum overflows."""
    width = 8960  # the widest input of the default target (its down projection)
    int8 = Int8Part.from_int8(torch.full((16, width), 63, dtype=torch.int8), torch.ones(16))
    q4 = Q4Part.from_blocks(
        torch.full((16, width), 15, dtype=torch.uint8),
        torch.full((16, width // 32), 255, dtype=torch.uint8),
        torch.full((16, width // 32), 255, dtype=torch.uint8),
        torch.ones(16, width // 256),
        torch.ones(16, width // 256),
    )
    q5 = Q5Part.from_blocks(*(torch.full_like(field, 31) if i == 0 else field for i, field in enumerate(q4.blocks())))
    supers = torch.ones(16, width // 256)
    q8_low = Q8Part.from_blocks(torch.full((16, width), -128, dtype=torch.int8), torch.ones(16, width // 32))
    q8_high = Q8Part.from_blocks(torch.full((16, width), 127, dtype=torch.int8), torch.ones(16, width // 32))
    q6_low = Q6Part.from_blocks(  # every weight -128 · (0 - 32) = 4096: the largest offset terms
        torch.zeros(16, width, dtype=torch.uint8), torch.full((16, width // 16), -128, dtype=torch.int8), supers
    )
    q6_high = Q6Part.from_blocks(  # every weight -128 · (63 - 32): the largest code sums
        torch.full((16, width), 63, dtype=torch.uint8), torch.full((16, width // 16), -128, dtype=torch.int8), supers
    )
    q2 = Q2Part.from_blocks(  # every weight d · 15 · 3 + dmin · 15: the largest totals and offsets
        torch.full((16, width), 3, dtype=torch.uint8),
        torch.full((16, width // 16), 15, dtype=torch.uint8),
        torch.full((16, width // 16), 15, dtype=torch.uint8),
        supers,
        -supers,
    )
    for value, rows in ((127, 17), (-127, 17), (127, 65), (-127, 65)):
        x = torch.full((rows, width), value, dtype=torch.int8)  # two vector tiles; 65: q4, q5 and q8 on AMX
        for library in libraries.values():
            assert torch.equal(run(library, int8, x, which=0), torch.full((rows, 16), 63.0 * value * width))
            assert torch.equal(run(library, q4, x, which=0), run(libraries["scalar"], q4, x, which=1))
            assert torch.equal(run(library, q5, x, which=0), run(libraries["scalar"], q5, x, which=1))
            for part, code in ((q8_low, -128), (q8_high, 127)):  # groups' sums exact, then float sums of them
                assert torch.equal(run(library, part, x, which=0), run(libraries["scalar"], part, x, which=1))
                total = torch.full((rows, 16), float(code * value * 32)).double() * (width // 32)
                assert torch.allclose(run(library, part, x, which=0).double(), total)
            assert torch.equal(run(library, q6_low, x, which=0), torch.full((rows, 16), 4096.0 * value * width))
            expected = torch.full((rows, 16), -128.0 * 31 * value * width)  # 256-weight totals and their sums: exact
            assert torch.equal(run(library, q6_high, x, which=0), expected)
            assert torch.equal(run(library, q2, x, which=0), torch.full((rows, 16), 30.0 * value * width))
        for part, code in ((q4, 15), (q5, 31)):
            exact = (code * 255 + 255) * value * width  # every weight d·sc·code + dmin·m; floats round
            expected = torch.full((rows, 16), float(exact), dtype=torch.float64)
            assert torch.allclose(run(libraries["scalar"], part, x, which=1).double(), expected)


def test_iq4_extremes_stay_exact(libraries: dict[str, ctypes.CDLL]) -> None:
    """IQ4_XS's table ends (−127 and 113) and any table's (−128 and 127) under the largest sub-scales against the
    largest activations: no 16-bit pair sum saturates and no superblock total overflows (8 · 128 · 32 · 128 · 127 <
    2^31)."""
    width = 8960
    supers = torch.ones(16, width // 256)
    iq4 = IQ4_VALUES.expand(16, 16)
    ends = torch.tensor([-128, 127] + [0] * 14, dtype=torch.int8).expand(16, 16)
    cases = [(iq4, 0, -128, 128 * 127), (iq4, 15, 127, 127 * 113), (iq4, 0, 127, -127 * 127)]
    cases += [(ends, 0, -128, 128 * 128), (ends, 1, -128, -128 * 127), (ends, 0, 127, -127 * 128)]
    for table, code, sub_scale, weight in cases:
        part = IQ4Part.from_blocks(torch.full((16, width), code, dtype=torch.uint8), table,
                                   torch.full((16, width // 32), sub_scale, dtype=torch.int8), supers)  # fmt: skip
        for value, rows in ((127, 17), (-127, 9), (127, 33), (-127, 33)):  # 33: on AMX, w' = 256 · high + low
            x = torch.full((rows, width), value, dtype=torch.int8)
            total = torch.tensor(float(weight * value * 256), dtype=torch.float32)  # a superblock's: exact
            acc = torch.zeros((), dtype=torch.float32)
            for _ in range(width // 256):  # fma(d = 1, total, acc): each step rounds to float32
                acc = acc + total
            expected = torch.full((rows, 16), float(acc))
            for name, library in libraries.items():
                assert torch.equal(run(library, part, x, which=0), expected), (name, code, sub_scale, value)


@pytest.mark.parametrize("kind", [IQ4Part, IQ4HalfPart])
def test_iq4_takes_any_table(libraries: dict[str, ctypes.CDLL], kind: type) -> None:
    """A random table per part (as the IQ2 types' replaces IQ4_XS's), with zeros and both int8 ends, and random
    sub-scales per 32 (iq4) or 16 (iq4h) weights: every instruction set gives the definition's bits, the PyTorch
    reference's too, for few rows and for AMX's many, and for a width that is not a multiple of 64 (19 groups: the
    vector path whatever the rows)."""
    generator = torch.Generator().manual_seed(5)
    table = torch.randint(-128, 128, (16,), generator=generator, dtype=torch.int8)
    table[:3] = torch.tensor([-128, 0, 127], dtype=torch.int8)
    for width in (640, 608):
        codes = torch.randint(0, 16, (48, width), generator=generator, dtype=torch.uint8)
        sub_scale = torch.randint(-128, 128, (48, width // kind.sub_block), generator=generator, dtype=torch.int8)
        d = torch.rand(48, 3, generator=generator) / 64
        part = kind.from_blocks(codes, table.expand(48, 16), sub_scale, d)
        x = torch.randint(-127, 128, (37, width), generator=generator, dtype=torch.int8)
        expected = run(libraries["scalar"], part, x, which=1)
        assert torch.equal(expected, part.reference(x.float()))
        for name, library in libraries.items():
            for rows in (1, 2, 5, 8, 9, 21, 32, 37):
                result = run(library, part, x[:rows].contiguous(), which=0)
                assert torch.equal(result, expected[:rows]), (name, width, rows)


@pytest.mark.parametrize("kind", [Q4Part, Q5Part, Q8Part, Q8MinPart, Q4TablePart, Q4TableMinPart, IQ4Part, IQ4HalfPart])
def test_amx_continues_across_ranges(libraries: dict[str, ctypes.CDLL], kind: type) -> None:
    """Many rows of a wide input: the AMX paths take the superblocks (q4, q5, iq4) or groups (q8's family) in ranges
    whose rows fit their cache budget (85 rows of 8,960: three ranges, the last short; 200 rows: four, and q8's of an
    odd number of groups) and continue each output's float sum from range to range."""
    generator = torch.Generator().manual_seed(3)
    part = kind.from_float(torch.randn(32, 8960, generator=generator))
    x = torch.randint(-127, 128, (200, 8960), generator=generator, dtype=torch.int8)
    expected = run(libraries["scalar"], part, x, which=1)
    for name, library in libraries.items():
        for rows in (48, 64, 65, 85, 200):  # 16-row tiles; one more tile; a short last tile; shorter ranges
            assert torch.equal(run(library, part, x[:rows].contiguous(), which=0), expected[:rows]), (name, rows)


@pytest.mark.parametrize("kind", [Q8Part, Q8MinPart, Q4TablePart, Q4TableMinPart])
def test_q8_family_on_amx_takes_an_odd_number_of_groups(libraries: dict[str, ctypes.CDLL], kind: type) -> None:
    """19 groups of 32: the AMX path's last group of a range has no partner in its pair of tiles."""
    generator = torch.Generator().manual_seed(4)
    part = kind.from_float(torch.randn(32, 608, generator=generator))
    x = torch.randint(-127, 128, (65, 608), generator=generator, dtype=torch.int8)
    expected = run(libraries["scalar"], part, x, which=1)
    for name, library in libraries.items():
        for rows in (48, 65):
            assert torch.equal(run(library, part, x[:rows].contiguous(), which=0), expected[:rows]), (name, rows)
