"""Reading a prompt in one pass through the layers against passes of ``DecoderConfig.rows_per_pass`` rows (the
default since 149ad50), on the default pair: wall time, CPU time and page faults per prompt.

    .venv/bin/python tools/prefill_passes.py [--lengths 512,1024,2048] [--models target,draft] [--pairs 3]
        [--reads 3] [--out FILE.json]

Each measurement is a fresh process (the allocator's state is what a new CLI call or server meets), the two ways
taking turns pair by pair; a process reads a random prompt of the length ``--reads`` times into an empty cache
after a 16-token warm-up and reports the mean per read. Compare the ways within a pair: the VMs' speed moves.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def measure(model: str, way: str, length: int, reads: int) -> dict[str, float]:
    """In this process: ``reads`` prompt reads of ``length`` tokens, in one pass (way ``one``) or in passes."""
    import torch

    from quickdraft.api import Pipeline
    from quickdraft.runtime.native import config

    pipeline = Pipeline.load(progress=False)
    runtime = pipeline.target if model == "target" else pipeline.draft
    if way == "one":
        config.PASS_ACTIVATION_BYTES = 2**62  # every prompt in one pass, as before passes
    token_ids = torch.randint(0, 40000, (1, length), generator=torch.Generator().manual_seed(length))
    runtime.forward(token_ids[:, :16], runtime.new_cache())
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(reads):
        runtime.forward(token_ids, runtime.new_cache(), last_only=True)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
    return {
        "wall_s": wall / reads,
        "user_s": (after.ru_utime - before.ru_utime) / reads,
        "sys_s": (after.ru_stime - before.ru_stime) / reads,
        "minor_faults": (after.ru_minflt - before.ru_minflt) / reads,
        "rows_per_pass": min(length, runtime.decoder.config.rows_per_pass) if way == "passes" else length,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,1024,2048", help="prompt lengths (default 512,1024,2048)")
    parser.add_argument("--models", default="target,draft", help="target, draft or both (default both)")
    parser.add_argument("--pairs", type=int, default=3, help="fresh-process pairs per model and length (default 3)")
    parser.add_argument("--reads", type=int, default=3, help="prompt reads per process (default 3)")
    parser.add_argument("--out", type=Path, help="also write the measurements here as JSON")
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "WAY", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, way, length = args.child
        print(json.dumps(measure(model, way, int(length), args.reads)))
        return
    rows = []
    print(
        f"{'model':<7} {'tokens':>6} {'pair':>4} {'way':<7} {'rows/pass':>9} {'wall s':>7} {'user s':>7} "
        f"{'sys s':>6} {'faults':>9} {'tokens/s':>8}"
    )
    for model in args.models.split(","):
        for length in (int(text) for text in args.lengths.split(",")):
            for pair in range(args.pairs):
                for way in ("one", "passes") if pair % 2 == 0 else ("passes", "one"):
                    command = [sys.executable, __file__, "--reads", str(args.reads), "--child", model, way, str(length)]
                    result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
                    rows.append({"model": model, "tokens": length, "pair": pair, "way": way, **result})
                    print(
                        f"{model:<7} {length:>6} {pair:>4} {way:<7} {result['rows_per_pass']:>9} "
                        f"{result['wall_s']:>7.2f} {result['user_s']:>7.2f} {result['sys_s']:>6.2f} "
                        f"{result['minor_faults']:>9.0f} {length / result['wall_s']:>8.1f}",
                        flush=True,
                    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
