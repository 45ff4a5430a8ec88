"""Document parsing: bytes of a supported format -> one ``ParsedDocument`` model.

``parse_document`` picks a parser by magic bytes, then declared media type, then extension, and
maps every failure to a typed ``DocumentError`` (never a silent skip):

    UNSUPPORTED_DOCUMENT  not a format kbindex reads (images, archives, legacy .doc, ...)
    PARSE_ERROR           damaged, truncated, binary-as-text, or unsafe (XML entities)
    ENCRYPTED_DOCUMENT    a PDF that needs a password
    EMPTY_DOCUMENT        no visible text (whitespace or zero-width characters only, or a scanned PDF without OCR)
    DOCUMENT_TOO_LARGE    over a ``ParseLimits`` bound (bytes, pages, characters incl. headings, time, zip bomb)
    DEPENDENCY_MISSING    the file is fine but needs a package that is not installed (named in the message)
"""

from __future__ import annotations

from collections.abc import Callable

from pipelines.domain.errors import DocumentTooLarge, EmptyDocument, KbindexError, ParseError, UnsupportedDocument
from pipelines.domain.parsing import detect
from pipelines.domain.parsing.detect import guess_media_type
from pipelines.domain.parsing.docx_format import parse_docx
from pipelines.domain.parsing.html_format import parse_html
from pipelines.domain.parsing.markdown_format import parse_markdown
from pipelines.domain.parsing.model import BlockCollector, ParsedDocument, ParseLimits, TextBlock
from pipelines.domain.parsing.pdf_format import parse_pdf
from pipelines.domain.parsing.rst_format import parse_rst
from pipelines.domain.parsing.text_format import parse_text

__all__ = ["ParseLimits", "ParsedDocument", "TextBlock", "guess_media_type", "parse_document"]

Parser = Callable[[bytes, BlockCollector], ParsedDocument]
PARSERS: dict[str, Parser] = {
    detect.PLAIN: parse_text,
    detect.MARKDOWN: parse_markdown,
    detect.RST: parse_rst,
    detect.HTML: parse_html,
    detect.PDF: parse_pdf,
    detect.DOCX: parse_docx,
}


def parse_document(
    data: bytes,
    *,
    filename: str,
    media_type: str | None = None,
    limits: ParseLimits = ParseLimits(),
) -> ParsedDocument:
    """Parse ``data`` into blocks with heading paths and pages, or raise a ``DocumentError``."""
    label = _label(filename)
    if len(data) > limits.max_bytes:
        raise DocumentTooLarge(f"{label}: {len(data):,} bytes, more than the {limits.max_bytes:,} byte limit")
    if not data.strip():
        raise EmptyDocument(f"{label}: the file is empty" if not data else f"{label}: the file is only whitespace")
    kind = guess_media_type(filename, data, media_type)
    parser = PARSERS.get(kind)
    if parser is None:
        raise UnsupportedDocument(f"{label}: {kind} is not a supported document type")
    collector = BlockCollector(limits=limits, label=label)
    try:
        return parser(data, collector)
    except KbindexError:
        raise
    except RecursionError as exc:
        raise ParseError(f"{label}: {kind} is nested too deeply to parse") from exc
    except MemoryError as exc:
        raise DocumentTooLarge(f"{label}: ran out of memory while parsing") from exc
    except Exception as exc:  # a parser library failed in a way its module did not anticipate
        raise ParseError(f"{label}: could not parse {kind} ({type(exc).__name__})") from exc


def _label(filename: str) -> str:
    """The base name only: messages must not leak server paths."""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    return (base[:80] or "document").replace("\n", " ")
