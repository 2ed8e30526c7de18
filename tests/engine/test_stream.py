"""Streams on the caller's thread: several threads on one pipeline, a stream left and read again, a step that
raises. Every answer stays the target's own, or fails with a ``QuickdraftError``; none is silently wrong."""

from __future__ import annotations

import random
import threading
import time

import pytest
from conftest import native_pipeline

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.errors import ConfigError, QuickdraftError

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7], [2, 7, 1, 8]]
CONFIGS = [
    GenerationConfig(max_new_tokens=24, policy="fixed:3"),
    GenerationConfig(max_new_tokens=24, policy="fixed:2", sampling=SamplingParams(temperature=0.9, seed=11)),
]


@pytest.fixture
def native() -> Pipeline:
    return native_pipeline()


def test_threads_on_one_pipeline_get_their_own_answers(native: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread's stream steps the engine in turn; the forwards are delayed at random so the threads interleave
    differently every step."""
    jobs = [
        (prompt, config, drafter) for prompt in PROMPTS for config in CONFIGS for drafter in ("none", "draft-model")
    ]
    alone = [native.generate(prompt, config, drafter).token_ids for prompt, config, drafter in jobs]
    forward_batch, rng = native.target.forward_batch, random.Random(0)
    monkeypatch.setattr(
        native.target, "forward_batch", lambda rows: time.sleep(rng.random() / 500) or forward_batch(rows)
    )
    together: list[list[int] | BaseException | None] = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            together[i] = native.generate(*jobs[i]).token_ids
        except BaseException as error:
            together[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert together == alone and native.engine.idle


def test_a_stream_is_read_once(native: Pipeline) -> None:
    stream = native.stream(PROMPTS[0], CONFIGS[0], "draft-model")
    for _ in stream:
        break  # left before its end: its request is cancelled
    with pytest.raises(ConfigError, match="ended before its result: it was left"):
        stream.finish()
    with pytest.raises(ConfigError, match="already read"):
        list(stream)
    expected = native.generate(PROMPTS[1], CONFIGS[0], "draft-model")
    assert native.engine.idle and not native.engine.scheduler.waiting  # the left request is gone, not queued again
    done = native.stream(PROMPTS[1], CONFIGS[0], "draft-model")
    assert done.finish().token_ids == expected.token_ids and list(done) == [] and done.finish() is done.result


def test_a_stream_read_partway_finishes_from_where_it_stopped(native: Pipeline) -> None:
    """finish() after some deltas, the reading still held, goes on from there: the tokens of the request read whole,
    and the reading is then at its end. Reading the stream again instead cancels the request, as its error says."""
    expected = native.generate(PROMPTS[0], CONFIGS[0], "draft-model")
    stream = native.stream(PROMPTS[0], CONFIGS[0], "draft-model")
    reader = iter(stream)
    first = next(reader)
    result = stream.finish()
    assert result.token_ids == expected.token_ids and result.text.startswith(first) and native.engine.idle
    assert list(reader) == [] and stream.result is result and stream.finish() is result
    again = native.stream(PROMPTS[0], CONFIGS[0], "draft-model")
    held = iter(again)
    next(held)
    with pytest.raises(ConfigError, match="already read"):
        list(again)
    assert native.engine.idle and not native.engine.scheduler.running
    with pytest.raises(ConfigError, match="read again, which cancelled its request"):
        list(held)  # the first reading ended as if the answer were whole
    assert again.result is None


def test_a_stream_read_on_two_threads_at_once_is_refused_on_the_second(
    native: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second reading is refused clearly (it raised "generator already executing"); the first goes on whole."""
    expected = native.generate(PROMPTS[0], CONFIGS[0], "draft-model")
    stream = native.stream(PROMPTS[0], CONFIGS[0], "draft-model")
    reader, started, second = iter(stream), threading.Event(), []

    def read_elsewhere() -> None:
        started.wait(10)
        try:
            list(stream)
        except ConfigError as error:
            second.append(str(error))

    thread = threading.Thread(target=read_elsewhere)
    thread.start()
    forward_batch = native.target.forward_batch

    def slow(rows: object) -> object:  # the first reading is inside a step while the second asks
        started.set()
        time.sleep(0.05)
        return forward_batch(rows)

    monkeypatch.setattr(native.target, "forward_batch", slow)
    text = "".join(reader)
    thread.join(10)
    assert second and "being read on another thread" in second[0], second
    assert text == expected.text and stream.result is not None and stream.result.token_ids == expected.token_ids


def test_a_stream_left_before_its_end_frees_its_caches_at_once(native: Pipeline) -> None:
    """Not at the next step, which a library caller may never take."""
    stream = native.stream(PROMPTS[0], CONFIGS[0], "draft-model")
    for _ in stream:
        break
    assert native.engine.idle and not native.engine.scheduler.running
    assert list(stream._events)[-1].result.finish_reason == "cancelled"


def test_a_step_that_raises_fails_the_other_streams_it_ran(native: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt inside a step leaves the caches of every request it ran half-written: the other stream fails
    with a clear error instead of going on from them, and the engine serves the next requests."""
    expected = native.generate(PROMPTS[2], CONFIGS[0], "draft-model").token_ids
    other = native.stream(PROMPTS[2], CONFIGS[0], "draft-model")
    next(iter_other := iter(other))  # it is running
    forward_batch, calls = native.target.forward_batch, []

    def interrupted(rows):  # type: ignore[no-untyped-def]
        calls.append(len(rows))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return forward_batch(rows)

    monkeypatch.setattr(native.target, "forward_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        native.generate(PROMPTS[3], CONFIGS[0], "draft-model")
    monkeypatch.undo()
    with pytest.raises(QuickdraftError, match="a step failed while this request ran \\(KeyboardInterrupt\\)"):
        list(iter_other)
    assert native.engine.idle and native.generate(PROMPTS[2], CONFIGS[0], "draft-model").token_ids == expected


def test_a_cancel_from_a_finalizer_while_the_scheduler_is_locked_does_not_hang(native: Pipeline) -> None:
    stream = native.stream(PROMPTS[0], CONFIGS[0])
    next(iter(stream))  # the iterator is dropped: its finalizer cancels the request
    with native.engine.scheduler._lock:  # as when a collection runs a finalizer inside a locked section
        native.engine.cancel(stream._state.request.request_id)
    native.engine.run_until_idle()
    assert native.engine.idle
