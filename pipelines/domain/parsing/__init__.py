"""Document parsing: bytes of a supported format -> one ``ParsedDocument`` model.

``parse_document`` picks a parser by magic bytes, then declared media type, then extension, and
maps every failure to a typed ``DocumentError`` (never a silent skip):

    UNSUPPORTED_DOCUMENT  not a format kbindex reads (images, archives, legacy .doc, ...)
    PARSE_ERROR           damaged, truncated, binary-as-text, or unsafe (XML entities)
    ENCRYPTED_DOCUMENT    a PDF that needs a password, a password-protected .docx/.xlsx/.pptx
    EMPTY_DOCUMENT        no visible text (whitespace or zero-width characters only, or a scanned PDF whose
                          OCR is switched off or read nothing); a document of headings only is its headings
    DOCUMENT_TOO_LARGE    over a ``ParseLimits`` bound (bytes, pages, characters incl. headings, time, zip bomb)
    DEPENDENCY_MISSING    the file is fine but needs a package that is not installed (named in the message)

What was recovered or skipped without failing (a truncated PDF, a page OCR could not read, an e-mail
attachment that failed) is in ``ParsedDocument.warnings``; OCR cost and similar facts in ``.metadata``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import time
from collections.abc import Callable

from pipelines.domain.errors import (
    DependencyMissing,
    DocumentTooLarge,
    EmptyDocument,
    EncryptedDocument,
    KbindexError,
    ParseError,
    UnsupportedDocument,
)
from pipelines.domain.parsing import detect
from pipelines.domain.parsing.detect import guess_media_type
from pipelines.domain.parsing.model import BlockCollector, ParsedDocument, ParseLimits, TextBlock

__all__ = ["ParseLimits", "ParsedDocument", "TextBlock", "guess_media_type", "parse_document"]

Parser = Callable[[bytes, BlockCollector], ParsedDocument]
# Media type -> (module of this package, function). Imported on first use: the PDF, Office and HTML
# libraries take ~0.35 s to import, which every run process, the code server and every CLI call paid
# at start-up whether or not a document of that kind came along (issue #14: a run's fixed cost).
PARSERS: dict[str, tuple[str, str]] = {
    detect.PLAIN: ("text_format", "parse_text"),
    detect.MARKDOWN: ("markdown_format", "parse_markdown"),
    detect.RST: ("rst_format", "parse_rst"),
    detect.HTML: ("html_format", "parse_html"),
    detect.PDF: ("pdf_format", "parse_pdf"),
    detect.DOCX: ("docx_format", "parse_docx"),
    detect.XLSX: ("sheet_format", "parse_xlsx"),
    detect.PPTX: ("pptx_format", "parse_pptx"),
    detect.CSV: ("sheet_format", "parse_csv"),
    detect.TSV: ("sheet_format", "parse_csv"),
    detect.EML: ("eml_format", "parse_eml"),
}


@functools.cache
def parser_for(kind: str) -> Parser:
    """The parser of media type ``kind`` (a key of PARSERS), its module imported on first use."""
    module, function = PARSERS[kind]
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def parse_document(
    data: bytes,
    *,
    filename: str,
    media_type: str | None = None,
    limits: ParseLimits = ParseLimits(),
    ocr: bool = True,
) -> ParsedDocument:
    """Parse ``data`` into blocks with heading paths and pages, or raise a ``DocumentError``.
    ``ocr=False`` (an index profile's choice) leaves scanned PDF pages unread."""
    label = _label(filename)
    kind = _checked_kind(data, label, filename, media_type, limits)
    return _run(kind, data, BlockCollector(limits=limits, label=label, ocr=ocr))


def parse_embedded(
    data: bytes, *, filename: str, media_type: str | None, parent: BlockCollector, heading_path: tuple[str, ...]
) -> None:
    """Parse a file inside another (an e-mail attachment) into ``parent``, under ``heading_path``, within
    what is left of the parent's limits: its characters and time are charged to the parent."""
    label = _label(filename)
    kind = _checked_kind(data, label, filename, media_type, parent.limits)
    elapsed = time.monotonic() - parent.started
    limits = dataclasses.replace(
        parent.limits,
        max_chars=max(parent.limits.max_chars - parent.chars, 0),
        time_limit_s=max(parent.time_left(), 0.0),
        max_time_s=max(parent.limits.max_time_s - elapsed, 0.0),
    )
    child = BlockCollector(limits=limits, label=label, ocr=parent.ocr, depth=parent.depth + 1)
    granted = child.budget_s
    try:
        doc = _run(kind, data, child)
    finally:
        parent.add_time(child.budget_s - granted)  # the pages it brought earn their time
    for block in doc.blocks:
        parent.blocks.append(TextBlock(block.text, heading_path + block.heading_path, block.page))
    parent.chars += doc.char_count
    parent.check_time()
    for warning in doc.warnings:
        parent.warn(f"{label}: {warning}")
    for key in ("ocr_pages", "ocr_seconds"):
        if key in doc.metadata:
            parent.metadata[key] = round(parent.metadata.get(key, 0) + doc.metadata[key], 2)


def _checked_kind(data: bytes, label: str, filename: str, media_type: str | None, limits: ParseLimits) -> str:
    """The media type to parse ``data`` as, after the checks every file gets (size, blank, supported)."""
    if len(data) > limits.max_bytes:
        raise DocumentTooLarge(f"{label}: {len(data):,} bytes, more than the {limits.max_bytes:,} byte limit")
    if not data.strip():
        raise EmptyDocument(f"{label}: the file is empty" if not data else f"{label}: the file is only whitespace")
    kind = guess_media_type(filename, data, media_type)
    if kind == detect.OLE and detect.is_encrypted_ooxml(data):
        raise EncryptedDocument(f"{label}: a password-protected Office file; save it without a password to index it")
    if kind not in PARSERS:
        raise UnsupportedDocument(f"{label}: {kind} is not a supported document type")
    return kind


def _run(kind: str, data: bytes, collector: BlockCollector) -> ParsedDocument:
    """Run the parser for ``kind``; anything but a typed error becomes one."""
    label = collector.label
    try:
        parser = parser_for(kind)
    except ImportError as exc:  # a parser library missing from this install: the file is not at fault
        raise DependencyMissing.for_package(label, (exc.name or "a parser library").split(".")[0],
                                            f"reading {kind}") from exc
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
