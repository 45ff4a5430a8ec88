"""PDF via pypdf: one block per paragraph with its 1-based page number. Encrypted files that need
a password fail ENCRYPTED_DOCUMENT; a PDF without a text layer fails EMPTY_DOCUMENT (it needs
OCR, which kbindex does not do); a truncated file fails PARSE_ERROR rather than indexing a part.
A file that pypdf can read only with an optional package (AES needs ``cryptography``) fails
DEPENDENCY_MISSING naming that package: it is never reported as damaged."""

from __future__ import annotations

import io
import re

from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError

from pipelines.domain.errors import DependencyMissing, DocumentTooLarge, EncryptedDocument, ParseError
from pipelines.domain.parsing.model import BlockCollector, ParsedDocument

MEDIA_TYPE = "application/pdf"
_EOF_WINDOW = 4096
"""A complete PDF ends with %%EOF within this many bytes (pypdf itself looks in the last 1 KiB)."""


def parse_pdf(data: bytes, collector: BlockCollector, media_type: str = MEDIA_TYPE) -> ParsedDocument:
    label = collector.label
    if b"%%EOF" not in data[-_EOF_WINDOW:]:
        raise ParseError(f"{label}: truncated PDF (no end-of-file marker)")
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            _decrypt(reader, label)
        page_count = len(reader.pages)
    except (EncryptedDocument, DocumentTooLarge, DependencyMissing):
        raise
    except DependencyError as exc:
        raise _missing(label, exc) from exc
    except Exception as exc:  # pypdf raises many unrelated types on damaged files
        raise ParseError(f"{label}: damaged PDF ({type(exc).__name__})") from exc
    if page_count > collector.limits.max_pages:
        raise DocumentTooLarge(f"{label}: {page_count} pages, more than the {collector.limits.max_pages} page limit")
    for number in range(1, page_count + 1):
        collector.check_time()
        try:
            text = reader.pages[number - 1].extract_text() or ""
        except DependencyError as exc:
            raise _missing(label, exc) from exc
        except Exception as exc:
            raise ParseError(f"{label}: cannot read the text of page {number} ({type(exc).__name__})") from exc
        for paragraph in re.split(r"\n[^\S\n]*\n", text):
            collector.add(paragraph, (), number)
    return collector.finish(
        media_type, page_count, empty_hint="the PDF has no text layer; it looks scanned and needs OCR"
    )


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
