"""``api.py``'s arguments: a wrong one is an error naming it, never a traceback from deep inside or a silent
misreading ("no" read as true, a typo of a role read as the draft)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import native_pipeline

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig
from quickdraft.errors import ConfigError, ModelFilesError, PromptError, QuickdraftError, UnknownNameError
from quickdraft.lossless.adjustments import LogitAdjustments
from quickdraft.lossless.sampling import SamplingParams


@pytest.fixture(scope="module")
def native() -> Pipeline:
    return native_pipeline()


CASES: list[tuple[str, Callable[[Pipeline], Any], type[QuickdraftError], str]] = [  # (id, call, error, words)
    ("head path as text", lambda p: p.load_acceptance_head("draft-model", "/nowhere/h.safetensors"),
     ModelFilesError, "no acceptance head at /nowhere/h.safetensors"),
    ("drafter as a list", lambda p: p.generate("w1", GenerationConfig(max_new_tokens=2), drafter=["draft-model"]),
     UnknownNameError, "a drafter is named by text, got ['draft-model']"),
    ("prediction not UTF-8", lambda p: p.generate("w1 w2", GenerationConfig(max_new_tokens=2), prediction="w3 \ud800"),
     PromptError, "the prediction is not UTF-8 text"),
    ("prediction of floats", lambda p: p.generate("w1", GenerationConfig(max_new_tokens=2), prediction=[1.5]),
     PromptError, "the prediction must hold token ids"),
    ("prediction a number", lambda p: p.generate("w1", GenerationConfig(max_new_tokens=2), prediction=5),
     PromptError, "the prediction must be a sequence of token ids"),
    ("chat as text", lambda p: p.encode("w1", chat="no"), PromptError, "chat must be true or false, got 'no'"),
    ("use_saved as text", lambda p: p.calibrate("draft-model", use_saved="no"), ConfigError, "use_saved must be"),
    ("recalibrate as text", lambda p: p.setup_policy("draft-model", GenerationConfig(), recalibrate="no"),
     ConfigError, "recalibrate must be"),
    ("a role's typo", lambda p: p.transformers_model("targte"), ConfigError, "role must be 'target' or 'draft'"),
    ("no setup", lambda p: p.save_learned("draft-model", None), ConfigError, "must be the PolicySetup"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "words"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_wrong_argument_is_an_error_naming_it(
    native: Pipeline, call: Callable[[Pipeline], Any], error: type[QuickdraftError], words: str
) -> None:
    with pytest.raises(error) as raised:
        call(native)
    assert words in str(raised.value)


def test_loading_checks_its_flags_and_names(native_model_dirs: dict[str, Path]) -> None:
    target = native_model_dirs["target"]
    with pytest.raises(ConfigError, match="progress must be true or false"):
        Pipeline.load(target, None, progress="no")
    with pytest.raises(ConfigError, match=r"unknown KV cache dtype \['float16'\]"):
        Pipeline.load(target, None, kv_cache_dtype=["float16"], progress=False)
    alone = Pipeline.load(target, None, progress=False)
    with pytest.raises(ConfigError, match="load one, or pick drafter='suffix'"):
        alone.generate("w1 w2", GenerationConfig(max_new_tokens=2))  # the default drafter needs a draft model


def test_a_context_cap_reaches_both_models_and_every_runtime(native_model_dirs: dict[str, Path]) -> None:
    """``max_context`` caps what the target and the draft hold (their configs declare 512 positions): a request
    past it is refused naming max_new_tokens, the transformers copy keeps it, and a cap past the target's own
    context is refused, since the model was never meant to hold more."""
    target, draft = native_model_dirs["target"], native_model_dirs["draft"]
    capped = Pipeline.load(target, draft, runtime="native", progress=False, max_context=96)
    assert (capped.target.max_context, capped.draft.max_context) == (96, 96)
    prompt = capped.encode("w1 w2 w3")
    config = GenerationConfig(max_new_tokens=96 - len(prompt))
    whole = Pipeline.load(target, draft, runtime="native", progress=False)
    assert capped.generate(prompt, config).token_ids == whole.generate(prompt, config, drafter="none").token_ids
    with pytest.raises(PromptError, match="but the model's context holds 96") as raised:
        capped.generate(prompt, replace(config, max_new_tokens=config.max_new_tokens + 1))
    assert raised.value.setting == "max_new_tokens"
    on_transformers = capped.on_runtime("transformers")
    assert (on_transformers.target.max_context, on_transformers.draft.max_context) == (96, 96)
    with pytest.raises(ConfigError, match="max_context 513 is more than the target's context of 512 positions"):
        Pipeline.load(target, None, runtime="native", progress=False, max_context=513)
    with pytest.raises(ConfigError, match=r"max_context is a number of positions >= 1 \(None: .*\), got 0"):
        Pipeline.load(target, None, progress=False, max_context=0)


def test_a_config_that_is_not_the_weights_is_refused(native_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """The native runtime takes its shapes from the weights: a config.json that says otherwise would make the
    runtime report a hidden size its model does not have (an acceptance head is checked against it), leave layers
    out, or draw tokens past the vocabulary it reports; weights that are not finite are damaged, as in a GGUF file."""
    wrong = shutil.copytree(native_model_dirs["target"], tmp_path / "wrong")
    config = json.loads((wrong / "config.json").read_text())
    width = config["hidden_size"]
    (wrong / "config.json").write_text(json.dumps(config | {"hidden_size": 2 * width}))
    with pytest.raises(ModelFilesError, match=f"says hidden_size {2 * width}, the weights are {width}"):
        Pipeline.load(wrong, None, runtime="native", progress=False)
    layers, vocabulary = config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_key_value_heads"]
    for changed, words in (  # what the weights hold beyond the config would be left out, or drawn past its rows
        ({"num_hidden_layers": layers - 1}, f"says {layers - 1} layers, the weights hold {layers}"),
        (
            {
                "num_key_value_heads": heads * 2,
                "num_attention_heads": config["num_attention_heads"] * 2,
                "head_dim": width // config["num_attention_heads"],
            },  # shapes a first forward failed on
            r"weight model\.layers\.0\.self_attn\.[qk]_proj\.weight is \[\d+, \d+\], but the config's sizes make",
        ),
        ({"vocab_size": vocabulary // 2}, f"says vocab_size {vocabulary // 2}, the embedding has {vocabulary} rows"),
    ):
        (wrong / "config.json").write_text(json.dumps(config | changed))
        with pytest.raises(ModelFilesError, match=words):
            Pipeline.load(wrong, None, runtime="native", progress=False)
    (wrong / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    (weights,) = wrong.glob("*.safetensors")
    tensors = load_file(weights)
    name = next(name for name in tensors if "up_proj" in name)
    tensors[name][0, 0] = float("nan")
    save_file(tensors, weights)
    with pytest.raises(ModelFilesError, match=f"weight {name} holds NaN or infinite values"):
        Pipeline.load(wrong, None, runtime="native", progress=False)


def test_numpy_scalars_are_the_numbers_they_hold() -> None:
    """Counts, ids and seeds read from arrays (``np.int64``, ``np.float32``) are held as Python numbers, whose
    arithmetic does not wrap; a NumPy bool is no count, as a Python bool is none."""
    import numpy as np

    sampling = SamplingParams(temperature=np.float32(0.5), top_k=np.int32(5), seed=np.uint64(2**64 - 1))
    config = GenerationConfig(max_new_tokens=np.int64(5), stop_token_ids=[np.int64(3)], sampling=sampling,
                              adjustments=LogitAdjustments(logit_bias={np.int64(1): np.float32(1.0)}))  # fmt: skip
    assert (config.max_new_tokens, config.stop_token_ids, config.adjustments.logit_bias) == (5, (3,), ((1, 1.0),))
    assert type(config.sampling.seed) is int and config.sampling.seed + 1 == 2**64  # no wrap
    with pytest.raises(ConfigError, match="top_k must be an integer"):
        SamplingParams(top_k=np.bool_(True))
    assert LogitAdjustments(presence_penalty=np.float32(0.5)).presence_penalty == 0.5
    assert GenerationConfig(ignore_eos=np.True_).ignore_eos is True


def test_a_pipelines_end_tokens_are_any_iterable_of_token_ids() -> None:
    """Built directly (not by ``load``): a list, a tuple or a generator of ids works; anything else is an error naming
    the field, not a TypeError at the first request."""
    for ends in ([47], (47,), (token for token in [47]), frozenset({47}), np.array([47]), [np.int64(47)]):
        assert Pipeline(target=None, tokenizer=None, eos_token_ids=ends).eos_token_ids == frozenset({47})  # type: ignore[arg-type]
    for bad in (None, 47, "47", [47, -1], [1.5], [True]):
        with pytest.raises(ConfigError, match="eos_token_ids must be token ids") as refused:
            Pipeline(target=None, tokenizer=None, eos_token_ids=bad)  # type: ignore[arg-type]
        assert refused.value.setting == "eos_token_ids"


def test_a_config_no_model_can_have_is_refused_by_every_runtime(
    native_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The native runtime's refusal of such a config is not left to the transformers runtime, which ran a negative
    RoPE base as garbage tokens and failed a negative layer count with a traceback."""
    wrong = shutil.copytree(native_model_dirs["target"], tmp_path / "wrong")
    config = json.loads((wrong / "config.json").read_text())
    for changed, words in (
        ({"rope_parameters": config["rope_parameters"] | {"rope_theta": -10000.0}}, "RoPE needs a positive base"),
        ({"num_hidden_layers": -1}, "num_hidden_layers is -1: a whole number of at least 1"),
    ):
        (wrong / "config.json").write_text(json.dumps(config | changed))
        with pytest.raises(ModelFilesError, match=f"config.json is no model's config: {words}"):
            Pipeline.load(wrong, None, runtime="auto", progress=False)
    (wrong / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 2**40}))
    with pytest.raises(ModelFilesError, match=r"its context of 1,099,511,627,776 \(max_.*\) needs .* GiB of RoPE"):
        Pipeline.load(wrong, None, runtime="native", progress=False)  # not an allocator's traceback
    with pytest.raises(ModelFilesError, match=r"a context capped at 1,099,511,627,775 positions needs .* GiB of RoPE"):
        Pipeline.load(wrong, None, runtime="native", progress=False, max_context=2**40 - 1)
    capped = Pipeline.load(wrong, None, runtime="native", progress=False, max_context=64)  # what the cap is for
    assert capped.target.max_context == 64
