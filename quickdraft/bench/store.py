"""A bench's results folder: what its entries were measured with (config.json, machine.json), the entries
(entries.jsonl, appended one by one, so a stopped run resumes) and the cost curves. A folder's entries share one
configuration: a run with another is refused, never mixed in."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from quickdraft.bench.metrics import Entry
from quickdraft.bench.questions import Question
from quickdraft.errors import ConfigError
from quickdraft.models.catalog import KNOWN_MODELS

FINGERPRINT_KEYS = (  # what entries are measured with: a folder's entries all share these
    "questions", "question_ids", "questions_sha256", "max_new_tokens", "target", "draft", "draft_load", "runtime",
    "device", "greedy", "temperature", "sampling_seed", "warmup", "profile_context", "kv_cache", "max_context",
)  # fmt: skip
NEWER_KEYS = ("questions_sha256", "device", "warmup", "profile_context")  # not compared where a folder lacks them
MACHINE_KEYS = ("cpu", "cpu_family_model", "isa", "threads", "torch", "transformers", "llama_cpp_python")
LEGACY_SAMPLING = {"greedy": True, "temperature": 0.0, "sampling_seed": None}  # folders from before sampled benches
LEGACY_DRAFT_LOAD = {"weights": "int8", "vocabulary": 0}  # what results folders from before draft_load measured
LEGACY_KV_CACHE = {"kv_cache": "float32"}  # folders from before float16 caches
BENCH_FILES = ("config.json", "entries.jsonl")  # what marks a folder as a bench's results


class ResultStore:
    """OUT/: config.json (what the entries were measured with), entries.jsonl, machine.json, cost_curves.json.

    A folder's entries share :data:`FINGERPRINT_KEYS`: a run with other values is refused, never mixed in (a greedy
    resume of a sampled run, say). ``keep_config``: a report of what is there, which leaves config.json as it is."""

    def __init__(self, out: Path, config: dict[str, Any], keep_config: bool = False) -> None:
        self.out = out
        self.config = config
        out.mkdir(parents=True, exist_ok=True)
        saved = self._read_json("config.json")
        if saved is None and any(out.iterdir()):
            raise ConfigError(
                f"--out {out} holds files but no config.json: not a bench's results folder (or one whose settings "
                "are lost); give an empty or new directory"
            )
        if saved is not None:
            saved.setdefault("draft_load", LEGACY_DRAFT_LOAD if saved.get("draft") else None)
            saved = LEGACY_SAMPLING | LEGACY_KV_CACHE | saved
            different = [key for key in FINGERPRINT_KEYS if self._differs(saved, key)]
            if different:
                flags = "--questions, --per-category, --question-seed, --categories"
                sample = f" (the sample: {flags})" if "question_ids" in different else ""
                raise ConfigError(
                    f"--out {out} holds results measured with a different {', '.join(different)}{sample}; give the "
                    f"settings it was measured with (its config.json) to resume or report it, or another --out "
                    f"directory to start afresh"
                )
        self._config_written = saved is not None and keep_config  # written with the first thing measured
        self.entries: dict[tuple[str, str, int], Entry] = {}
        self._read_entries()
        self.machine: dict[str, Any] | None = self._read_json("machine.json")
        self.cost_curves: dict[str, dict[str, float]] | None = self._read_json("cost_curves.json")

    def _differs(self, saved: dict[str, Any], key: str) -> bool:
        if key in NEWER_KEYS and key not in saved:
            return False  # a folder from before the key: nothing to compare
        if key in ("draft", "draft_load") and None in (saved.get("draft"), self.config.get("draft")):
            return False  # one side measured no draft model: methods that use one may come and go
        return saved.get(key) != self.config.get(key)

    def add(self, entry: Entry) -> None:
        self.write_config()
        self.entries[entry.key] = entry
        with open(self.out / "entries.jsonl", "a", encoding="utf-8") as file:
            file.write(json.dumps(entry.to_dict()) + "\n")
            file.flush()
            os.fsync(file.fileno())

    def entries_for(self, methods: list[str], question_ids: list[str], runs: int) -> list[Entry]:
        """The entries of these methods and questions in runs 0 .. ``runs`` - 1 (a report of fewer runs than the
        folder holds reports those runs only)."""
        wanted_methods, wanted_questions = set(methods), set(question_ids)
        return [
            e
            for e in self.entries.values()
            if e.method in wanted_methods and e.question_id in wanted_questions and e.run < runs
        ]

    def use_machine(self, current: dict[str, Any]) -> None:
        """Measure on ``current`` (``machine_info()``): the folder's machine.json, or a refusal where the entries
        were measured on another CPU, thread count or library version."""
        changed = [key for key in MACHINE_KEYS if self.machine is not None and self.machine.get(key) != current[key]]
        if changed:
            assert self.machine is not None
            was = ", ".join(f"{key} {self.machine.get(key)!r} (now {current[key]!r})" for key in changed)
            raise ConfigError(
                f"--out {self.out} was measured with {was} (machine.json); resume it where it was measured, or use "
                "another --out directory"
            )
        self.machine = self.machine or current  # written with config.json

    def write_config(self) -> None:
        """config.json and machine.json, once, before the first thing measured is written (a run that fails first
        leaves neither, so the same folder takes a corrected run)."""
        if not self._config_written:
            self._config_written = True
            self.write_json("config.json", self.config)
            if self.machine is not None:
                self.write_json("machine.json", self.machine)

    def write_json(self, name: str, data: Any) -> None:
        if name not in ("config.json", "machine.json"):
            self.write_config()
        (self.out / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    def _read_json(self, name: str) -> Any:
        path = self.out / name
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise ConfigError(f"--out {self.out}: {name} is corrupt; use another --out directory") from None

    def _read_entries(self) -> None:
        path = self.out / "entries.jsonl"
        if not path.is_file():
            return
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            try:
                entry = Entry.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError):
                if number < len(lines):
                    raise ConfigError(f"--out {self.out}: line {number} of entries.jsonl is corrupt") from None
                # a run killed while writing its last entry: drop the fragment, measure that entry again
                path.write_text("".join(f"{kept}\n" for kept in lines[:-1]), encoding="utf-8")
                break
            self.entries[entry.key] = entry


def model_name(spec: str) -> str:
    """How a folder records a model: a packaged name as it is, a path made absolute (the same relative path from
    another directory may be another model)."""
    if spec in KNOWN_MODELS or spec.startswith("hf:"):
        return spec
    return str(Path(spec).expanduser().resolve())


def questions_digest(questions: list[Question]) -> str:
    """sha256 of the sample's ids, categories and turns: an edited question file is another sample."""
    rows = [[question.question_id, question.category, list(question.turns)] for question in questions]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()
