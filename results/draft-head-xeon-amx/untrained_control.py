"""The control for the distilled draft (issue 30 item 6): the untrained 0.5B draft written the way train-draft
writes a distilled one (bfloat16 safetensors directory), so both are quantized alike (--draft-weights q4)."""

from pathlib import Path

from quickdraft.draft_head.distill import save_distilled
from quickdraft.models import resolve_model
from quickdraft.models.loading import load_hf_model, load_tokenizer

path = resolve_model("qwen2.5-coder-0.5b-instruct")
out = Path("/work/distilled/qwen-0.5b-untrained")
sha = save_distilled(load_hf_model(path), load_tokenizer(path), out, {"note": "untrained control", "draft": str(path)})
print("wrote", out, sha)
