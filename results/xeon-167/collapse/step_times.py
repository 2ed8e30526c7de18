"""The drafted-token cost goodput had learned by the end of each committed run of the default (`step_times.json`,
the engine's measured steps) against the draft model's profiled 1-token forward (`cost_curves.json`), with the
plain step and the step counts:

    python results/xeon-167/collapse/step_times.py
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).parents[2]


def main() -> None:
    print("run  learned draft-token ms / profiled draft k=1 ms = ratio  plain step ms  plain steps  drafting steps")
    for path in sorted(RESULTS.glob("**/step_times.json")):
        learned = json.loads(path.read_text()).get("hybrid-suffix")
        curves = path.parent / "cost_curves.json"
        if not learned or learned.get("draft_token_ms") is None or not curves.exists():
            continue
        profiled = json.loads(curves.read_text())["draft"]["1"]
        ratio = learned["draft_token_ms"] / profiled
        print(
            f"{path.parent.relative_to(RESULTS)}  {learned['draft_token_ms']:.1f} / {profiled:.1f} = {ratio:.2f}"
            f"  {learned['plain_step_ms']:.1f}  {learned['num_plain_steps']}  {learned['num_drafting_steps']}"
        )


if __name__ == "__main__":
    main()
