"""The one document model every parser produces, the limits every parser obeys, and the collector
that enforces those limits while blocks are added (so a parser cannot forget a guard)."""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

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
    """What a parser returns: non-empty blocks in reading order.

    ``warnings`` say what was recovered or skipped (a truncated PDF read as far as possible, a page OCR
    could not read, an attachment that failed); ``metadata`` carries facts worth showing on the parse
    step (which PDF engine read the file, OCR pages and seconds, e-mail headers)."""

    blocks: list[TextBlock]
    page_count: int | None
    media_type: str
    warnings: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

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
    """Time for any document, checked cooperatively between pages/blocks (one pathological PDF page can
    still overrun it). Paged formats get ``seconds_per_page`` more per page, up to ``max_time_s``."""
    seconds_per_page: float = 0.5
    max_time_s: float = 900.0
    """Overall cap, whatever the page count or OCR work."""
    ocr_seconds_per_page: float = 30.0
    """Extra time per page that needs OCR; a page that overruns it is reported, the next ones still run
    while the overall cap allows."""
    max_ocr_pages: int = 100
    max_ocr_seconds: float = 180.0
    """OCR per document (issue #31): a scan needing OCR on more pages, or still needing it after this many
    seconds of OCR, fails DOCUMENT_TOO_LARGE (a run is not held for up to ``max_time_s`` by one scan)."""
    max_zip_members: int = 2000
    max_zip_uncompressed_bytes: int = 200 * 1024 * 1024
    max_zip_ratio: float = 100.0
    """Uncompressed/compressed ratio above which a zip member (over 1 MiB) counts as a zip bomb."""
    max_xml_part_bytes: int = 64 * 1024 * 1024
    """One XML part of an Office file, uncompressed (a 1,000-page Word document.xml is ~10 MB)."""
    max_xml_elements: int = 2_000_000
    """XML elements over all parts of an Office file: python-docx holds ~250 bytes an element, so this keeps
    a .docx under ~600 MB (a 1,000-page document has ~300,000). Counted streaming before any library parses."""
    max_pdf_stream_bytes: int = 256 * 1024 * 1024
    """One PDF stream, decoded (a page's content, a font, an image, an object stream): PDFium holds a whole
    decoded stream in memory. An A4 page scanned at 600 dpi in colour is ~100 MB. Checked by a bounded
    pre-scan before PDFium opens the file (``pdf_streams``)."""
    max_pdf_decoded_bytes: int = 2 * 1024 * 1024 * 1024
    """All of a PDF's streams, decoded: about 40 times ``max_bytes`` (what the pre-scan may spend CPU on,
    ~2 s; a 50 MB PDF of text and images decodes to a few hundred MB)."""
    max_html_elements: int = 600_000
    """Tags (and comments) in an HTML file: BeautifulSoup holds ~700 bytes an element (~450 MB here).
    Counted on the bytes before parsing; a 1,000-page HTML book has ~200,000."""
    max_markdown_tokens: int = 2_000_000
    """An upper estimate of markdown-it's tokens (~330 bytes each: ~650 MB here), made on the text before
    parsing (``markdown_format.estimate_tokens``: 6 a line, 2 to 4 a markup mark); 5 MB of prose is ~1.3M."""


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
_SPACES = re.compile(r"[^\S\n]+")
_BLANK_LINES = re.compile(r"\n[^\S\n]*\n\s*")
_PIECE = 1 << 18
"""Text is cleaned in pieces of about this many characters, so the regex passes (which keep one string per
match) never run over a whole 50 MB block: peak memory stays a small multiple of the piece, not of the block."""
_CUT_WINDOW = 4096
_CUT = re.compile(
    # Before a character that never combines with the one before it (NFC) and is not a space: ASCII
    # graphics, kana, CJK ideographs, Hangul syllables; or before a space that follows a non-space.
    r"[\x21-\x7e\u3041-\u3096\u30a1-\u30fa\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3]"
    r"|(?<=[^\s\x00-\x1f\x7f\ud800-\udfff])[^\S\n\r]"
)
"""Where a line too long for one piece may be cut: cleaning the parts gives what cleaning the whole gives."""
MAX_HEADING_CHARS = 300
"""Heading titles longer than this are cut (with an ellipsis) in heading paths; their full length still counts
against ``ParseLimits.max_chars``."""


_FORMAT_CHARACTERS = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064"
    "\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
"""General category Cf (Unicode 15), as a regex class body."""

_VISIBLE = re.compile(r"[^\s\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff" + _FORMAT_CHARACTERS + "]")
"""A character that shows: not whitespace, not a control, not a lone surrogate, not a format character (Cf:
zero-width spaces and joiners, BOM, bidi marks, soft hyphen). Text without one counts as blank."""


def has_visible_text(text: str) -> bool:
    return _VISIBLE.search(text) is not None


class _Budget(Exception):
    """Cleaned text went over the character budget (internal; BlockCollector turns it into DOCUMENT_TOO_LARGE)."""


def _raw_pieces(text: str) -> Iterator[tuple[str, bool]]:
    """Consecutive slices of ``text`` of at most about ``_PIECE`` characters, each with whether it ends the text.
    A slice ends after a line break when there is one in reach, else at a ``_CUT`` point (or at the end of an
    uncuttable line), so each slice can be cleaned on its own."""
    pos, size = 0, len(text)
    while pos < size:
        high = pos + _PIECE
        if high >= size:
            yield (text if pos == 0 else text[pos:]), True
            return
        cut = max(text.rfind("\n", pos, high), text.rfind("\r", pos, high)) + 1
        if cut > pos:
            if text[cut - 1] == "\r" and text[cut] == "\n":
                cut += 1  # keep CRLF together
        else:
            last = None
            for last in _CUT.finditer(text, max(pos + 1, high - _CUT_WINDOW), high):
                pass
            if last is not None:
                cut = last.start()
            else:  # nowhere to cut near the end of the window: the first cut point after it, or the line end
                eol = min((i for i in (text.find("\n", high), text.find("\r", high)) if i >= 0), default=size)
                found = _CUT.search(text, high, eol)
                if found is not None:
                    cut = found.start()
                else:
                    cut = min(eol + 1, size)
                    if cut < size and text[eol] == "\r" and text[cut] == "\n":
                        cut += 1
        yield text[pos:cut], cut >= size
        pos = cut


def _clean(text: str, budget: int | None = None) -> str:
    """``clean_text``, piece by piece; raises ``_Budget`` as soon as the result is sure to exceed ``budget``."""
    if len(text) <= _PIECE:  # one piece: the plain passes are faster
        text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
        text = _SPACES.sub(" ", _CONTROL.sub(" ", text))
        if "\n" in text:
            text = _BLANK_LINES.sub("\n\n", "\n".join(line.strip() for line in text.split("\n")))
        text = text.strip()
        if budget is not None and len(text) > budget:
            raise _Budget
        return text
    out: list[str] = []
    total = 0
    blank = False  # an empty line is pending between the last line out and the next one
    partial: list[str] = []  # the current line so far, when a piece ended inside it
    partial_len = 0
    for raw, at_end in _raw_pieces(text):
        piece = unicodedata.normalize("NFC", raw.replace("\r\n", "\n").replace("\r", "\n"))
        piece = _SPACES.sub(" ", _CONTROL.sub(" ", piece))
        lines = piece.split("\n")
        tail = "" if at_end else lines.pop()  # "" after a line break; else a line that goes on
        for index, line in enumerate(lines):
            if index == 0 and partial:
                line = "".join(partial) + line
                partial.clear()
                partial_len = 0
            line = line.strip()
            if not line:
                blank = True
                continue
            if out:
                out.append("\n\n" if blank else "\n")
                total += len(out[-1])
            blank = False
            out.append(line)
            total += len(line)
        if tail:
            partial.append(tail)
            partial_len += len(tail)
        if budget is not None and total + partial_len - 2 > budget:
            raise _Budget
    if budget is not None and total > budget:
        raise _Budget
    return "".join(out)


def clean_text(text: str) -> str:
    """NFC, no control characters or lone surrogates, runs of spaces collapsed, lines trimmed,
    at most one blank line in a row. Keeps line breaks: they are split points for the chunker.
    Works in bounded pieces: memory stays proportional to the text, never to its number of words."""
    return _clean(text)


def one_line(text: str) -> str:
    """``clean_text`` with line breaks turned into spaces (titles, table cells), in bounded memory."""
    return _clean(text.replace("\r", " ").replace("\n", " "))


@dataclass
class BlockCollector:
    """Collects blocks for one parse and enforces the character and time limits as it goes."""

    limits: ParseLimits
    label: str
    ocr: bool = True
    """Whether scanned pages may be OCRed (an index profile can switch it off: it costs seconds a page)."""
    started: float = field(default_factory=time.monotonic)
    blocks: list[TextBlock] = field(default_factory=list)
    chars: int = 0
    warnings: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    budget_s: float = -1.0
    """Seconds this parse may take; ``limits.time_limit_s`` until a parser adds pages (``add_time``)."""
    depth: int = 0
    """How many containers (e-mail messages) this parse is inside."""
    orphan_headings: list[tuple[str, ...]] = field(default_factory=list)
    """Heading paths (ending in the heading) seen so far: the text of a document made only of headings."""

    def __post_init__(self) -> None:
        if self.budget_s < 0:
            self.budget_s = min(self.limits.time_limit_s, self.limits.max_time_s)

    def add_time(self, seconds: float) -> None:
        """Grow the time budget (per page, per OCR page), never past ``limits.max_time_s``."""
        self.budget_s = min(self.budget_s + seconds, self.limits.max_time_s)

    def time_left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def check_time(self) -> None:
        """Raise DOCUMENT_TOO_LARGE when this document's time budget has passed."""
        if self.time_left() < 0:
            raise DocumentTooLarge(f"{self.label}: parsing took longer than its {self.budget_s:g} s limit")

    def warn(self, message: str) -> None:
        """Record something recovered or skipped; it is kept on the parsed document (at most 50)."""
        if len(self.warnings) < 50:
            self.warnings.append(message[:300])

    def _too_large(self) -> DocumentTooLarge:
        return DocumentTooLarge(f"{self.label}: more than {self.limits.max_chars:,} characters of text")

    def _clean_within_budget(self, text: str) -> str:
        """Cleaned ``text``, charged to the character budget: DOCUMENT_TOO_LARGE as soon as it cannot fit,
        before the whole text has been processed."""
        if not has_visible_text(text):
            return ""
        try:
            text = _clean(text, self.limits.max_chars - self.chars)
        except _Budget:
            raise self._too_large() from None
        self.chars += len(text)
        if self.chars > self.limits.max_chars:
            raise self._too_large()
        return text

    def add(self, text: str, heading_path: tuple[str, ...] = (), page: int | None = None) -> None:
        """Clean and keep ``text`` unless it is blank (no visible character); enforce limits."""
        self.check_time()
        text = self._clean_within_budget(text)
        if text:
            self.blocks.append(TextBlock(text=text, heading_path=heading_path, page=page))

    def cell(self, text: str) -> str:
        """A table cell on one line, cleaned in bounded memory ("" when blank). Not charged: the row is."""
        self.check_time()
        if not has_visible_text(text):
            return ""
        try:
            return _clean(text.replace("\r", " ").replace("\n", " "), self.limits.max_chars - self.chars)
        except _Budget:
            raise self._too_large() from None

    def heading(self, title: str) -> str:
        """A heading title for heading paths: on one line, at most ``MAX_HEADING_CHARS`` (cut with an
        ellipsis), "" when blank. Its full cleaned length counts against ``max_chars``: a title is text too."""
        self.check_time()
        title = self._clean_within_budget(title.replace("\r", " ").replace("\n", " "))
        if len(title) > MAX_HEADING_CHARS:
            title = title[: MAX_HEADING_CHARS - 1].rstrip() + "\u2026"
        return title

    def note_heading(self, path: tuple[str, ...]) -> None:
        """Remember a heading (its full path): if nothing but headings is found, they are the text."""
        if path and len(self.orphan_headings) < 10_000:
            self.orphan_headings.append(path)

    def finish(self, media_type: str, page_count: int | None = None, empty_hint: str = "") -> ParsedDocument:
        """The parsed document, or EMPTY_DOCUMENT when no text was found. A document whose only
        content is headings is its headings (each under its parents)."""
        if not self.blocks:
            for path in self.orphan_headings:
                self.blocks.append(TextBlock(text=path[-1], heading_path=path[:-1]))
        if not self.blocks:
            raise EmptyDocument(f"{self.label}: no text found" + (f"; {empty_hint}" if empty_hint else ""))
        return ParsedDocument(blocks=self.blocks, page_count=page_count, media_type=media_type,
                              warnings=tuple(self.warnings), metadata=dict(self.metadata))


class HeadingStack:
    """Heading path for formats with numbered levels (h1-h6, Markdown #, DOCX Heading N)."""

    def __init__(self, collector: BlockCollector) -> None:
        self._collector = collector
        self._stack: list[tuple[int, str]] = []

    def push(self, level: int, title: str) -> None:
        """Titles go through ``BlockCollector.heading``: charged to the budget, one line, length-capped."""
        title = self._collector.heading(title)
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        if title:
            self._stack.append((level, title))
            self._collector.note_heading(self.path)

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(title for _, title in self._stack)
