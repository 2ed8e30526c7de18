"""`quickdraft bench` with one more policy, `goodput-before`: goodput with the step-time record as it was at
`7bcbac6`, before the fixes of `ca951b6`..`d9c86ee` (a running mean, then an exponential moving average with weight
1/16, of plain steps, drafted tokens and readings, with no cap and no minimum of samples; no timed one-token draft
after a drafting step that read a backlog). Its record is its own, shared by its requests as a drafter's is, so
both rules run in one process, question by question, in the same hour:

    .venv/bin/python results/xeon-167/record-ab/ab_bench.py bench --per-category 5 --max-new-tokens 128 \
        --methods baseline,hybrid-suffix+goodput,hybrid-suffix+goodput-before --warmup 1 --out DIR
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from typing import Any

from quickdraft.cli import main
from quickdraft.policies import goodput
from quickdraft.policies.base import POLICIES, PolicyKind, no_argument


@dataclass
class RecordBefore:
    """StepTimeRecord at 7bcbac6: each estimate a running mean over its first `window` samples, then an EMA."""

    plain_step_ms: float | None = None
    draft_token_ms: float | None = None
    reading_scale: float = 1.0
    num_plain_steps: int = 0
    num_drafting_steps: int = 0
    num_readings: int = 0
    window: int = 16

    def draft_token_cost(self, plain_step_ms: float | None) -> float | None:
        return self.draft_token_ms  # kept in ms, not as a share of the plain step

    def add_plain_step(self, elapsed_ms: float) -> None:
        self.num_plain_steps += 1
        self.plain_step_ms = self._average(self.plain_step_ms, elapsed_ms, self.num_plain_steps)

    def add_draft_token_cost(self, per_token_ms: float, plain_step_ms: float) -> None:
        self.num_drafting_steps += 1
        self.draft_token_ms = self._average(self.draft_token_ms, per_token_ms, self.num_drafting_steps)

    def add_reading(self, measured_ms: float, profiled_ms: float) -> None:
        self.num_readings += 1
        scale = min(4.0, max(0.25, measured_ms / profiled_ms))
        self.reading_scale = self._average(self.reading_scale, scale, self.num_readings)

    def _average(self, current: float | None, sample: float, count: int) -> float:
        if current is None or count == 1:
            return sample
        return current + (sample - current) / min(count, self.window)


RECORD = RecordBefore()  # the before-rule's drafter record, across its requests (the bench forgets answers, not times)


class GoodputBefore(goodput.GoodputPolicy):
    def bid(self, state: Any = goodput.UNKNOWN_STATE) -> Any:
        self.timing_due = False  # no timed draft after a reading
        return super().bid(state)


def _before(argument: None, context: Any) -> goodput.GoodputPolicy:
    made = goodput._goodput(argument, context)
    kept = {field.name: getattr(made, field.name) for field in fields(made) if field.init}
    return GoodputBefore(**(kept | {"step_times": RECORD}))


POLICIES.register("goodput-before")(
    PolicyKind(_before, no_argument("goodput-before"), needs_cost_model=True, learns_answers=True)
)
if __name__ == "__main__":
    code = main(sys.argv[1:])
    print("goodput-before's record:", RECORD, file=sys.stderr)
    sys.exit(code)
