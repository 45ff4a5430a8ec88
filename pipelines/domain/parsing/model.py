"""The one document model every parser produces, the limits every parser obeys, and the collector
that enforces those limits while blocks are added (so a parser cannot forget a guard)."""

from __future__ import annotations

import re
import time
import unicodedata
from dataclasses import dataclass, field

from pipelines.domain.errors import DocumentTooLarge, EmptyDocument


@dataclass(frozen=True, slots=True)
class TextBlock:
    """A run of text (a paragraph, list item, table row, code block or PDF page paragraph).

    ``heading_path`` is the chain of section titles above it, outermost first; ``page`` is 1-based
    and only known for paged formats (PDF)."""

    text: str
    heading_path: tuple[str, ...] = ()
    page: int | None = None


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    """What a parser returns: non-empty blocks in reading order."""

    blocks: list[TextBlock]
    page_count: int | None
    media_type: str

    @property
    def char_count(self) -> int:
        return sum(len(block.text) for block in self.blocks)


@dataclass(frozen=True, slots=True)
class ParseLimits:
    """Guards against hostile or oversized input. Every limit fails with DOCUMENT_TOO_LARGE."""

    max_bytes: int = 50 * 1024 * 1024
    max_pages: int = 2000
    max_chars: int = 5_000_000
    time_limit_s: float = 60.0
    """Checked cooperatively between pages/blocks: one pathological PDF page can still overrun it."""
    max_zip_members: int = 2000
    max_zip_uncompressed_bytes: int = 200 * 1024 * 1024
    max_zip_ratio: float = 100.0
    """Uncompressed/compressed ratio above which a zip member (over 1 MiB) counts as a zip bomb."""


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
_SPACES = re.compile(r"[^\S\n]+")
_BLANK_LINES = re.compile(r"\n[^\S\n]*\n\s*")


def clean_text(text: str) -> str:
    """NFC, no control characters or lone surrogates, runs of spaces collapsed, lines trimmed,
    at most one blank line in a row. Keeps line breaks: they are split points for the chunker."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL.sub(" ", text)
    text = _SPACES.sub(" ", text)
    text = "\n".join(line.strip() for line in text.split("\n"))
    return _BLANK_LINES.sub("\n\n", text).strip()


@dataclass
class BlockCollector:
    """Collects blocks for one parse and enforces the character and time limits as it goes."""

    limits: ParseLimits
    label: str
    started: float = field(default_factory=time.monotonic)
    blocks: list[TextBlock] = field(default_factory=list)
    chars: int = 0

    def check_time(self) -> None:
        """Raise DOCUMENT_TOO_LARGE when the per-document time limit has passed."""
        if time.monotonic() - self.started > self.limits.time_limit_s:
            raise DocumentTooLarge(
                f"{self.label}: parsing took longer than the {self.limits.time_limit_s:g} s limit"
            )

    def add(self, text: str, heading_path: tuple[str, ...] = (), page: int | None = None) -> None:
        """Clean and keep ``text`` unless it is blank; enforce limits."""
        self.check_time()
        text = clean_text(text)
        if not text:
            return
        self.chars += len(text)
        if self.chars > self.limits.max_chars:
            raise DocumentTooLarge(
                f"{self.label}: more than {self.limits.max_chars:,} characters of text"
            )
        self.blocks.append(TextBlock(text=text, heading_path=heading_path, page=page))

    def finish(self, media_type: str, page_count: int | None = None, empty_hint: str = "") -> ParsedDocument:
        """The parsed document, or EMPTY_DOCUMENT when no text was found."""
        if not self.blocks:
            raise EmptyDocument(f"{self.label}: no text found" + (f"; {empty_hint}" if empty_hint else ""))
        return ParsedDocument(blocks=self.blocks, page_count=page_count, media_type=media_type)


class HeadingStack:
    """Heading path for formats with numbered levels (h1-h6, Markdown #, DOCX Heading N)."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, str]] = []

    def push(self, level: int, title: str) -> None:
        title = " ".join(title.split())
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        if title:
            self._stack.append((level, title))

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(title for _, title in self._stack)
