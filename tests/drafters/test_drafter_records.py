"""A drafter's learned file: what one process learned of answers, kept for the next ones."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest

from quickdraft.drafters import DrafterRecords
from quickdraft.policies import AnswerLength


def learned(path: Path) -> dict:
    return json.loads(path.read_text())


def test_what_was_learned_survives_the_learned_file(tmp_path: Path) -> None:
    path = tmp_path / "drafter.learned.json"
    records = DrafterRecords()
    records.acceptance.add(4, 2)  # first accepted; later: 1 accepted, 1 rejected
    records.answer_lengths.add(12)
    records.answer_lengths.add(40, cut_by_budget=True)
    records.save_learned(path)
    later = DrafterRecords()
    assert later.load_learned(path) == 2
    assert later.acceptance == records.acceptance
    assert list(later.answer_lengths.answers) == [AnswerLength(12, False), AnswerLength(40, True)]


@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"acceptance": {}, "answers": []})])
def test_a_missing_or_unreadable_learned_file_holds_no_answers(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "drafter.learned.json"
    if content is not None:
        path.write_text(content)
    records = DrafterRecords()
    assert records.load_learned(path) == 0
    records.answer_lengths.add(7)
    records.save_learned(path)  # replaces what could not be read
    assert learned(path)["answers"] == [[7, False]]


def test_runs_that_learn_at_the_same_time_both_add_to_the_learned_file(tmp_path: Path) -> None:
    """Two runs read the file, each learns one answer, both write: the second used to drop the first's."""
    path = tmp_path / "drafter.learned.json"
    earlier = DrafterRecords()
    earlier.acceptance.add(1, 1)
    earlier.answer_lengths.add(10)
    earlier.save_learned(path)
    runs = [DrafterRecords(), DrafterRecords()]
    for run in runs:
        assert run.load_learned(path) == 1
    runs[0].acceptance.add(2, 2)  # first accepted, one later accepted
    runs[0].answer_lengths.add(20)
    runs[1].acceptance.add(3, 0)  # first rejected
    runs[1].answer_lengths.add(30, cut_by_budget=True)
    for run in runs:
        run.save_learned(path)
    assert learned(path) == {
        "acceptance": {"first": [2.0, 1.0], "later": [1.0, 0.0]},
        "answers": [[10, False], [20, False], [30, True]],
    }
    runs[0].save_learned(path)  # what it saved already is not added twice
    runs[1].answer_lengths.add(50)
    runs[1].save_learned(path)  # only what it learned since its last save
    assert learned(path)["acceptance"] == {"first": [2.0, 1.0], "later": [1.0, 0.0]}
    assert learned(path)["answers"] == [[10, False], [20, False], [30, True], [50, False]]


def test_a_full_learned_file_keeps_the_newest_answers_of_every_run(tmp_path: Path) -> None:
    path = tmp_path / "drafter.learned.json"
    full = DrafterRecords()
    capacity = full.answer_lengths.capacity
    for num_tokens in range(capacity):
        full.answer_lengths.add(num_tokens)
    full.save_learned(path)
    runs = [DrafterRecords(), DrafterRecords()]
    for num_tokens, run in enumerate(runs, start=1000):
        assert run.load_learned(path) == capacity
        run.answer_lengths.add(num_tokens)  # its record drops the oldest answer, and still holds 256
    for run in runs:
        run.save_learned(path)
    answers = [num_tokens for num_tokens, _ in learned(path)["answers"]]
    assert answers == [*range(2, capacity), 1000, 1001]


def test_learning_afresh_replaces_the_learned_file(tmp_path: Path) -> None:
    """--recalibrate forgets earlier answers: what it learns then is the file's whole content."""
    path = tmp_path / "drafter.learned.json"
    earlier = DrafterRecords()
    earlier.answer_lengths.add(10)
    earlier.save_learned(path)
    records = DrafterRecords()
    records.load_learned(path)
    records.forget_answers()
    records.answer_lengths.add(20)
    records.save_learned(path)
    assert learned(path)["answers"] == [[20, False]]
    records.answer_lengths.add(30)  # from here on it adds to the file it wrote
    records.save_learned(path)
    assert learned(path)["answers"] == [[20, False], [30, False]]


def test_the_learned_file_is_read_and_written_under_its_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "drafter.learned.json"
    lock_states: list[str] = []

    def write_while_checking_the_lock(target: Path, text: str) -> None:
        with open(f"{path}.lock", "a") as other:  # another process's attempt to take the lock
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                lock_states.append("free")
            except BlockingIOError:
                lock_states.append("held")
        target.write_text(text)

    monkeypatch.setattr("quickdraft.drafters.records.write_atomically", write_while_checking_the_lock)
    records = DrafterRecords()
    records.load_learned(path)
    records.answer_lengths.add(5)
    records.save_learned(path)
    assert lock_states == ["held"] and learned(path)["answers"] == [[5, False]]
