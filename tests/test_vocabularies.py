"""Two vocabularies side by side (quickdraft.vocabularies): token bytes, the translations both ways, and TLI's law
by exact enumeration through the verifier."""

from __future__ import annotations

import json

import pytest
import torch
from test_verify import block_step_law, completed, prefix_tables

from quickdraft.lossless.sampling import SamplingParams, logits_to_probs
from quickdraft.vocabularies import TranslatedContext, VocabularyBridge, token_pieces, whole_characters

CORPUS = [
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "The quick brown fox jumps over the lazy dog. Über café naïve — 数字 and ünïcödé.",
    "Explain recursion: a function that calls itself on a smaller problem until a base case.",
] * 20


def byte_level_tokenizer(vocab_size: int):  # -> PreTrainedTokenizerFast
    """A byte-level BPE (GPT-2's, Qwen's kind) trained on CORPUS; end of sequence ``<|eos|>``, and a control token
    ``<end_of_turn>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|eos|>", "<end_of_turn>"], initial_alphabet=alphabet
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|eos|>")


def byte_fallback_tokenizer(vocab_size: int):  # -> PreTrainedTokenizerFast
    """A SentencePiece-style BPE (Gemma's, Llama 2's kind): ▁ for spaces, ``<0xHH>`` byte tokens for characters it
    lacks, a beginning-of-sequence token it adds and specials ``<pad> <eos> <bos> <end_of_turn>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<end_of_turn>"]
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials))
    model = json.loads(trained.to_str())["model"]
    vocab = dict(model["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in model["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens(specials)
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>")


@pytest.fixture(scope="module")
def bridge() -> VocabularyBridge:
    target, draft = byte_level_tokenizer(400), byte_fallback_tokenizer(350)
    return VocabularyBridge(
        target, draft, len(target), len(draft), frozenset({draft.convert_tokens_to_ids("<end_of_turn>")})
    )


@pytest.mark.parametrize("make", [byte_level_tokenizer, byte_fallback_tokenizer])
def test_token_pieces_are_what_the_decoder_writes(make) -> None:
    """Each id's bytes, joined, decode to what the tokenizer's own decoder writes, and agree with xgrammar's."""
    tokenizer = make(380)
    pieces = token_pieces(tokenizer)
    for text in CORPUS[:3]:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert b"".join(pieces[i] for i in ids).decode() == tokenizer.decode(ids) == text
    xgrammar = pytest.importorskip("xgrammar")
    decoded = xgrammar.TokenizerInfo.from_huggingface(tokenizer).decoded_vocab
    special = set(tokenizer.all_special_ids)
    assert [p for i, p in enumerate(pieces) if i not in special] == [
        p for i, p in enumerate(decoded) if i not in special
    ]


def test_shared_tokens_are_one_to_one_with_the_same_bytes(bridge: VocabularyBridge) -> None:
    assert 50 < bridge.num_shared < len(bridge.target_pieces)
    for target_id, draft_id in bridge.draft_of.items():
        if target_id != bridge.target_eos:
            assert bridge.target_pieces[target_id] == bridge.draft_pieces[draft_id]
    assert len(set(bridge.draft_of.values())) == bridge.num_shared
    assert bridge.draft_of[bridge.target_eos] == bridge.draft_tokenizer.eos_token_id  # end of sequence pairs too
    assert bridge.draft_start == (2,)  # the draft's tokenizer starts with its <bos>
    space = bridge.target_tokenizer.convert_tokens_to_ids("Ġ")
    assert bridge.draft_of[space] == bridge.draft_tokenizer.convert_tokens_to_ids("▁")  # not its byte token <0x20>


def test_committed_tokens_translate_to_the_drafts_text(bridge: VocabularyBridge) -> None:
    """Token by token, the draft's tokens carry the committed text's bytes (a character split across target tokens
    too: byte tokens), and a growing context only appends."""
    text = CORPUS[1]
    target_ids = bridge.target_tokenizer(text, add_special_tokens=False).input_ids
    translation = TranslatedContext(bridge)
    for end in range(len(target_ids) + 1):
        draft_ids = list(translation.update(target_ids[:end]))
        assert draft_ids == bridge.to_draft(target_ids[:end])
    assert draft_ids[0] == 2
    assert b"".join(bridge.draft_pieces[i] for i in draft_ids[1:]).decode() == text
    shorter = translation.update(target_ids[:5])  # a context that does not extend the last
    assert shorter == bridge.to_draft(target_ids[:5])
    eos_text = bridge.draft_tokenizer.decode(bridge.draft_tokens(bridge.target_eos))
    assert eos_text == "<|eos|>"  # a control token is its text in the draft's context, not the draft's <eos>
    end_of_turn = bridge.target_tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert bridge.draft_tokens(end_of_turn) == (bridge.draft_tokenizer.convert_tokens_to_ids("<end_of_turn>"),)


def test_greedy_drafts_are_re_tokenized_as_the_targets_own_tokens(bridge: VocabularyBridge) -> None:
    """String-level: the draft's text after the committed tokens comes back as the target's tokenization of the
    whole text, the boundary included; a trailing partial character is cut; the draft's end of turn is the
    target's end of sequence; nothing after a special token."""
    text = CORPUS[0] + CORPUS[1]
    target_ids = bridge.target_tokenizer(text, add_special_tokens=False).input_ids
    draft_ids = bridge.draft_tokenizer(text, add_special_tokens=False).input_ids
    for cut in range(1, len(target_ids) - 1, 7):
        prefix_text = bridge.target_tokenizer.decode(target_ids[:cut])
        draft_cut = next(
            (j for j in range(len(draft_ids)) if len(bridge.draft_tokenizer.decode(draft_ids[:j])) >= len(prefix_text)),
            None,
        )
        if draft_cut is None or bridge.draft_tokenizer.decode(draft_ids[:draft_cut]) != prefix_text:
            continue  # no draft token boundary there
        proposed = bridge.retokenize(target_ids[:cut], draft_ids[draft_cut:])
        assert bridge.target_tokenizer.decode(target_ids[:cut] + proposed) == text
    assert whole_characters("ü".encode()[:1]) == ""
    eot = bridge.draft_tokenizer.convert_tokens_to_ids("<end_of_turn>")
    hello = bridge.draft_tokenizer("The quick", add_special_tokens=False).input_ids
    proposed = bridge.retokenize([], [*hello, eot, *hello])
    assert proposed[-1] == bridge.target_eos and bridge.target_tokenizer.decode(proposed[:-1]) == "The quick"
    beyond = len(bridge.draft_pieces)  # an id of the draft's logits its tokenizer lacks also ends the text
    assert bridge.target_tokenizer.decode(bridge.retokenize([], [*hello, beyond, *hello])) == "The quick"


def tli_tables(bridge_map: dict[int, int], draft_tables: dict, target_vocab: int) -> dict:
    """TLI's q for each prefix: the draft's probabilities of the shared tokens, renormalized, at target ids."""
    tables = {}
    for prefix, draft_probs in draft_tables.items():
        q = torch.zeros(target_vocab, dtype=torch.float64)
        for target_id, draft_id in bridge_map.items():
            q[target_id] = draft_probs[draft_id]
        tables[prefix] = q / q.sum()
    return tables


@pytest.mark.parametrize("gamma", [1, 2])
@pytest.mark.parametrize("seed", range(6))
def test_tli_drafts_keep_the_targets_law_by_exact_enumeration(gamma: int, seed: int) -> None:
    """Exact enumeration, target V = 3 with a token the draft lacks, draft V = 4 with one the target lacks: the
    verifier's step over TLI drafts, completed by the target, has the target's joint law."""
    target = prefix_tables(3, gamma, 2 * seed)
    draft_full = prefix_tables(4, gamma - 1, 2 * seed + 1)
    shared = {0: 1, 1: 0}  # target id -> draft id; target token 2 and draft tokens 2, 3 are not shared
    for prefix, probs in draft_full.items():
        if probs[[1, 0]].sum() == 0:
            draft_full[prefix] = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    draft = tli_tables(shared, draft_full, 3)
    joint, _ = block_step_law(target, draft, gamma, 3)
    assert torch.allclose(joint, completed(target, (), gamma + 1, 3), atol=1e-9)


def test_tli_scores_are_the_drafts_over_the_shared_tokens(bridge: VocabularyBridge) -> None:
    draft_logits = torch.randn(1, len(bridge.draft_pieces), generator=torch.Generator().manual_seed(0))
    probs = logits_to_probs(bridge.target_scores(draft_logits), SamplingParams(temperature=0.8))  # [1, V]
    shared = bridge.shared_target_ids
    assert probs[0, shared].sum() == pytest.approx(1.0) and probs.shape[-1] == bridge.target_width
    expected = torch.softmax(draft_logits[0, bridge.shared_draft_ids] / 0.8, dim=-1)
    assert torch.allclose(probs[0, shared], expected, atol=1e-6)
