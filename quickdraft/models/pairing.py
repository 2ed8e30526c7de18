"""Which draft models may draft for a target, and ``--draft auto``: picking one among the models at hand.

Speculation compares token ids, so a draft must mean by each id what the target means. The rule is llama.cpp's
(``common_speculative_are_compatible``): vocabularies within :data:`MAX_SIZE_DIFFERENCE` tokens of each other, the
same beginning- and end-of-sequence tokens, and the same text for every id from :data:`FIRST_CHECKED_ID` up
to the smaller size (the first ids are control tokens families renumber freely). An id one vocabulary has and the
other lacks is never accepted: the draft model's proposals are mapped onto the target's width
(``drafters.draft_model.to_vocab``), so a pair that passes this rule stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quickdraft.errors import ModelFilesError, TokenizerMismatchError
from quickdraft.files import cache_root
from quickdraft.models.catalog import KNOWN_MODELS
from quickdraft.models.convert import gguf_source

MAX_SIZE_DIFFERENCE = 128
FIRST_CHECKED_ID = 5
AUTO = "auto"  # --draft auto
MAX_DRAFT_SHARE = 0.5  # --draft auto takes drafts at most this share of the target's size


def vocabulary_mismatch(target_tokenizer: Any, draft_tokenizer: Any) -> str | None:
    """Why ``draft_tokenizer`` cannot draft for ``target_tokenizer`` by llama.cpp's rule, or None when it can (as
    a tokenizer always can for itself)."""
    if draft_tokenizer is target_tokenizer:
        return None
    target_size, draft_size = len(target_tokenizer), len(draft_tokenizer)
    if abs(target_size - draft_size) > MAX_SIZE_DIFFERENCE:
        return (
            f"their vocabularies differ in size by more than {MAX_SIZE_DIFFERENCE}: {draft_size} tokens in the draft, "
            f"{target_size} in the target"
        )
    for name in ("bos_token_id", "eos_token_id"):
        target_id, draft_id = getattr(target_tokenizer, name), getattr(draft_tokenizer, name)
        if target_id != draft_id:
            kind = "beginning" if name.startswith("bos") else "end"
            return f"their {kind}-of-sequence tokens differ: {draft_id} in the draft, {target_id} in the target"
    ids = list(range(FIRST_CHECKED_ID, min(target_size, draft_size)))
    target_texts = target_tokenizer.convert_ids_to_tokens(ids)
    draft_texts = draft_tokenizer.convert_ids_to_tokens(ids)
    differing = [(i, a, b) for i, a, b in zip(ids, target_texts, draft_texts, strict=True) if a != b]
    if differing:
        first, target_text, draft_text = differing[0]
        return (
            f"{len(differing)} token ids mean different text, e.g. id {first}: {draft_text!r} in the draft, "
            f"{target_text!r} in the target"
        )
    return None


def check_same_tokenizer(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Raise ``TokenizerMismatchError`` saying why, when the draft cannot draft for the target."""
    reason = vocabulary_mismatch(target_tokenizer, draft_tokenizer)
    if reason is not None:
        raise TokenizerMismatchError(
            f"the draft model cannot draft for the target: {reason}; pick a draft model from the target's family"
        )


@dataclass(frozen=True)
class Candidate:
    """A model at hand: what ``--draft`` would take to name it, the size of its weights and the directory it
    resolves to."""

    spec: str
    size_bytes: int
    directory: Path


def models_at_hand() -> list[Candidate]:
    """Packaged models whose parts are installed or whose file is assembled, and GGUF files resolved before (their
    directories in the cache)."""
    import importlib.util

    found = []
    for model in KNOWN_MODELS.values():
        if model.gguf_path().is_file() or importlib.util.find_spec(f"{model.module}1") is not None:
            found.append(Candidate(model.name, model.size_bytes, model.hf_dir()))
    for directory in sorted((cache_root() / "converted").glob("*/hf")):
        source = gguf_source(directory)
        if source is not None:
            found.append(Candidate(str(source), source.stat().st_size, directory))
    return found


def model_size(path: Path) -> int:
    """The bytes of a resolved model's weights: its GGUF file, else its safetensors files."""
    source = gguf_source(path)
    return source.stat().st_size if source is not None else sum(f.stat().st_size for f in path.glob("*.safetensors"))


def find_draft(target_path: Path, target_tokenizer: Any, progress: bool = True) -> str:
    """``--draft auto``: the largest model at hand that may draft for the target (:func:`vocabulary_mismatch`) and
    is at most :data:`MAX_DRAFT_SHARE` of its size; a ``ModelFilesError`` listing what was considered otherwise."""
    from quickdraft.models.loading import draft_tokenizer_for, resolve_model

    limit = MAX_DRAFT_SHARE * model_size(target_path)
    considered = []
    for candidate in sorted(models_at_hand(), key=lambda c: -c.size_bytes):
        if candidate.directory.resolve() == target_path.resolve():
            continue  # the target itself
        if candidate.size_bytes > limit:
            considered.append(f"{candidate.spec} (too large)")
            continue
        try:
            path = resolve_model(candidate.spec, progress)
        except ModelFilesError as error:
            considered.append(f"{candidate.spec} ({error})")
            continue
        reason = vocabulary_mismatch(target_tokenizer, draft_tokenizer_for(target_path, target_tokenizer, path))
        if reason is None:
            return candidate.spec
        considered.append(f"{candidate.spec} ({reason})")
    raise ModelFilesError(
        f"draft {AUTO!r} found no model at most {MAX_DRAFT_SHARE:.0%} of the target's size that shares its vocabulary "
        f"(considered: {'; '.join(considered) or 'none'}); name a draft model's path, or use a drafter without one "
        f"(prompt-lookup)",
        "draft",
    )
