"""Two vocabularies side by side: a draft model with a tokenizer of its own drafts for the target.

The target verifies its own token ids, so a foreign draft's work is translated both ways (Timor et al., ICML 2025,
"Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies"):

- **Committed tokens to the draft's.** Token by token: a target token whose bytes are one draft token (the one its
  tokenizer writes them as) becomes that token, any other its bytes encoded by the draft's tokenizer (its byte
  tokens where the bytes are not whole characters). A control token becomes the draft's of the same text, else its
  text: a chat template's end of turn is not the draft's end of sequence. A longer context only appends, so a
  draft cache rolls back to the prefix it shares with the translation, as a draft of the target's own vocabulary
  does with the context.
- **Greedy: string-level.** The draft drafts in its own vocabulary; its tokens' bytes, cut at the last whole
  character and at a special token, are encoded by the target's tokenizer after the last committed tokens, which
  must come back as themselves (else the text is encoded alone). The draft's end of turn becomes the target's.
- **Sampling: token-level intersection (TLI).** The draft's distribution is restricted to the tokens both
  vocabularies have (the same bytes, one to one, and end of sequence to end of sequence) and moved to the target's
  ids. Rejection sampling takes any q, so the output keeps the target's distribution; seeded drafts use the
  target's noise of each position.

Nothing here can change an output: every drafted token is verified by the target.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import torch

from quickdraft.prompts import start_ids
from quickdraft.tokens import common_prefix_length

BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
BOUNDARY_WINDOWS = (3, 2, 1)  # committed tokens re-encoded before the drafted text, tried in this order


def byte_level_chars() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's): the character that stands for each byte -> the byte."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    chars, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + shifted)] = byte
            shifted += 1
    return chars


def decoder_steps(tokenizer: Any) -> list[dict[str, Any]]:
    """The steps of a fast tokenizer's decoder, flattened (``ByteLevel``, ``Replace``, ``ByteFallback``, ...)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = None if backend is None else backend.decoder
    if decoder is None:
        return []
    state = json.loads(decoder.__getstate__())
    return state.get("decoders", [state]) if state.get("type") == "Sequence" else [state]


def spelled(tokenizer: Any, pieces: Sequence[bytes], token_id: int) -> tuple[str, bytes]:
    """A token's text and its own bytes (a byte token's are not its text's U+FFFD), ``pieces`` being
    :func:`token_pieces`. The text is the token's as it reads after other text: a SentencePiece or WordPiece word
    keeps the space before it, which a tokenizer drops from a text that starts with it."""
    text = tokenizer.decode([token_id], clean_up_tokenization_spaces=False)  # as answers are decoded
    piece = pieces[token_id] if token_id < len(pieces) else b""
    spaced = piece.decode(errors="replace") == f" {text}"
    return f" {text}" if spaced else text, piece or text.encode()


def token_pieces(tokenizer: Any) -> list[bytes]:
    """``[V]`` each id's bytes as the tokenizer's decoder writes them: byte-level BPE's alphabet, SentencePiece's ▁
    and ``<0xHH>`` byte tokens, WordPiece's ``##``; an added token's own text; b"" for an id without a token."""
    steps = decoder_steps(tokenizer)
    kinds = {step.get("type") for step in steps}
    byte_chars = byte_level_chars() if "ByteLevel" in kinds else None
    replacements = [(step["pattern"]["String"], step["content"]) for step in steps if step.get("type") == "Replace"]
    replacements += [(step.get("replacement", "▁"), " ") for step in steps if step.get("type") == "Metaspace"]
    added = {i: token.content for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    pieces = []
    for i, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if i in added or piece is None:
            pieces.append(added.get(i, "").encode())
        elif byte_chars is not None and all(c in byte_chars for c in piece):
            pieces.append(bytes(byte_chars[c] for c in piece))
        elif "ByteFallback" in kinds and (match := BYTE_FALLBACK.fullmatch(piece)):
            pieces.append(bytes([int(match.group(1), 16)]))
        elif "WordPiece" in kinds:
            pieces.append((piece[2:] if piece.startswith("##") else f" {piece}").encode())
        else:
            for pattern, content in replacements:
                piece = piece.replace(pattern, content)
            pieces.append(piece.encode())
    return pieces


def special_ids(tokenizer: Any) -> frozenset[int]:
    """Control tokens: the tokenizer's special tokens and its added tokens marked special."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return frozenset(tokenizer.all_special_ids) | {i for i, token in added.items() if token.special}


def whole_characters(data: bytes) -> str:
    """``data`` as text, cut before a trailing partial UTF-8 character (a byte token drafted last); "" if the bytes
    are not text."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


def canonical_ids(tokenizer: Any, pieces: Sequence[bytes], special: frozenset[int]) -> dict[bytes, int]:
    """Bytes -> the one token a tokenizer has for them, its special tokens aside; where several have the same bytes
    (a byte token ``<0x20>`` beside ``▁``), the one it encodes the text as, else the lowest id."""
    ids: dict[bytes, list[int]] = {}
    for i, piece in enumerate(pieces):
        if piece and i not in special:
            ids.setdefault(piece, []).append(i)
    canonical = {}
    for piece, candidates in ids.items():
        if len(candidates) > 1:
            text = whole_characters(piece)
            encoded = tokenizer(text, add_special_tokens=False).input_ids if text.encode() == piece else []
            candidates = [i for i in candidates if [i] == encoded] or candidates
        canonical[piece] = candidates[0]
    return canonical


class VocabularyBridge:
    """The translations between a target's tokenizer and a foreign draft model's (see the module's rules).

    ``target_width`` and ``draft_width``: the widths of the models' logits (ids beyond a tokenizer are never
    shared). ``draft_turn_ends``: the draft's tokens that end its answer (its end of sequence and end of turn).
    """

    def __init__(
        self,
        target_tokenizer: Any,
        draft_tokenizer: Any,
        target_width: int,
        draft_width: int,
        draft_turn_ends: frozenset[int] = frozenset(),
    ) -> None:
        self.target_tokenizer, self.draft_tokenizer = target_tokenizer, draft_tokenizer
        self.target_width = target_width
        self.target_pieces, self.draft_pieces = token_pieces(target_tokenizer), token_pieces(draft_tokenizer)
        self.draft_special = special_ids(draft_tokenizer)
        self.target_eos: int | None = target_tokenizer.eos_token_id
        self.draft_turn_ends = draft_turn_ends | ({draft_tokenizer.eos_token_id} - {None})
        self.target_special = special_ids(target_tokenizer)
        target_by_bytes = canonical_ids(target_tokenizer, self.target_pieces[:target_width], self.target_special)
        draft_by_bytes = canonical_ids(draft_tokenizer, self.draft_pieces[:draft_width], self.draft_special)
        pairs = {i: draft_by_bytes[piece] for piece, i in target_by_bytes.items() if piece in draft_by_bytes}
        draft_controls = {self.draft_pieces[j]: j for j in self.draft_special if j < draft_width}
        for i in self.target_special:  # control tokens of the same text in both (a family's chat markers)
            if i < target_width and self.target_pieces[i] in draft_controls:
                pairs[i] = draft_controls[self.target_pieces[i]]
        self.context_of = dict(pairs)  # target id -> draft id as the draft reads the committed tokens
        draft_eos = draft_tokenizer.eos_token_id
        if None not in (self.target_eos, draft_eos) and self.target_eos < target_width and draft_eos < draft_width:
            pairs[self.target_eos] = draft_eos  # end of sequence means the same in both
        self.draft_of = pairs
        self.shared_target_ids = torch.tensor(sorted(pairs), dtype=torch.long)  # [S]
        self.shared_draft_ids = torch.tensor([pairs[i] for i in sorted(pairs)], dtype=torch.long)  # [S]
        self.draft_start = tuple(start_ids(draft_tokenizer))
        self.single_bytes = {piece[0]: j for j, piece in enumerate(self.draft_pieces) if len(piece) == 1}
        self._draft_tokens: dict[int, tuple[int, ...]] = {}

    @property
    def num_shared(self) -> int:
        return len(self.draft_of)

    def describe(self) -> str:
        return (
            f"across vocabularies: {self.num_shared:,} tokens shared of the target's {len(self.target_pieces):,} and "
            f"the draft's {len(self.draft_pieces):,}; greedy drafts are re-tokenized as text, sampled drafts come "
            "from the shared tokens"
        )

    # -- committed tokens -> the draft's ----------------------------------------------------------------

    def draft_tokens(self, target_id: int) -> tuple[int, ...]:
        """The draft's tokens for one target token (the shared token, else its bytes encoded by the draft)."""
        tokens = self._draft_tokens.get(target_id)
        if tokens is None:
            tokens = self._translate(target_id)
            self._draft_tokens[target_id] = tokens
        return tokens

    def _translate(self, target_id: int) -> tuple[int, ...]:
        if target_id in self.context_of:
            return (self.context_of[target_id],)
        data = self.target_pieces[target_id] if 0 <= target_id < len(self.target_pieces) else b""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: the draft's byte tokens
            return tuple(self.single_bytes[byte] for byte in data if byte in self.single_bytes)
        return tuple(self.draft_tokenizer(text, add_special_tokens=False).input_ids) if text else ()

    def to_draft(self, target_ids: Sequence[int]) -> list[int]:
        """``target_ids`` in the draft's tokens, after the tokens the draft's tokenizer starts with."""
        draft_ids = list(self.draft_start)
        for target_id in target_ids:
            draft_ids.extend(self.draft_tokens(target_id))
        return draft_ids

    # -- drafts -> the target's tokens ---------------------------------------------------------------------

    def ends_text(self, draft_id: int) -> bool:
        """A drafted token after which the draft's text is over: a control token, or an id its logits have beyond
        its tokenizer."""
        return draft_id in self.draft_special or draft_id >= len(self.draft_pieces)

    def retokenize(self, context: Sequence[int], draft_ids: Sequence[int]) -> list[int]:
        """String-level: the target's tokens for the text of ``draft_ids`` after ``context`` (greedy drafts)."""
        data, ends_turn = bytearray(), False
        for draft_id in draft_ids:
            if self.ends_text(draft_id):
                ends_turn = draft_id in self.draft_turn_ends
                break
            data += self.draft_pieces[draft_id]
        text = whole_characters(bytes(data))
        target_ids = self._encode_after(context, text) if text else []
        if ends_turn and len(text.encode()) == len(data) and self.target_eos is not None:
            target_ids.append(self.target_eos)
        return target_ids

    def _encode_after(self, context: Sequence[int], text: str) -> list[int]:
        """``text`` in the target's tokens as they continue ``context``: encoded after the last committed tokens when
        they come back as themselves (the boundary is the target's), else alone."""
        encode = self.target_tokenizer
        for width in BOUNDARY_WINDOWS:
            window = list(context[-width:])
            if len(window) < width:
                continue
            try:
                before = b"".join(self.target_pieces[i] for i in window).decode("utf-8")
            except (UnicodeDecodeError, IndexError):
                continue
            target_ids = encode(before + text, add_special_tokens=False).input_ids
            if target_ids[:width] == window:
                return list(target_ids[width:])
        return list(encode(text, add_special_tokens=False).input_ids)

    def target_scores(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """TLI: ``[R, V_draft]`` draft logits -> ``[R, V_target]``, each shared token's at its target id, −inf at the
        ids the draft cannot propose."""
        shape = (draft_logits.shape[0], self.target_width)
        scores = torch.full(shape, float("-inf"), dtype=draft_logits.dtype, device=draft_logits.device)
        scores[:, self.shared_target_ids] = draft_logits[:, self.shared_draft_ids]
        return scores


class TranslatedContext:
    """One request's committed target tokens in the draft's tokens, translated once each as the context grows."""

    def __init__(self, bridge: VocabularyBridge) -> None:
        self.bridge = bridge
        self.target_ids: list[int] = []
        self.draft_ids: list[int] = list(bridge.draft_start)
        self.ends: list[int] = []  # [len(target_ids)]: where each target token's draft tokens end in draft_ids

    def update(self, context: Sequence[int]) -> list[int]:
        """The draft's tokens for ``context`` (a context that does not extend the last drops what differs)."""
        keep = common_prefix_length(self.target_ids, context)
        if keep < len(self.target_ids):
            del self.draft_ids[self.ends[keep - 1] if keep else len(self.bridge.draft_start) :]
            del self.target_ids[keep:], self.ends[keep:]
        for target_id in context[keep:]:
            self.draft_ids.extend(self.bridge.draft_tokens(target_id))
            self.target_ids.append(target_id)
            self.ends.append(len(self.draft_ids))
        return self.draft_ids
