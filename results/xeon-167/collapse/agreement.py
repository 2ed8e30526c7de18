"""Teacher-forced agreement on answers from a bench run: each model reads prompt and answer in one forward, and the
share of answer tokens that are its greedy token there, with this checkout's kernels and with those of the checkout
at $BEFORE (one loaded pipeline, its compiled layers built from either kernel module):

    cd /tmp && BEFORE=/path/to/old/checkout python results/xeon-167/collapse/agreement.py ENTRIES.jsonl 478,419
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import torch

import quickdraft.runtime.native.model as model_module
from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.runtime.native.kernels import native_kernels


def main() -> None:
    path = os.environ["BEFORE"] + "/quickdraft/runtime/native/kernels.py"
    spec = importlib.util.spec_from_file_location("before", path)
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    kernels = {"before": before.native_kernels(), "this": native_kernels()}
    pipeline = Pipeline.load()
    decoders = [runtime.decoder for runtime in (pipeline.target, pipeline.draft)]
    with open(sys.argv[1]) as lines:
        entries = [json.loads(line) for line in lines]
    answers = {e["question_id"]: e["token_ids"] for e in entries if e["method"] == "baseline"}
    questions = {q.question_id: q for q in sample_questions(load_questions(default_questions_path()), 5, 0)}
    for question_id in sys.argv[2].split(","):
        prompt = torch.tensor(pipeline.encode(questions[question_id].turns[0], chat=True)).reshape(1, -1)
        answer = torch.tensor(answers[question_id]).reshape(1, -1)
        ids = torch.cat([prompt, answer], dim=1)
        row = [f"{question_id}: prompt {prompt.shape[1]}, answer {answer.shape[1]} tokens"]
        for name, module in kernels.items():
            model_module.native_kernels = lambda module=module: module
            for decoder in decoders:
                decoder._layers_spec = None  # rebuilt from the kernels now in place
            for label, runtime in (("draft", pipeline.draft), ("target", pipeline.target)):
                logits = runtime.forward(ids, runtime.new_cache(1), last_only=False).reshape(ids.shape[1], -1)
                predicted = logits[prompt.shape[1] - 1 : -1].argmax(-1)
                row.append(f"{name} kernels {label} {(predicted == answer[0]).float().mean().item():.3f}")
        print(", ".join(row), flush=True)


if __name__ == "__main__":
    main()
