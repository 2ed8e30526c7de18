"""After ÷ before per question (tokens/s averaged over each version's runs), per method: mean and 95 % bootstrap interval."""
import json
import random
import statistics
import sys
from collections import defaultdict


def per_question(path):
    runs = defaultdict(lambda: defaultdict(list))  # method -> question -> [tok/s per run]
    for line in open(path):
        e = json.loads(line)
        runs[e["method"]][e["question_id"]].append(e["new_tokens"] / e["wall_time_s"])
    return {m: {q: statistics.mean(v) for q, v in qs.items()} for m, qs in runs.items()}

before, after = per_question(sys.argv[1]), per_question(sys.argv[2])
rng = random.Random(0)
for method in before:
    qs = sorted(set(before[method]) & set(after[method]))
    ratios = [after[method][q] / before[method][q] for q in qs]
    boot = sorted(statistics.mean(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    print(f"{method:16} after/before {statistics.mean(ratios):.3f} (95% {boot[50]:.3f}-{boot[1949]:.3f}) over {len(qs)} questions; "
          f"tok/s {statistics.mean(before[method].values()):.2f} -> {statistics.mean(after[method].values()):.2f}")
