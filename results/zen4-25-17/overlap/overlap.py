"""Do the target's steps and the draft model's forwards slow each other when each runs on its own core?

Loads the default pair (native runtime), gives each model 300 cached tokens, and times forwards alone on 2 threads,
alone on 1 thread, and side by side on two Python threads of 1 torch thread each (the native calls release the GIL).
Every forward is rolled back to the 300 tokens, so each timing is at the same context. Medians in ms."""

import statistics
import threading
import time

import torch

from quickdraft.api import Pipeline

CONTEXT = 300
pipeline = Pipeline.load(progress=False)
target, draft = pipeline.target, pipeline.draft
context = torch.randint(100, 20000, (1, CONTEXT))


def cache_of(runtime):
    cache = runtime.new_cache()
    runtime.forward(context, cache)
    return cache


def timed(runtime, cache, count, rows=1, threads=None, out=None, start=None):
    if threads:
        torch.set_num_threads(threads)  # this Python thread's intra-op threads
    if start:
        start.wait()
    times = []
    for _ in range(count):
        began = time.perf_counter()
        runtime.forward(torch.randint(100, 20000, (1, rows)), cache)
        times.append((time.perf_counter() - began) * 1000)
        cache.truncate(CONTEXT)
    if out is not None:
        out.extend(times)
    return times


def median(values):
    return round(statistics.median(values), 2)


target_cache, draft_cache = cache_of(target), cache_of(draft)
for threads in (2, 1):
    torch.set_num_threads(threads)
    print(
        f"alone, {threads} thread(s): target t(1) {median(timed(target, target_cache, 30))}, "
        f"t(5) {median(timed(target, target_cache, 20, 5))}; draft 1 row {median(timed(draft, draft_cache, 40))}, "
        f"128 rows {median(timed(draft, draft_cache, 5, 128))}",
        flush=True,
    )

torch.set_num_threads(2)
for label, draft_rows, draft_count in (("1 row", 1, 150), ("128 rows", 128, 12)):
    for target_rows, target_count in ((1, 40), (5, 20)):
        target_times, draft_times = [], []
        start = threading.Barrier(2)
        target_args = (target, target_cache, target_count, target_rows, 1, target_times, start)
        draft_args = (draft, draft_cache, draft_count, draft_rows, 1, draft_times, start)
        workers = [threading.Thread(target=timed, args=target_args), threading.Thread(target=timed, args=draft_args)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        print(
            f"side by side, 1 thread each: target t({target_rows}) {median(target_times)}, "
            f"draft {label} {median(draft_times)}",
            flush=True,
        )
