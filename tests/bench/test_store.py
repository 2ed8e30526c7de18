"""A results folder keeps one configuration: runs with another are refused, never mixed in; a run that fails before
measuring leaves no record; and what a report covers is what was asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quickdraft.bench.metrics import Entry
from quickdraft.bench.questions import Question
from quickdraft.bench.store import ResultStore, model_name, questions_digest
from quickdraft.errors import ConfigError

QUESTIONS = [Question("1", "qa", ("w1 w2",)), Question("2", "rag", ("w3",))]
CONFIG = {
    "questions": "/q.jsonl", "question_ids": ["1", "2"], "questions_sha256": questions_digest(QUESTIONS),
    "max_new_tokens": 8, "target": "/models/t", "draft": None, "draft_load": None, "runtime": "auto", "device": "auto",
    "greedy": True, "temperature": 0.0, "sampling_seed": None, "warmup": 1, "profile_context": 512,
    "kv_cache": "float16",
}  # fmt: skip
MACHINE = {"cpu": "AMD EPYC", "cpu_family_model": "26/2", "isa": "avx512-vnni", "threads": 2, "torch": "2.13.0",
           "transformers": "5.24.0", "llama_cpp_python": None}  # fmt: skip


def entry(method: str, question_id: str, run: int) -> Entry:
    return Entry(method, question_id, "qa", run, 2, 0.1, [1, 2], [1, 1], [0.05, 0.05])


def test_a_folder_keeps_one_configuration(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "out", CONFIG)
    store.add(entry("baseline", "1", 0))
    for change in (
        {"greedy": False, "temperature": 0.7},
        {"questions_sha256": questions_digest([Question("1", "qa", ("edited",)), QUESTIONS[1]])},
        {"profile_context": 16},
        {"warmup": 0},
        {"device": "cuda"},
        {"target": "/models/other"},
        {"kv_cache": "float32"},
        {"max_context": 4096},  # a cap, where the folder measured the whole context (config.json without the key)
    ):
        with pytest.raises(ConfigError, match=f"different {', '.join(change)}"):
            ResultStore(tmp_path / "out", CONFIG | change)
    with pytest.raises(ConfigError, match=r"different question_ids \(the sample: --questions, --per-category"):
        ResultStore(tmp_path / "out", CONFIG | {"question_ids": ["1"]})
    with_draft = CONFIG | {"draft": "/models/d", "draft_load": {"weights": "q4", "vocabulary": 0}}
    ResultStore(tmp_path / "out", with_draft)  # a method with a draft model joins a folder that measured none
    newer = ("questions_sha256", "warmup", "device", "kv_cache")
    older = {key: value for key, value in CONFIG.items() if key not in newer}
    (tmp_path / "older").mkdir()
    (tmp_path / "older" / "config.json").write_text(json.dumps(older))
    with pytest.raises(ConfigError, match="different kv_cache"):  # a folder from before float16 caches
        ResultStore(tmp_path / "older", CONFIG)
    ResultStore(tmp_path / "older", CONFIG | {"kv_cache": "float32"})  # and before those keys: nothing to compare


def test_no_record_before_anything_is_measured_and_no_foreign_folder(tmp_path: Path) -> None:
    ResultStore(tmp_path / "new", CONFIG).use_machine(MACHINE)  # e.g. a run that failed loading its models
    assert not list((tmp_path / "new").iterdir())
    ResultStore(tmp_path / "new", CONFIG | {"max_new_tokens": 16})  # so the corrected run is not refused
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "report.md").write_text("my notes")
    with pytest.raises(ConfigError, match=r"no config\.json: not a bench's results folder"):
        ResultStore(tmp_path / "mine", CONFIG)
    assert (tmp_path / "mine" / "report.md").read_text() == "my notes"


def test_a_resume_on_another_machine_is_refused(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "out", CONFIG)
    store.use_machine(MACHINE)
    store.add(entry("baseline", "1", 0))  # the machine is recorded with the first thing measured
    assert json.loads((tmp_path / "out" / "machine.json").read_text()) == MACHINE
    again = ResultStore(tmp_path / "out", CONFIG)
    again.use_machine(MACHINE | {"platform": "another kernel"})  # not what the entries' speed depends on
    with pytest.raises(ConfigError, match=r"with threads 2 \(now 1\), torch '2.13.0' \(now '2.14.0'\)"):
        again.use_machine(MACHINE | {"threads": 1, "torch": "2.14.0"})


def test_entries_are_those_of_the_runs_asked_for(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "out", CONFIG)
    for run in range(3):
        store.add(entry("baseline", "1", run))
    assert [e.run for e in store.entries_for(["baseline"], ["1"], 1)] == [0]
    assert len(store.entries_for(["baseline"], ["1", "2"], 3)) == 3


def test_models_are_recorded_by_name_or_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert model_name("qwen2.5-coder-1.5b-instruct") == "qwen2.5-coder-1.5b-instruct"
    assert model_name("models/target") == str(tmp_path / "models" / "target")
