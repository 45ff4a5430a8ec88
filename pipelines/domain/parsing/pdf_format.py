"""PDF: one block per paragraph with its 1-based page number; scanned pages through OCR.

Engines, chosen by measurement (bench/parse; 251-page Chinese manual: PDFium 475 pages/s, pypdf 34
pages/s, same CJK text): PDFium (``pypdfium2``) reads the text; pypdf is the fallback for a file
PDFium refuses, and the one that can rebuild a truncated file from its objects. A file missing its
end-of-file marker is read as far as either engine can (common readers do the same), with a warning.

Failures: a PDF that needs a password fails ENCRYPTED_DOCUMENT; a file neither engine can open fails
PARSE_ERROR; a PDF without any text fails EMPTY_DOCUMENT (saying whether OCR was off, failed or
found nothing); a file pypdf can read only with an optional package (AES needs ``cryptography``)
fails DEPENDENCY_MISSING naming that package, as does a scanned PDF when the OCR package is missing.
A PDF whose streams decode to more than ``ParseLimits.max_pdf_stream_bytes`` (one) or
``max_pdf_decoded_bytes`` (all) fails DOCUMENT_TOO_LARGE before either engine opens it (``pdf_streams``:
PDFium inflates a whole stream into memory).

Time: ``ParseLimits.time_limit_s`` plus ``seconds_per_page`` a page, plus ``ocr_seconds_per_page``
for each page sent to OCR, never more than ``max_time_s``. OCR runs only on pages without a text
layer that hold an image; a page it cannot read is a warning, not a failure of the document. A scan
needing OCR on more than ``max_ocr_pages`` pages, or on another page once ``max_ocr_seconds`` of OCR are
spent, fails DOCUMENT_TOO_LARGE: one document cannot hold a run for the whole ``max_time_s``."""

from __future__ import annotations

import io
import re
import threading
import time
from typing import Any

from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError

from pipelines.domain.errors import DependencyMissing, DocumentTooLarge, EncryptedDocument, ParseError
from pipelines.domain.parsing import ocr, pdf_streams
from pipelines.domain.parsing.model import BlockCollector, ParsedDocument, has_visible_text

MEDIA_TYPE = "application/pdf"
_EOF_WINDOW = 4096
"""A complete PDF ends with %%EOF within this many bytes (pypdf itself looks in the last 1 KiB)."""
_REPAIR_TAIL = b"\nstartxref\n0\n%%EOF\n"
"""Appended to a truncated file: a broken startxref makes pypdf rebuild the cross-reference by scanning."""
_OCR_DPI = 200
_OCR_MAX_SIDE = 2000
"""Pixels on a rendered page's longer side: RapidOCR scales larger images down to this anyway."""
_PARAGRAPH = re.compile(r"\n[^\S\n]*\n")
_pdfium_lock = threading.Lock()
"""PDFium is not thread-safe: one document at a time per process."""


def parse_pdf(data: bytes, collector: BlockCollector, media_type: str = MEDIA_TYPE) -> ParsedDocument:
    label = collector.label
    truncated = b"%%EOF" not in data[-_EOF_WINDOW:]
    pdf_streams.check_streams(data, collector)  # before PDFium inflates a bomb whole
    with _pdfium_lock:
        pages = _open(data, label, truncated, collector)
        try:
            return _read(pages, collector, media_type, truncated)
        finally:
            pages.close()


def _open(data: bytes, label: str, truncated: bool, collector: BlockCollector) -> _Pages:
    """PDFium, else pypdf, else (truncated files) pypdf on a repaired tail; PARSE_ERROR when none opens."""
    try:
        return _PdfiumPages(data, label)
    except EncryptedDocument:
        raise
    except ImportError:
        collector.warn("pypdfium2 is not installed: read with pypdf (slower, no OCR)")
    except Exception as exc:  # PdfiumError: damaged beyond what PDFium repairs; try pypdf
        collector.warn(f"PDFium could not open the file ({str(exc)[:80]}); read with pypdf")
    try:
        return _PypdfPages(data, label)
    except (EncryptedDocument, DependencyMissing):
        raise
    except Exception as exc:  # pypdf raises many unrelated types on damaged files
        if not truncated:
            raise ParseError(f"{label}: damaged PDF ({type(exc).__name__})") from exc
    try:
        return _PypdfPages(data + _REPAIR_TAIL, label)
    except (EncryptedDocument, DependencyMissing):
        raise
    except Exception as exc:
        raise ParseError(f"{label}: truncated PDF (no end-of-file marker), and no page could be recovered") from exc


def _read(pages: _Pages, collector: BlockCollector, media_type: str, truncated: bool) -> ParsedDocument:
    label, limits = collector.label, collector.limits
    count = pages.count
    if count > limits.max_pages:
        raise DocumentTooLarge(f"{label}: {count} pages, more than the {limits.max_pages} page limit")
    collector.add_time(limits.seconds_per_page * count)
    collector.metadata["pdf_engine"] = pages.engine
    if truncated:
        collector.warn(f"the PDF has no end-of-file marker (truncated?); read {count} recoverable page(s)")
    scan = _OcrPass(collector)
    for number in range(1, count + 1):
        collector.check_time()
        text = pages.text(number - 1)
        if not has_visible_text(text) and pages.can_render and pages.has_image(number - 1):
            text = scan.read(pages, number, count - number)
        for paragraph in _PARAGRAPH.split(text):
            collector.add(paragraph, (), number)
    scan.record()
    if not collector.blocks and scan.missing_package:
        raise DependencyMissing.for_package(label, ocr.OCR_PACKAGE, "OCR of this scanned PDF")
    return collector.finish(media_type, count, empty_hint=scan.empty_hint())


class _OcrPass:
    """OCR of the pages without a text layer, with its cost and its failures on record."""

    def __init__(self, collector: BlockCollector) -> None:
        self.collector = collector
        self.pages = 0
        self.seconds = 0.0
        self.failed: list[int] = []
        self.skipped = 0
        self.missing_package = False

    def read(self, pages: _Pages, number: int, pages_after: int) -> str:
        """OCR page ``number`` if OCR is on and the cap leaves its budget plus the text budget of the
        ``pages_after`` pages still to read; else skip it (reported)."""
        collector, limits = self.collector, self.collector.limits
        if not collector.ocr or self.missing_package:
            self.skipped += 1
            return ""
        if self.pages >= limits.max_ocr_pages:
            raise DocumentTooLarge(f"{collector.label}: more than {limits.max_ocr_pages} scanned pages need OCR "
                                   f"(page {number})")
        if self.seconds >= limits.max_ocr_seconds:
            raise DocumentTooLarge(f"{collector.label}: page {number} still needs OCR after {self.seconds:.0f} s "
                                   f"of it, the {limits.max_ocr_seconds:g} s budget of a document")
        collector.add_time(limits.ocr_seconds_per_page)
        if collector.time_left() - limits.seconds_per_page * pages_after < limits.ocr_seconds_per_page:
            self.skipped += 1
            collector.warn(f"page {number}: not OCRed, the document's {limits.max_time_s:g} s cap is reached")
            return ""
        started = time.monotonic()
        try:
            text = ocr.ocr_image(pages.render(number - 1))
        except ImportError:
            self.missing_package = True
            self.skipped += 1
            collector.warn(f"page {number}: needs OCR, but {ocr.OCR_PACKAGE} is not installed")
            return ""
        except Exception as exc:  # a page OCR cannot read must not fail the document
            text = ""
            collector.warn(f"page {number}: OCR failed ({type(exc).__name__})")
        elapsed = time.monotonic() - started
        self.pages += 1
        self.seconds += elapsed
        if elapsed > limits.ocr_seconds_per_page:
            collector.warn(f"page {number}: OCR took {elapsed:.0f} s, over the {limits.ocr_seconds_per_page:g} s budget")
        if not has_visible_text(text):
            self.failed.append(number)
            collector.warn(f"page {number}: scanned, and OCR found no text on it")
        return text

    def record(self) -> None:
        if self.pages or self.skipped:
            self.collector.metadata.update(
                ocr_pages=self.pages, ocr_seconds=round(self.seconds, 2), ocr_failed_pages=self.failed[:100],
                ocr_skipped_pages=self.skipped,
            )

    def empty_hint(self) -> str:
        if self.skipped and not self.collector.ocr:
            return "the PDF has no text layer; it looks scanned, and OCR is switched off for this index profile"
        if self.pages:
            return "the PDF has no text layer, and OCR found no text on its pages"
        return "the PDF has no text layer and no page image for OCR to read"


class _Pages:
    """One PDF opened by one engine: page count, page text, and (PDFium only) page images for OCR."""

    engine = ""
    can_render = False
    count = 0

    def text(self, index: int) -> str:
        raise NotImplementedError

    def has_image(self, index: int) -> bool:
        return False

    def render(self, index: int) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _PdfiumPages(_Pages):
    engine = "pdfium"
    can_render = True

    def __init__(self, data: bytes, label: str) -> None:
        import pypdfium2 as pdfium

        self._pdfium = pdfium
        try:
            self._doc = pdfium.PdfDocument(data)
        except pdfium.PdfiumError as exc:
            if getattr(exc, "err_code", None) == 4:  # FPDF_ERR_PASSWORD: the empty user password did not open it
                raise EncryptedDocument(f"{label}: the PDF is password-protected") from exc
            raise
        self.count = len(self._doc)

    def text(self, index: int) -> str:
        page = self._doc[index]
        try:
            textpage = page.get_textpage()
            try:
                return textpage.get_text_range()
            finally:
                textpage.close()
        finally:
            page.close()

    def has_image(self, index: int) -> bool:
        import pypdfium2.raw as raw

        page = self._doc[index]
        try:
            return any(True for _ in page.get_objects(filter=(raw.FPDF_PAGEOBJ_IMAGE,), max_depth=4))
        finally:
            page.close()

    def render(self, index: int) -> Any:
        """The page in RGB at 200 dpi, or smaller so that its longer side has at most ``_OCR_MAX_SIDE`` pixels."""
        import numpy

        page = self._doc[index]
        try:
            width, height = page.get_size()
            scale = min(_OCR_DPI / 72, _OCR_MAX_SIDE / max(width, height, 1.0))
            bitmap = page.render(scale=scale)
            try:
                return numpy.asarray(bitmap.to_pil().convert("RGB"))
            finally:
                bitmap.close()
        finally:
            page.close()

    def close(self) -> None:
        self._doc.close()


class _PypdfPages(_Pages):
    engine = "pypdf"

    def __init__(self, data: bytes, label: str) -> None:
        self._label = label
        try:
            self._reader = PdfReader(io.BytesIO(data), strict=False)
            if self._reader.is_encrypted:
                _decrypt(self._reader, label)
            self.count = len(self._reader.pages)
        except DependencyError as exc:
            raise _missing(label, exc) from exc

    def text(self, index: int) -> str:
        try:
            return self._reader.pages[index].extract_text() or ""
        except DependencyError as exc:
            raise _missing(self._label, exc) from exc
        except Exception as exc:
            raise ParseError(f"{self._label}: cannot read the text of page {index + 1} ({type(exc).__name__})") from exc


def _decrypt(reader: PdfReader, label: str) -> None:
    """Open files protected by an owner password only (empty user password); refuse the rest."""
    try:
        result = reader.decrypt("")
    except DependencyError as exc:
        raise _missing(label, exc) from exc
    if result == PasswordType.NOT_DECRYPTED:
        raise EncryptedDocument(f"{label}: the PDF is password-protected")


def _missing(label: str, exc: DependencyError) -> DependencyMissing:
    """pypdf names the package it lacks first ("cryptography>=3.1 is required for AES algorithm")."""
    words = str(exc).split()
    package = re.split(r"[<>=!~ ]", words[0], maxsplit=1)[0] if words else "an optional package"
    return DependencyMissing.for_package(label, package or "an optional package", "this PDF (" + str(exc) + ")")
