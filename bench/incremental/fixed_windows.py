"""The chunker before issue #15, kept only so bench.incremental can show old and new side by side.

It packs a section's paragraphs and sentences greedily up to the token budget, so its cuts depend on
position: an inserted sentence can move every later cut of its section (most visibly in a section
that is one long paragraph). Only the splitting differs from pipelines/domain/chunking.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from pipelines.domain.chunking import (  # unchanged by issue #15: shared, only the splitting differs
    Chunk,
    Tokenizer,
    VersionIdentity,
    _heading_prefix,
    _mid_word,
    _sections,
    chunk_id,
    content_digest,
    normalize_text,
)
from pipelines.domain.errors import InternalError
from pipelines.domain.parsing.model import ParsedDocument

DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP = 32
MIN_CHUNK_TOKENS = 8


def chunk_document(
    doc: ParsedDocument,
    *,
    tokenizer: Tokenizer,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    overlap: int = DEFAULT_OVERLAP,
    identity: VersionIdentity,
) -> list[Chunk]:
    """Split ``doc`` into chunks whose ``embed_text`` fits ``chunk_tokens`` word pieces."""
    if not MIN_CHUNK_TOKENS <= chunk_tokens <= tokenizer.max_content_tokens:
        raise ValueError(
            f"chunk_tokens must be between {MIN_CHUNK_TOKENS} and the model's {tokenizer.max_content_tokens}"
        )
    if not 0 <= overlap <= chunk_tokens // 2:
        raise ValueError("overlap must be between 0 and half of chunk_tokens")
    chunks: list[Chunk] = []
    for heading_path, page, section in _sections(doc.blocks):
        prefix = _heading_prefix(heading_path, tokenizer, chunk_tokens // 4)
        for text in _SectionSplitter(section, prefix, tokenizer, chunk_tokens, overlap).chunks():
            embed_text = prefix + text
            digest = content_digest(text)
            ordinal = len(chunks)
            chunks.append(
                Chunk(
                    chunk_id=chunk_id(identity, ordinal, heading_path, digest),
                    ordinal=ordinal,
                    heading_path=heading_path,
                    page=page,
                    text=text,
                    embed_text=embed_text,
                    token_count=tokenizer.count(embed_text),
                    content_digest=digest,
                )
            )
    return chunks


# Split points, coarsest first; each pattern matches the gap *after* a separator.
_LEVELS = (
    re.compile(r"\n[^\S\n]*\n\s*"),  # paragraphs
    # sentences; after CJK full stops no space is needed
    re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+|(?<=[。！？；…])[」』”’）)\]]*\s*"),
    re.compile(r"\n\s*"),  # lines (after sentences: hard-wrapped prose breaks lines mid-sentence)
    re.compile(r"(?<=[,，、:：;；])\s*"),  # clauses
    re.compile(r"\s+"),  # words
)
_CJK_RANGES = (
    (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF),
    (0x20000, 0x2A6DF), (0x2A700, 0x2CEAF), (0x2F800, 0x2FA1F),
)


def _split_after(pattern: re.Pattern[str], text: str) -> list[str]:
    """Cut ``text`` after each match; the parts concatenate back to ``text``."""
    parts: list[str] = []
    start = 0
    for match in pattern.finditer(text):
        end = match.end()
        if start < end < len(text):
            parts.append(text[start:end])
            start = end
    parts.append(text[start:])
    return parts


class _SectionSplitter:
    """Chunks one section (one heading path and page): partition into pieces that fit, then pack."""

    def __init__(self, text: str, prefix: str, tokenizer: Tokenizer, chunk_tokens: int, overlap: int) -> None:
        self.text = text
        self.prefix = prefix
        self.tokenizer = tokenizer
        self.chunk_tokens = chunk_tokens
        self.overlap = overlap
        self.budget = chunk_tokens - tokenizer.count(prefix)

    def fits(self, text: str) -> bool:
        return self.tokenizer.count(self.prefix + text.strip()) <= self.chunk_tokens

    def chunks(self) -> Iterator[str]:
        """Chunk texts in order: greedy packing of pieces, each chunk verified against the bound."""
        spans = self._spans()
        counts = [self.tokenizer.count(self.text[a:b]) for a, b in spans]
        i, previous = 0, None
        while i < len(spans):
            start = spans[i][0]
            if previous is not None:  # repeat the previous tail, shrunk so the next piece still fits
                overlap_start = self._overlap_start(*previous, min(self.overlap, self.budget - counts[i]))
                start = start if overlap_start is None else overlap_start
            available = self.budget - self.tokenizer.count(self.text[start : spans[i][0]])
            j, total = i, 0
            while j < len(spans) and total + counts[j] <= available:
                total += counts[j]
                j += 1
            j = max(j, i + 1)
            while not self.fits(self.text[start : spans[j - 1][1]]):  # sums are estimates: verify
                if j - 1 > i:
                    j -= 1
                elif start != spans[i][0]:
                    start = spans[i][0]
                else:
                    raise InternalError("chunker could not fit a piece within the token budget")
            end = spans[j - 1][1]
            chunk = self.text[start:end].strip()
            if chunk:
                yield chunk
            i, previous = j, (start, end)

    def _spans(self) -> list[tuple[int, int]]:
        """(start, end) of consecutive pieces covering the section, each one fitting alone."""
        spans: list[tuple[int, int]] = []
        position = 0
        for piece in self._partition(self.text, 0):
            spans.append((position, position + len(piece)))
            position += len(piece)
        return spans

    def _partition(self, text: str, level: int) -> list[str]:
        if self.fits(text):
            return [text]
        if level == len(_LEVELS):
            return self._split_tokens(text)
        parts = _split_after(_LEVELS[level], text)
        if len(parts) == 1:
            return self._partition(text, level + 1)
        pieces: list[str] = []
        for part in parts:
            pieces.extend(self._partition(part, level + 1))
        return pieces

    def _split_tokens(self, text: str) -> list[str]:
        """Last resort: cut at word-piece boundaries (long "words", CJK runs without punctuation)."""
        spans = self.tokenizer.offsets(text)
        pieces: list[str] = []
        start_char, i = 0, 0
        while i < len(spans):
            j = min(i + max(self.budget, 1), len(spans))
            while True:
                end_char = spans[j][0] if j < len(spans) else len(text)
                if j == i + 1 or self.fits(text[start_char:end_char]):
                    break
                j = i + max(1, (j - i) * 3 // 4)
            pieces.append(text[start_char:end_char])
            start_char, i = end_char, j
        if start_char < len(text):
            pieces.append(text[start_char:])
        return pieces or [text]

    def _overlap_start(self, start: int, end: int, tokens: int) -> int | None:
        """Where the next chunk starts to repeat the last ``tokens`` word pieces of [start, end), at a word."""
        if tokens <= 0:
            return None
        segment = self.text[start:end]
        spans = self.tokenizer.offsets(segment)
        k = len(spans) - tokens
        if k <= 0:
            return None  # the whole chunk would repeat
        while k < len(spans) and _mid_word(segment, spans[k][0]):
            k += 1
        return start + spans[k][0] if k < len(spans) else None


_CJK_PUNCTUATION = frozenset("。！？；：，、…」』”’）")


__all__ = [
    "Chunk",
    "DEFAULT_CHUNK_TOKENS",
    "DEFAULT_OVERLAP",
    "Tokenizer",
    "VersionIdentity",
    "chunk_document",
    "chunk_id",
    "content_digest",
    "normalize_text",
]
