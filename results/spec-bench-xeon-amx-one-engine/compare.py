"""After ÷ before per question (tokens/s averaged over each version's runs), per method: mean, 95 % bootstrap."""

import json
import random
import statistics
import sys
from collections import defaultdict


def per_question(path):
    runs = defaultdict(lambda: defaultdict(list))  # method -> question -> [tok/s per run]
    with open(path) as file:
        for line in file:
            entry = json.loads(line)
            runs[entry["method"]][entry["question_id"]].append(entry["new_tokens"] / entry["wall_time_s"])
    return {method: {q: statistics.mean(v) for q, v in qs.items()} for method, qs in runs.items()}


before, after = per_question(sys.argv[1]), per_question(sys.argv[2])
rng = random.Random(0)
for method in after:
    questions = sorted(set(before[method]) & set(after[method]))
    ratios = [after[method][q] / before[method][q] for q in questions]
    boot = sorted(statistics.mean(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    print(
        f"{method:16} after/before {statistics.mean(ratios):.3f} (95% {boot[50]:.3f}-{boot[1949]:.3f}) "
        f"over {len(questions)} questions; tok/s {statistics.mean(before[method].values()):.2f} -> "
        f"{statistics.mean(after[method].values()):.2f}"
    )
