"""Math questions on which the default stopped drafting: a scan of every committed bench's entries.

A math_reasoning answer of the default (`hybrid-suffix+goodput`) counts as collapsed when more than half of its
steps were plain (γ = 0) and fewer than 60 % of its drafted tokens were accepted. Read teacher-forced, the draft
model's greedy token is the target's on 84-94 % of these answers' tokens, so such an answer ran mostly without it.
Prints, per entries.jsonl under results/ that has the default, its math answers, the collapsed ones and the commit.

    python results/xeon-167/collapse/scan.py
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

RESULTS = Path(__file__).parents[2]
DEFAULT = "hybrid-suffix+goodput"  # the default method's name in the reports


def collapsed(entry: dict) -> bool:
    plain_share = collections.Counter(entry["gammas"])[0] / max(1, len(entry["gammas"]))
    proposed = entry["draft_tokens_proposed"] or 0  # an answer that drafted nothing has no acceptance to judge
    return proposed > 0 and plain_share > 0.5 and entry["draft_tokens_accepted"] / proposed < 0.6


def main() -> None:
    for path in sorted(RESULTS.glob("**/entries.jsonl")):
        entries = [json.loads(line) for line in path.open()]
        math = [e for e in entries if e.get("category") == "math_reasoning" and e["method"] == DEFAULT]
        if math:
            bad = [e["question_id"] for e in math if collapsed(e)]
            where = path.parent.relative_to(RESULTS)
            print(f"{where}: {len(math)} math answers, collapsed {bad} at {math[0]['revision']}")


if __name__ == "__main__":
    main()
