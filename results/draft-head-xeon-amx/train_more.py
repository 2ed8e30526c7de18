"""A second recipe for the draft head (issue 30): learning rate 1e-3, 1,024-position batches, unroll 2, 2.5
passes over shards 0-6 (shard 7 held out); writes /work/draft-heads/lr1e-3.safetensors and prints each pass's
held-out evaluation."""

import json
from dataclasses import asdict
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.draft_head.data import FeatureData
from quickdraft.draft_head.file import save_head
from quickdraft.draft_head.train import TrainSettings, build_head, choose_vocabulary, train_head

p = Pipeline.load("qwen2.5-coder-1.5b-instruct", None, "native", progress=False)
data = FeatureData(Path("/work/draft-data/qwen-1.5b"))
s = TrainSettings(epochs=2.5, steps=2, tokens_per_batch=1024, learning_rate=1e-3, warmup_batches=20)
train, held = data.split(s.held_out_shards)
voc, cov = choose_vocabulary(data, sorted({c.shard for c in train}), s.vocabulary_size, p.target.vocab_size)
E = p.target.token_embeddings()
h = build_head(data, p.target.decoder.config, p.target.lm_head_rows, voc, s)
out = Path("/work/draft-heads/lr1e-3.safetensors")
history = train_head(
    h, data, train, held, E, s, out.with_name(".lr1e-3.checkpoint"), on_eval=lambda r: print(json.dumps(r), flush=True)
)
sha = save_head(
    h,
    out,
    (2, 14, 25),
    "qwen2.5-coder-1.5b-instruct",
    {
        "train_settings": asdict(s),
        "history": history,
        "vocabulary_coverage": cov,
        "train_tokens": sum(c.length for c in train),
    },
)
print("wrote", out, sha, flush=True)
