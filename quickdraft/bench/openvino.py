"""OpenVINO GenAI as a bench peer: Intel's int4 CPU kernels on int4 exports of the very weights quickdraft runs.

``openvino`` is plain greedy decoding by ``openvino_genai.LLMPipeline`` and ``openvino-draft`` its
draft-model speculation (``draft_model=openvino_genai.draft_model(...)``, 5 draft tokens: GenAI's
documented default ``num_assistant_tokens``). Both read int4 OpenVINO exports of the pair's
transformers directories, made once by optimum-intel (``optimum-cli export openvino --weight-format
int4``) into ``$QUICKDRAFT_CACHE/openvino/``, and are fed our prompt token ids (no second
tokenization), with the bench's token budget, end-of-sequence tokens and thread count. GenAI computes
with its own int4 kernels, so its greedy tokens may differ from ours: how often they agree is reported
as agreement, not as a lossless check.

optimum-intel 2.2.0 needs transformers < 5.6 (quickdraft runs a newer one), so the export runs in its
own environment: a virtual environment under ``$QUICKDRAFT_CACHE/openvino/`` that pip fills once with
the pinned :data:`EXPORTER_REQUIREMENTS`; the bench's own environment only needs openvino-genai.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import venv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quickdraft.api import Pipeline
from quickdraft.bench.base import GREEDY, Method, TurnResult
from quickdraft.bench.peers import StepClock, require_module, run_quietly, settings_key
from quickdraft.errors import ConfigError
from quickdraft.files import cache_root
from quickdraft.lossless.sampling import SamplingParams
from quickdraft.models.convert import MARKER, ensure_fp32_weights

OPENVINO_GENAI = "2026.4.1.0"  # the version of the `peers` extra
INSTALL = f"pip install 'quickdraft[peers]' (openvino-genai=={OPENVINO_GENAI})"
DRAFT_TOKENS = 5  # GenAI's default num_assistant_tokens (its continuous-batching backend uses it as is)
EXPORT_ARGS = ("--task", "text-generation-with-past", "--weight-format", "int4")
# optimum-intel is installed without its dependencies: it lists torchvision, which only its vision models
# import (and PyPI's torchvision does not import beside a CPU build of torch); the rest are pinned here.
EXPORTER_TOOL = "optimum-intel==2.2.0"
EXPORTER_REQUIREMENTS = (
    "torch==2.13.0",
    "transformers==5.5.4",
    "optimum==2.3.0",
    "nncf==3.4.0",
    "openvino==2026.4.1",
    "openvino-tokenizers==2026.4.1.0",
    "huggingface-hub>=0.23.2,<1.22",
    "requests>=2.33,<3",
    "setuptools",
)
EXPORT_MARKER = "quickdraft-export.json"  # written last: a directory with it is a whole export


def openvino_root() -> Path:
    return cache_root() / "openvino"


def exporter_python(progress: bool = True) -> Path:
    """The Python of the exporter's own virtual environment, made once (into a scratch directory, renamed
    into place when complete, so a killed install is never taken for a whole one)."""
    home = openvino_root() / f"exporter-{settings_key(EXPORTER_TOOL, *EXPORTER_REQUIREMENTS)}"
    python = home / "bin" / "python"
    if python.is_file():
        return python
    started = time.perf_counter()
    if progress:
        print(f"installing {EXPORTER_TOOL} once into its own environment {home} (a few minutes) ...",
              file=sys.stderr, flush=True)  # fmt: skip
    openvino_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=openvino_root(), prefix=".exporter-") as scratch:
        building = Path(scratch) / "env"
        venv.EnvBuilder(with_pip=True).create(building)
        pip = [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        what = f"installing {EXPORTER_TOOL} for the OpenVINO export"
        run_quietly([*pip, "--no-deps", EXPORTER_TOOL], what)
        run_quietly([*pip, *EXPORTER_REQUIREMENTS], what)
        building.rename(home)  # python -m finds the environment from its own path: it may move
    if progress:
        print(f"installed in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return python


def source_identity(model_dir: Path) -> str:
    """What names a model directory's weights: the digest of the GGUF file quickdraft converted it from,
    else its resolved path and its files' sizes and modification times."""
    try:
        return "gguf-sha256:" + str(json.loads((model_dir / MARKER).read_text(encoding="utf-8"))["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        files = sorted(path for path in model_dir.iterdir() if path.is_file())
        stats = [[path.name, path.stat().st_size, path.stat().st_mtime_ns] for path in files]
        return json.dumps([str(model_dir.resolve()), *stats])


def exported_model(model_dir: Path | None, role: str = "target", progress: bool = True) -> Path:
    """The int4 OpenVINO export of a transformers directory, made once into
    ``$QUICKDRAFT_CACHE/openvino/NAME-KEY/`` (KEY: the source's identity and the export's settings) in a
    scratch directory renamed into place when complete. Offline: no model hub is asked."""
    if model_dir is None or not (model_dir / "config.json").is_file():
        raise ConfigError(f"the OpenVINO peers export the {role} from a transformers directory; {model_dir} is not one")
    name = model_dir.parent.name if model_dir.name == "hf" else model_dir.name
    target = openvino_root() / f"{name}-{settings_key(source_identity(model_dir), EXPORTER_TOOL, *EXPORT_ARGS)}"
    if (target / EXPORT_MARKER).is_file():
        return target
    ensure_fp32_weights(model_dir, progress)  # the exporter reads fp32 weights: made once beside a GGUF's directory
    python = exporter_python(progress)
    started = time.perf_counter()
    if progress:
        print(f"exporting the {role} {model_dir} to OpenVINO int4 once into {target} (a minute or two) ...",
              file=sys.stderr, flush=True)  # fmt: skip
    offline = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    openvino_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=openvino_root(), prefix=".export-") as scratch:
        building = Path(scratch) / "model"
        command = [str(python), "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(model_dir)]
        run_quietly([*command, *EXPORT_ARGS, str(building)], f"exporting {model_dir} to OpenVINO", offline)
        seconds = time.perf_counter() - started
        record = {"source": str(model_dir), "identity": source_identity(model_dir), "exporter": EXPORTER_TOOL,
                  "args": EXPORT_ARGS, "seconds": round(seconds, 1)}  # fmt: skip
        (building / EXPORT_MARKER).write_text(json.dumps(record) + "\n", encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)  # a directory without the marker is not an export
        building.rename(target)
    if progress:
        print(f"exported in {seconds:.0f} s", file=sys.stderr, flush=True)
    return target


class OpenVinoMethod(Method):
    """Greedy decoding by OpenVINO GenAI's ``LLMPipeline`` on the int4 export of the target, plain or with
    the int4 export of the draft as its draft model."""

    peer = True

    def __init__(self, name: str, draft: bool = False) -> None:
        self.name = name
        self.uses_draft_model = draft
        self._pipe: Any = None

    def check(self) -> None:
        require_module(self.name, "openvino_genai", "openvino-genai", INSTALL)

    def load(self, pipeline: Pipeline, cost_curves: Mapping[str, Mapping[int, float]], context: int = 0) -> None:
        """Export (once) and load the models with the bench's thread count and no prefix cache: GenAI keeps
        the previous prompt's blocks by default, and every method reads every prompt whole, as the baseline."""
        import openvino_genai
        import torch

        self.check()
        target = exported_model(pipeline.target_path)
        threads = {"INFERENCE_NUM_THREADS": torch.get_num_threads()}
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.enable_prefix_caching = False
        if self.uses_draft_model:
            draft = openvino_genai.draft_model(str(exported_model(pipeline.draft_path, "draft")), "CPU", **threads)
            threads |= {"draft_model": draft}
        self._pipe = openvino_genai.LLMPipeline(str(target), "CPU", scheduler_config=scheduler, **threads)

    def run(
        self, pipeline: Pipeline, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams = GREEDY
    ) -> TurnResult:
        """Our ids in, greedy tokens out until an end-of-sequence token (kept) or the budget; a step is one
        call of the streamer, which GenAI makes with each step's new tokens."""
        import numpy as np
        import openvino
        import openvino_genai

        if self._pipe is None:
            raise ConfigError(f"method {self.name!r}: load() was not called")

        class Streamer(openvino_genai.StreamerBase):
            def write(self, token: int | list[int]) -> Any:
                clock.tick(len(token) if isinstance(token, list) else 1)
                return openvino_genai.StreamingStatus.RUNNING

            def end(self) -> None:
                pass

        config = self._pipe.get_generation_config()
        config.do_sample = False
        config.repetition_penalty = 1.0
        config.max_new_tokens = max_new_tokens
        config.stop_token_ids = set(pipeline.eos_token_ids)  # the draft pipeline's own config has no eos
        if self.uses_draft_model:
            config.num_assistant_tokens = DRAFT_TOKENS
        ids = openvino.Tensor(np.array([prompt_ids], dtype=np.int64))
        clock = StepClock()
        output = self._pipe.generate(ids, config, Streamer())
        clock.stop()
        token_ids = [int(token) for token in output.tokens[0]]
        if not self.uses_draft_model:
            return clock.turn_result(token_ids)
        metrics = output.extended_perf_metrics
        return clock.turn_result(
            token_ids,
            draft_tokens_proposed=int(metrics.get_num_draft_tokens()),
            draft_tokens_accepted=int(metrics.get_num_accepted_tokens()),
        )
