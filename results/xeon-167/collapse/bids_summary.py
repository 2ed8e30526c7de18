"""A summary of a `bench_bids.py` trace: per answer of the default, its bids by what they drafted (plain, copies, the
draft model) and the drafted-token cost it priced them at (median over the answer's bids, ms); then the drafted-token
samples the run timed (before the record cut any to a plain step): how many, their median and mean.

    python results/xeon-167/collapse/bids_summary.py bids.jsonl[.gz]
"""

from __future__ import annotations

import collections
import gzip
import json
import statistics
import sys


def main() -> None:
    path = sys.argv[1]
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    bids: dict[str, list[dict]] = collections.defaultdict(list)
    samples = []
    for row in rows:
        if "draft_token_sample" in row:
            samples.append(row["draft_token_sample"])
        elif "gamma" in row:
            bids[row["q"]].append(row)
    for question, answer in bids.items():
        kinds = collections.Counter("plain" if b["gamma"] == 0 else b["source"] for b in answer)
        priced = statistics.median(b["draft_ms"] for b in answer)
        plain = statistics.median(b["t1"] for b in answer)
        print(f"{question}: bids {dict(kinds)}, a drafted token priced {priced:.1f} ms, a plain step {plain:.1f} ms")
    if samples:
        mean, median = statistics.mean(samples), statistics.median(samples)
        print(f"drafted-token samples: {len(samples)}, median {median:.1f} ms, mean {mean:.1f} ms")


if __name__ == "__main__":
    main()
