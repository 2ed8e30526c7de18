"""Mean and min of each k's milliseconds over the profile runs of each version: python3 summary.py DIR."""

import glob
import json
import statistics
import sys

curves: dict[str, list[dict[str, float]]] = {}
for name in glob.glob(sys.argv[1] + "/prof-*.json"):
    try:
        with open(name) as file:
            report = json.load(file)
    except ValueError:
        continue
    curves.setdefault(name.split("/")[-1].split("-")[1], []).append(report["t_ms"])
for version, runs in sorted(curves.items()):
    ks = sorted(runs[0], key=int)
    cells = [f"t{k}={statistics.mean(r[k] for r in runs):.1f}(min {min(r[k] for r in runs):.1f})" for k in ks]
    print(version, len(runs), " ".join(cells))
