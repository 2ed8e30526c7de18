"""How the draft head's held-out agreement grows with training data (issue 30): the default recipe
(TrainSettings(): lr 1e-3, 1,024-position batches, unroll 2, 2.5 passes) on the first N training shards,
always evaluated on shard 7 (held out from every run, as in train_more.py). Usage:

    python learning_curve.py N OUT.safetensors   # appends one JSON line to learning_curve.jsonl
"""

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.draft_head.data import FeatureData
from quickdraft.draft_head.file import save_head
from quickdraft.draft_head.train import TrainSettings, build_head, choose_vocabulary, train_head

HELD_OUT = 7
num_shards, out = int(sys.argv[1]), Path(sys.argv[2])
p = Pipeline.load("qwen2.5-coder-1.5b-instruct", None, "native", progress=False)
data = FeatureData(Path("/work/draft-data/qwen-1.5b"))
s = TrainSettings()
shards = [i for i in sorted(data.shards) if i != HELD_OUT][:num_shards]
train = [c for c in data.conversations if c.shard in shards]
held = [c for c in data.conversations if c.shard == HELD_OUT]
voc, cov = choose_vocabulary(data, shards, s.vocabulary_size, p.target.vocab_size)
E = p.target.token_embeddings()
h = build_head(data, p.target.decoder.config, p.target.lm_head_rows, voc, s)
started = time.perf_counter()
history = train_head(h, data, train, held, E, s, out.with_name(f".{out.stem}.checkpoint"), on_eval=print)
minutes = (time.perf_counter() - started) / 60
positions = sum(c.length for c in train)
answers = sum(c.length - c.answer_start for c in train)
sha = save_head(
    h,
    out,
    (2, 14, 25),
    "qwen2.5-coder-1.5b-instruct",
    {
        "train_settings": asdict(s),
        "history": history,
        "vocabulary_coverage": cov,
        "train_tokens": positions,
        "train_shards": shards,
    },
)
row = {
    "train_shards": shards,
    "conversations": len(train),
    "positions": positions,
    "answer_positions": answers,
    "minutes": round(minutes, 1),
    "held_out": history[-1]["eval"],
    "head": str(out),
    "sha256": sha,
}
with open(Path(__file__).with_name("learning_curve.jsonl"), "a") as file:
    file.write(json.dumps(row) + "\n")
print(json.dumps(row), flush=True)
