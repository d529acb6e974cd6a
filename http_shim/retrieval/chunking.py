"""Chunks of a text, counted in the embedding model's own tokens.

The engine's Tokenize gives each token's string (a WordPiece "##ing", a SentencePiece "▁word"); each
is found again in the text (compared as an uncased BERT tokenizer normalizes: lower case, accents
stripped), so a chunk is an exact slice of the text, formatting kept, whatever the tokenizer. Chunks
are windows of `size` tokens that overlap by `overlap`. Tokens that cannot be placed ([UNK]) count but
move no boundary. The text is tokenized in pieces cut at whitespace, so no call is huge.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_PIECE_CHARS = 8000
AUTO_MAX_TOKENS, AUTO_OVERLAP_TOKENS = 800, 400  # OpenAI's auto strategy, capped by the model's window
_MARKERS = ("##", "\u2581", "\u0120")  # WordPiece continuation, SentencePiece and byte-level BPE word starts


@dataclass(frozen=True)
class Chunk:
    text: str
    tokens: int


@dataclass(frozen=True)
class ChunkSizes:
    size: int
    overlap: int


def auto_sizes(model_window: int) -> ChunkSizes:
    """OpenAI's auto (800 tokens, 400 overlap), at most what the model reads at once: all-MiniLM-L6-v2
    reads 256 tokens with [CLS] and [SEP], so its chunks are 254 tokens overlapping by 127."""
    size = max(1, min(AUTO_MAX_TOKENS, model_window - 2))
    return ChunkSizes(size, min(AUTO_OVERLAP_TOKENS, size // 2))


def _normalized(text: str) -> tuple[str, list[int]]:
    """The text lower-cased without accents, and each of its characters' index in `text`."""
    out, where = [], []
    for k, char in enumerate(text):
        for c in unicodedata.normalize("NFD", char):
            if unicodedata.category(c) != "Mn":
                for lower in c.lower():
                    out.append(lower)
                    where.append(k)
    return "".join(out), where


def _special(token: str) -> bool:
    """[CLS], [SEP], <s>, </s>...: framing the model adds, not the text's tokens ([UNK] is one of them)."""
    return len(token) > 2 and token[0] in "[<" and token[-1] in "]>" and "unk" not in token.lower()


def _token_text(token: str) -> str | None:
    """What a token string spells in the text, or None where it spells nothing known ([UNK])."""
    if not token or (token[0] in "[<" and token[-1] in "]>" and len(token) > 2):
        return None
    for marker in _MARKERS:
        token = token.removeprefix(marker)
    return token.replace("\u2581", " ").replace("\u0120", " ").strip() or None


def token_spans(text: str, tokens: Sequence[str]) -> list[tuple[int, int] | None]:
    """Each token's (start, end) in `text`, or None where it cannot be placed (special tokens are left out)."""
    norm, where = _normalized(text)
    spans: list[tuple[int, int] | None] = []
    cursor = 0
    for token in (t for t in tokens if not _special(t)):
        spelled = _token_text(token)
        if spelled is None:
            spans.append(None)
            continue
        wanted = _normalized(spelled)[0]
        found = norm.find(wanted, cursor, cursor + len(wanted) + 256) if wanted else -1
        if found < 0:
            spans.append(None)
            continue
        spans.append((where[found], where[found + len(wanted) - 1] + 1))
        cursor = found + len(wanted)
    return spans


def _pieces(text: str) -> list[tuple[int, str]]:
    """(offset, piece) of at most MAX_PIECE_CHARS, cut after whitespace where there is some."""
    out, start = [], 0
    while start < len(text):
        end = min(len(text), start + MAX_PIECE_CHARS)
        if end < len(text):
            cut = max(text.rfind("\n", start, end), text.rfind(" ", start, end))
            end = cut + 1 if cut > start else end
        out.append((start, text[start:end]))
        start = end
    return out


def chunk_text(text: str, sizes: ChunkSizes, tokenize: Callable[[str], Sequence[str]]) -> list[Chunk]:
    """`tokenize(piece)` gives a piece's token strings (special tokens included or not)."""
    spans: list[tuple[int, int] | None] = []
    for offset, piece in _pieces(text):
        for span in token_spans(piece, tokenize(piece)):
            spans.append(None if span is None else (span[0] + offset, span[1] + offset))
    placed = [k for k, s in enumerate(spans) if s is not None]
    if not placed:
        return [Chunk(text.strip(), 0)] if text.strip() else []
    spans = spans[placed[0]:placed[-1] + 1]
    chunks, step = [], max(1, sizes.size - sizes.overlap)
    for start in range(0, len(spans), step):
        window = [s for s in spans[start:start + sizes.size] if s is not None]
        if window:
            chunk = text[window[0][0]:window[-1][1]].strip()
            if chunk:
                chunks.append(Chunk(chunk, min(sizes.size, len(spans) - start)))
        if start + sizes.size >= len(spans):
            break
    return chunks
