"""Do two bench runs on different machines give the same tokens? For each method both runs measured, how many
questions' tokens are identical. A probe on recorded runs (its output for these runs: cross_machine.txt).

    python results/zen5-26/cross_machine.py RUN_DIR OTHER_RUN_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def tokens(run: Path) -> dict[tuple[str, str, int], list[int]]:
    """(method, question, run) -> the tokens it generated."""
    entries = (json.loads(line) for line in (run / "entries.jsonl").read_text().splitlines())
    return {(e["method"], e["question_id"], e["run"]): e["token_ids"] for e in entries}


def main() -> None:
    first, second = (tokens(Path(arg)) for arg in sys.argv[1:3])
    for method in sorted({key[0] for key in first if key in second}):
        shared = [key for key in first if key[0] == method and key in second]
        same = sum(first[key] == second[key] for key in shared)
        print(f"{method}: {same} of {len(shared)} questions' tokens identical")


if __name__ == "__main__":
    main()
