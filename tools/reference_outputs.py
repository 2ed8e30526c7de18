"""Every drafter × policy on the real pair, greedy and seeded, through ``generate`` (one request at a time) and
through a serving engine (every request of a sampling mode submitted together, as a busy server runs them): the
token ids of each, as JSON. Run before and after a change and compare the files (``--compare``): a change that
keeps quickdraft lossless leaves every answer as it was.

    python tools/reference_outputs.py --out /tmp/before.json
    python tools/reference_outputs.py --out /tmp/after.json --compare /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import DRAFTERS
from quickdraft.engine import Request, RequestFinished, SchedulerSettings
from quickdraft.errors import QuickdraftError
from quickdraft.server.setup import serving_engine

POLICIES = ["goodput", "fixed:3", "heuristic", "confidence:0.4", "specdec++"]
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.7, top_p=0.95, seed=7)}
PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Explain in three sentences what a hash map is and when to use one.",
]


def combinations(pipeline: Pipeline) -> list[tuple[str, str]]:
    """(drafter, policy) pairs these models run; plain decoding first."""
    pairs = [("none", "fixed:0")]
    for drafter in DRAFTERS.names():
        if drafter == "none":
            continue
        for policy in POLICIES:
            config = GenerationConfig(policy=policy)
            try:
                pipeline.drafter(drafter)
                pipeline.setup_policy(drafter, config)
            except QuickdraftError as error:
                print(f"skipped {drafter} × {policy}: {error}", file=sys.stderr)
                continue
            pairs.append((drafter, policy))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path, help="a file written before: report every answer that differs")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()

    pipeline = Pipeline.load()
    pairs = combinations(pipeline)
    prompts = [pipeline.encode(prompt, chat=True) for prompt in PROMPTS]
    outputs: dict[str, list[int]] = {}
    for sampling_name, sampling in SAMPLINGS.items():
        config = {
            policy: GenerationConfig(args.max_new_tokens, sampling=sampling, policy=policy) for _, policy in pairs
        }
        for (drafter, policy), (p, prompt) in ((pair, item) for pair in pairs for item in enumerate(prompts)):
            result = pipeline.generate(prompt, config[policy], drafter)
            outputs[f"generate/{sampling_name}/{drafter}/{policy}/{p}"] = result.token_ids
            print(f"generate {sampling_name} {drafter} {policy} {p}: {result.stats.draft_tokens_accepted}", flush=True)
        engine, _ = serving_engine(pipeline, SchedulerSettings(max_running=4))
        finished: dict[str, list[int]] = {}
        for (drafter, policy), (p, prompt) in ((pair, item) for pair in pairs for item in enumerate(prompts)):
            key = f"serve/{sampling_name}/{drafter}/{policy}/{p}"
            request = Request(tuple(prompt), config[policy], pipeline.drafter(drafter), request_id=key)

            def sink(event: object, key: str = key, finished: dict[str, list[int]] = finished) -> None:
                if isinstance(event, RequestFinished):
                    finished[key] = event.result.token_ids

            engine.submit(request, sink)
        engine.run_until_idle()
        outputs.update(finished)
        print(f"serve {sampling_name}: {len(finished)} answers", flush=True)
    args.out.write_text(json.dumps(outputs, indent=0))
    plain_differs = [
        key
        for key, tokens in outputs.items()
        if tokens != outputs[f"generate/{key.split('/')[1]}/none/fixed:0/{key[-1]}"]
    ]
    print(f"{len(outputs)} answers; differing from plain decoding: {plain_differs or 'none'}")
    if args.compare is not None:
        before = json.loads(args.compare.read_text())
        changed = [key for key in sorted(set(before) | set(outputs)) if before.get(key) != outputs.get(key)]
        print(f"against {args.compare}: {len(changed)} of {len(before)} differ {changed}")
        sys.exit(1 if changed or plain_differs else 0)


if __name__ == "__main__":
    main()
