"""Token ids -> text, one token at a time, without breaking characters or spaces.

Decoding each token alone loses leading spaces (SentencePiece) and splits multi-byte
characters (byte-level BPE yields U+FFFD halves). So we decode a small window of
recent tokens twice and emit only the stable difference, as vLLM and TGI do.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers loads only where a model does (the fast tests need neither)
    from transformers import PreTrainedTokenizerBase


_CONTEXT_TOKENS = 5
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Append a token; return the text it completes (maybe empty while a character is partial)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset:])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            delta = full_text[len(prefix_text):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """Text of tokens still held back (a truncated character comes out as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset:])
        self._prefix_offset = self._read_offset = len(self._ids)
        return full_text[len(prefix_text):]


def skipped_markers(tokenizer: PreTrainedTokenizerBase, markers: tuple[str, ...]) -> dict[int, str]:
    """The markers that are each one special token, which the detokenizer skips (it decodes with
    skip_special_tokens), by id: a caller that must see them puts their text back."""
    skipped: dict[int, str] = {}
    for marker in markers:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) == 1 and not tokenizer.decode(ids, skip_special_tokens=True):
            skipped[ids[0]] = marker
    return skipped


class TokenTable:
    """Per-token display text and raw bytes, for logprobs."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._byte_decoder = _byte_level_decoder() if _is_byte_level(tokenizer) else None
        self.text_and_bytes = lru_cache(maxsize=65536)(self._text_and_bytes)

    def _text_and_bytes(self, token_id: int) -> tuple[str, bytes]:
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:
            return "", b""
        if self._byte_decoder is not None and all(ch in self._byte_decoder for ch in piece):
            raw = bytes(self._byte_decoder[ch] for ch in piece)
        elif match := _BYTE_TOKEN.match(piece):
            raw = bytes([int(match.group(1), 16)])
        else:
            raw = piece.replace("\u2581", " ").encode("utf-8")
        return raw.decode("utf-8", errors="replace"), raw


def _is_byte_level(tokenizer: PreTrainedTokenizerBase) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return decoder is not None and "ByteLevel" in type(decoder).__name__ + repr(decoder)


def _byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode table."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = visible[:]
    extra = 0
    for b in range(256):
        if b not in visible:
            visible.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(visible, codes)}
