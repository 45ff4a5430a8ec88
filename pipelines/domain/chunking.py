"""Token-aware chunking of a ParsedDocument into deterministic, never-truncated chunks.

Why it works this way:
- Counting uses the embedding model's own tokenizer (the ``Tokenizer`` protocol; the real one is
  ``resources.tokenizer.ModelTokenizer``), so the model reads every chunk whole. all-MiniLM-L6-v2
  reads 256 word pieces including [CLS] and [SEP]: ``chunk_tokens`` may be at most 254.
- A chunk never spans a heading or page change. Inside a section, text is cut at the coarsest
  boundary that makes a piece fit: paragraph, sentence (also 。！？ with no space after), line,
  clause, word, and finally word-piece boundaries (a "word" longer than the budget, or CJK text
  without punctuation). Pieces are then packed greedily up to the budget.
- Consecutive chunks of a section overlap by up to ``overlap`` word pieces, starting at a word.
- What is embedded is ``embed_text`` = the heading path ("A > B", outermost titles dropped first if
  it would take more than a quarter of the budget) + a newline + ``text``. Headings carry meaning a
  paragraph leaves implicit ("Refunds > Eligibility"). ``token_count`` counts ``embed_text``, and it
  is what must stay within ``chunk_tokens``; ``text`` stays the plain content shown to readers.
- Identity is deterministic (DESIGN invariant 5): ``content_digest`` = sha256 of the NFC,
  whitespace-collapsed ``text``; ``chunk_id`` = sha256 over (tenant, document, version, profile,
  ordinal, heading path, content digest), 32 hex characters. Same input, same chunks, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from pipelines.domain.errors import InternalError
from pipelines.domain.parsing.model import ParsedDocument, TextBlock

DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP = 32
MIN_CHUNK_TOKENS = 8
HEADING_SEPARATOR = " > "
CHUNK_ID_CHARS = 32


class Tokenizer(Protocol):
    """The embedding model's tokenizer, as the chunker needs it (special tokens never counted)."""

    max_content_tokens: int
    """Word pieces the model reads besides its special tokens (254 for all-MiniLM-L6-v2)."""

    def count(self, text: str) -> int:
        """Number of word pieces in ``text``."""
        ...

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Character span of each word piece of ``text``, in order."""
        ...


@dataclass(frozen=True, slots=True)
class VersionIdentity:
    """Which document version, under which index profile, the chunks belong to."""

    tenant_id: str
    document_id: str
    version_number: int
    profile: str


@dataclass(frozen=True, slots=True)
class Chunk:
    chunk_id: str
    ordinal: int
    heading_path: tuple[str, ...]
    page: int | None
    text: str
    """The content, as shown to a reader."""
    embed_text: str
    """What the model embeds: heading prefix + text."""
    token_count: int
    """Word pieces of ``embed_text`` (without [CLS]/[SEP]); never more than ``chunk_tokens``."""
    content_digest: str
    """sha256 hex of the normalized ``text``."""


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


def normalize_text(text: str) -> str:
    """NFC with every whitespace run collapsed to one space: what the digest is taken over."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def content_digest(text: str) -> str:
    return hashlib.sha256(normalize_text(text).encode("utf-8", "surrogatepass")).hexdigest()


def chunk_id(identity: VersionIdentity, ordinal: int, heading_path: tuple[str, ...], digest: str) -> str:
    """Stable id: a re-run over the same version and profile writes the same rows."""
    key = [
        identity.tenant_id,
        identity.document_id,
        identity.version_number,
        identity.profile,
        ordinal,
        list(heading_path),
        digest,
    ]
    encoded = json.dumps(key, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return hashlib.sha256(encoded).hexdigest()[:CHUNK_ID_CHARS]


def _sections(blocks: list[TextBlock]) -> Iterator[tuple[tuple[str, ...], int | None, str]]:
    """Consecutive blocks with the same heading path and page, joined by blank lines."""
    current: tuple[tuple[str, ...], int | None] | None = None
    texts: list[str] = []
    for block in blocks:
        key = (tuple(block.heading_path), block.page)
        if key != current and texts and current is not None:
            yield current[0], current[1], "\n\n".join(texts)
            texts = []
        current = key
        texts.append(block.text)
    if texts and current is not None:
        yield current[0], current[1], "\n\n".join(texts)


def _heading_prefix(heading_path: tuple[str, ...], tokenizer: Tokenizer, max_tokens: int) -> str:
    """ "Outer > Inner\\n", dropping outer titles (then cutting the innermost) to fit ``max_tokens``."""
    titles = [" ".join(title.split()) for title in heading_path]
    titles = [title for title in titles if title]
    while titles:
        prefix = HEADING_SEPARATOR.join(titles) + "\n"
        if tokenizer.count(prefix) <= max_tokens:
            return prefix
        if len(titles) == 1:
            break
        titles = titles[1:]
    if not titles or max_tokens <= 0:
        return ""
    title = titles[0]
    spans = tokenizer.offsets(title)
    for keep in range(min(max_tokens, len(spans)), 0, -1):
        prefix = title[: spans[keep - 1][1]].rstrip() + "\n"
        if tokenizer.count(prefix) <= max_tokens:
            return prefix
    return ""


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


def _is_cjk(char: str) -> bool:
    """CJK ideographs, which BERT tokenizers treat as words of their own."""
    code = ord(char)
    return any(low <= code <= high for low, high in _CJK_RANGES)


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


def _mid_word(text: str, index: int) -> bool:
    """Whether a chunk starting at ``index`` would start inside a word or number ("3.5", "pre-fix")."""
    if index <= 0:
        return False
    before, after = text[index - 1], text[index]
    return not (before.isspace() or before in _CJK_PUNCTUATION or _is_cjk(before) or _is_cjk(after))


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
