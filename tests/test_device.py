"""Where models run: ``--device`` parsed once, the runtime that runs there, and clear errors for the rest."""

from __future__ import annotations

import pytest
import torch

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig
from quickdraft.errors import ConfigError
from quickdraft.runtime import HFRuntime, LoadOptions, NativeRuntime, runtime_for
from quickdraft.runtime.device import CPU, model_dtype, resolve_device

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without CUDA")
GPU = torch.device("cuda", 0)  # a device object needs no GPU; using it does


@pytest.mark.parametrize("spec", ["cpu", "CPU", " cpu "])
def test_cpu_is_the_cpu(spec):
    assert resolve_device(spec) == CPU and model_dtype(CPU) == torch.float32


@no_gpu
def test_auto_is_the_cpu_without_a_gpu():
    assert resolve_device("auto") == CPU


@no_gpu
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_a_gpu_that_is_not_there_is_a_clear_error(spec):
    with pytest.raises(ConfigError, match="sees no CUDA GPU here; use device cpu"):
        resolve_device(spec)


@pytest.mark.parametrize("spec", ["gpu", "cuda:", "cuda:x", "mps", "cuda:-1", ""])
def test_unknown_devices_are_refused(spec):
    with pytest.raises(ConfigError, match="give auto, cpu, cuda or cuda:N"):
        resolve_device(spec)


def test_on_a_gpu_the_transformers_runtime_runs(tmp_path):
    assert runtime_for("auto", tmp_path, GPU) is HFRuntime
    assert runtime_for("transformers", tmp_path, GPU) is HFRuntime
    with pytest.raises(ConfigError, match="the native runtime runs on the CPU only"):
        runtime_for("native", tmp_path, GPU)
    with pytest.raises(ConfigError, match="runs on the CPU only"):
        NativeRuntime.load(tmp_path, LoadOptions(device=GPU))


def test_the_transformers_runtime_takes_a_device_but_no_other_option(tiny_model_dirs):
    runtime = HFRuntime.load(tiny_model_dirs["target"], LoadOptions(device=CPU))
    assert runtime.device == CPU and runtime.model.dtype == torch.float32
    with pytest.raises(ConfigError, match="needs the native runtime"):
        HFRuntime.load(tiny_model_dirs["target"], LoadOptions(weights="q4", device=CPU))


def test_the_library_loads_on_the_device_asked_for(tiny_model_dirs):
    pipeline = Pipeline.load(tiny_model_dirs["target"], tiny_model_dirs["draft"], device="cpu", progress=False)
    assert pipeline.target.device == CPU and pipeline.draft is not None and pipeline.draft.device == CPU
    result = pipeline.generate("w1 w2", GenerationConfig(max_new_tokens=4, num_draft_tokens=2), "draft-model")
    assert len(result.token_ids) == 4


@no_gpu
def test_the_library_refuses_a_missing_gpu_before_loading_anything(tmp_path):
    with pytest.raises(ConfigError, match="sees no CUDA GPU"):
        Pipeline.load(tmp_path / "no such model", None, device="cuda")
