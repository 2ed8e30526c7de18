"""What a grammar engine costs per token on this CPU: xgrammar, llguidance and outlines-core, each constraining the
default target's tokenizer to a JSON schema, timed along a valid answer (compute the next token's mask, then
accept the token), fastest of 3 passes. Also each engine's one-time compile of the schema.

    .venv/bin/python tools/grammar_mask_cost.py

The answer is a fixed JSON object tokenized by the target's tokenizer; every engine sees the same tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch

from quickdraft.models import DEFAULT_TARGET, load_tokenizer, resolve_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "languages", "address"],
}
ANSWER = {"name": "Ada Lovelace", "age": 36, "languages": ["English", "French", "Italian"],
          "address": {"city": "London", "zip": "W1J 0AA"}}  # fmt: skip


def timed(passes: int, run: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(passes):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    tokenizer = load_tokenizer(resolve_model(DEFAULT_TARGET, progress=False))
    vocab_size = 151936  # the model's logits (the tokenizer's ids and padding)
    tokens = tokenizer.encode(json.dumps(ANSWER), add_special_tokens=False)
    results = {}

    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    compiled = None

    def compile_xgr() -> None:
        nonlocal compiled
        compiled = compiler.compile_json_schema(json.dumps(SCHEMA))

    compile_s = timed(1, compile_xgr)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def run_xgr() -> None:
        matcher = xgr.GrammarMatcher(compiled)
        for token in tokens:
            matcher.fill_next_token_bitmask(bitmask)
            assert matcher.accept_token(token)

    results["xgrammar 0.2.8"] = (compile_s, timed(3, run_xgr))

    import llguidance
    import llguidance.hf
    import llguidance.torch

    lltokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    ll_bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)
    compile_s = timed(1, lambda: llguidance.LLMatcher(lltokenizer, grammar))

    def run_ll() -> None:
        matcher = llguidance.LLMatcher(lltokenizer, grammar)
        for token in tokens:
            llguidance.torch.fill_next_token_bitmask(matcher, ll_bitmask, 0)
            assert matcher.consume_token(token)

    results["llguidance 1.9.1"] = (compile_s, timed(3, run_ll))

    import outlines_core

    texts: dict[str, list[int]] = {}  # each token's text (byte-level BPE's "Ġ" as a space), as outlines reads them
    for token, index in tokenizer.get_vocab().items():
        if index != tokenizer.eos_token_id:
            texts.setdefault(tokenizer.convert_tokens_to_string([token]), []).append(index)
    vocabulary = outlines_core.Vocabulary(tokenizer.eos_token_id, texts)
    regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(SCHEMA))
    index = None

    def compile_oc() -> None:
        nonlocal index
        index = outlines_core.Index(regex, vocabulary)

    compile_s = timed(1, compile_oc)
    oc_mask = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)

    def run_oc() -> None:
        guide = outlines_core.Guide(index)
        for token in tokens:
            guide.write_mask_into(oc_mask.data_ptr(), oc_mask.numel(), 4)
            guide.advance(token)

    results["outlines-core 0.2.14"] = (compile_s, timed(3, run_oc))
    print(f"{len(tokens)} tokens of a JSON answer; per token: next-token mask + accept, fastest of 3 passes")
    for name, (compile_s, run_s) in results.items():
        print(f"{name:22} compile {1000 * compile_s:8.1f} ms   {1e6 * run_s / len(tokens):8.1f} µs a token")


if __name__ == "__main__":
    main()
