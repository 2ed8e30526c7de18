"""How many answers two bench runs share token for token, per method: same_tokens.py RUN_A RUN_B (bench --out dirs)."""

import json
import sys
from pathlib import Path


def answers(run: Path) -> dict[tuple[str, str, int], list[int]]:
    rows = (json.loads(line) for line in (run / "entries.jsonl").read_text().splitlines())
    return {(row["method"], row["question_id"], row["run"]): row["token_ids"] for row in rows}


first, second = (answers(Path(run)) for run in sys.argv[1:3])
for method in sorted({key[0] for key in first}):
    shared = [key for key in first if key[0] == method and key in second]
    print(f"{method}: {sum(first[key] == second[key] for key in shared)}/{len(shared)} the same tokens")
