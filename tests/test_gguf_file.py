"""quickdraft's GGUF reader against gguf-py's, the oracle: the same metadata values (``ReaderField.contents()``) and
the same tensors (name, type, shape, and data of the same dtype, shape and bytes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import write_tiny_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quickdraft.errors import ModelFilesError
from quickdraft.models import DEFAULT_DRAFT, resolve_model
from quickdraft.models.convert import gguf_source
from quickdraft.models.gguf_check import check_gguf
from quickdraft.models.gguf_file import read_gguf


def assert_same_as_gguf_py(path: Path) -> None:
    from gguf import GGUFReader

    oracle, ours = GGUFReader(path), read_gguf(path)
    assert ours.fields == {key: field.contents() for key, field in oracle.fields.items() if not key.startswith("GGUF.")}
    assert [tensor.name for tensor in ours.tensors] == [tensor.name for tensor in oracle.tensors]
    for mine, theirs in zip(ours.tensors, oracle.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type, mine.name
        assert mine.shape == tuple(int(n) for n in theirs.shape), mine.name
        assert mine.n_elements == int(theirs.n_elements), mine.name
        assert (mine.data.dtype, mine.data.shape) == (theirs.data.dtype, theirs.data.shape), mine.name
        assert mine.data.tobytes() == theirs.data.tobytes(), mine.name


def test_every_kind_of_value_and_tensor_reads_as_gguf_py_reads_it(tmp_path: Path) -> None:
    import gguf

    assert_same_as_gguf_py(write_tiny_gguf(tmp_path / "dense.gguf", extra=("rope_freqs.weight",)))
    assert_same_as_gguf_py(write_tiny_gguf(tmp_path / "tied.gguf", tied=True))
    assert_same_as_gguf_py(write_tiny_gguf(tmp_path / "experts.gguf", "qwen3moe", experts=4))  # 3-D tensors
    writer = gguf.GGUFWriter(tmp_path / "values.gguf", "llama")
    writer.add_bool("flag", True)
    writer.add_int64("big", -(2**40))
    writer.add_float64("precise", 0.1)
    writer.add_array("floats", [0.5, 1.25, -3.0])
    writer.add_array("flags", [True, False, True])
    writer.add_array("names", ["ä", "", "<|im_end|>"])
    writer.add_int8("small", -3)
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    writer.add_tensor("cube", values)
    writer.add_tensor("halves", values.astype(np.float16))
    writer.add_tensor("counts", np.arange(6, dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same_as_gguf_py(tmp_path / "values.gguf")
    assert read_gguf(tmp_path / "values.gguf").fields["names"] == ["ä", "", "<|im_end|>"]


@pytest.mark.real_model
def test_the_default_drafts_file_reads_as_gguf_py_reads_it() -> None:
    """A real vocabulary of 151,936 tokens and its merges."""
    source = gguf_source(resolve_model(DEFAULT_DRAFT, progress=False))
    assert source is not None
    assert_same_as_gguf_py(source)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A tiny file, and where its weights start."""
    from gguf import GGUFReader

    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return path, min(int(tensor.data_offset) for tensor in GGUFReader(path).tensors)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    changes=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.floats(0, 1)),
)
def test_a_damaged_file_reads_or_is_a_clear_error(
    tiny_file: tuple[Path, int], tmp_path: Path, changes: list[tuple[float, int]], cut: float | None
) -> None:
    """Bytes changed in the header, the metadata or the tensor infos (where gguf-py trusted what it read), or the
    file cut short: the file reads, or one ModelFilesError says what is wrong; nothing else is raised."""
    good, header = tiny_file
    data = bytearray(good.read_bytes())
    for where, value in changes:
        data[int(where * header)] = value
    if cut is not None:
        data = data[: int(cut * len(data))]
    path = tmp_path / "damaged.gguf"
    path.write_bytes(bytes(data))
    try:
        check_gguf(path)
    except ModelFilesError as error:
        assert str(error)
