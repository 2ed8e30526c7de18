"""Seeded T=0.7 decoding speed of one code version: plain and speculative, a few Spec-Bench prompts."""
import json, sys, time
import torch
from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams
out = {}
p = Pipeline.load()
qs = sample_questions(load_questions(default_questions_path()), 1, 0)[:6]
prompts = [p.encode(q.turns[0], chat=True) for q in qs]
methods = {"plain": ("none", "fixed:0"), "dm4": ("draft-model", "fixed:4"), "default": ("hybrid", "goodput")}
modes = {"seeded": SamplingParams(temperature=0.7, seed=1), "greedy": SamplingParams()}
for mode, sp in modes.items():
    for name, (drafter, policy) in methods.items():
        p.generate(prompts[0], GenerationConfig(max_new_tokens=8, sampling=sp, policy=policy), drafter=drafter)
        tokens = secs = 0
        texts = []
        for pr in prompts:
            r = p.generate(pr, GenerationConfig(max_new_tokens=96, sampling=sp, policy=policy), drafter=drafter)
            tokens += r.stats.new_tokens; secs += r.stats.wall_time_s; texts.append(r.token_ids)
        out[f"{mode} {name}"] = {"tok_s": tokens / secs, "texts": texts}
        print(mode, name, round(tokens / secs, 2), flush=True)
for mode in modes:
    same = all(out[f"{mode} {n}"]["texts"] == out[f"{mode} plain"]["texts"] for n in methods)
    print(mode, "same text as plain:", same)
json.dump({k: v["tok_s"] for k, v in out.items()} | {"texts": {k: v["texts"] for k, v in out.items()}}, open(sys.argv[1], "w"))
