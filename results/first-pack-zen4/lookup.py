"""Embedding lookups kept as stored (TokenEmbedding's affine rows) against a float32 table of the same rows:
time per lookup (best of 200) and bit equality, for the default pair."""

import json
import time
from pathlib import Path

import torch

from quickdraft.runtime.native.runtime import NativeRuntime
from quickdraft.runtime.options import LoadOptions

models = Path.home() / ".cache/quickdraft/models"
for name, weights in (("qwen2.5-coder-1.5b-instruct", "auto"), ("qwen2.5-coder-0.5b-instruct", "q4")):
    embedding = NativeRuntime.load(models / name / "hf", LoadOptions(weights=weights)).decoder.embedding
    floats = embedding.table()  # [V, H]
    for rows in (1, 8, 512):
        token_ids = torch.randint(0, embedding.rows, (rows,), generator=torch.Generator().manual_seed(rows))
        kept, table = [], []
        for _ in range(200):
            start = time.perf_counter()
            looked_up = embedding(token_ids)
            middle = time.perf_counter()
            indexed = floats[token_ids]
            kept.append(middle - start)
            table.append(time.perf_counter() - middle)
        print(
            json.dumps(
                {
                    "model": name,
                    "rows": rows,
                    "kept_us": round(min(kept) * 1e6, 1),
                    "float_table_us": round(min(table) * 1e6, 1),
                    "equal": torch.equal(looked_up, indexed),
                }
            )
        )
