"""Media type from magic bytes first, then the declared type, then the file extension.

Magic bytes win because names lie: a PDF uploaded as ``notes.txt`` is parsed as a PDF, and a PNG
named ``notes.txt`` is refused as an image instead of being indexed as mojibake."""

from __future__ import annotations

import io
import posixpath
import zipfile

PLAIN = "text/plain"
MARKDOWN = "text/markdown"
RST = "text/x-rst"
HTML = "text/html"
PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
CSV = "text/csv"
TSV = "text/tab-separated-values"
EML = "message/rfc822"
OCTET_STREAM = "application/octet-stream"
OLE = "application/x-ole-storage"
"""A Compound File (CFB): legacy .doc/.xls/.ppt, and also a password-protected .docx/.xlsx/.pptx."""

SUPPORTED = frozenset({PLAIN, MARKDOWN, RST, HTML, PDF, DOCX, XLSX, PPTX, CSV, TSV, EML})

_EXTENSIONS = {
    ".txt": PLAIN, ".text": PLAIN, ".log": PLAIN, ".csv": CSV, ".tsv": TSV, ".tab": TSV, ".eml": EML,
    ".md": MARKDOWN, ".markdown": MARKDOWN, ".mdown": MARKDOWN,
    ".rst": RST, ".rest": RST,
    ".html": HTML, ".htm": HTML, ".xhtml": HTML,
    ".pdf": PDF,
    ".docx": DOCX,
    ".doc": "application/msword", ".xlsx": XLSX, ".xlsm": XLSX, ".pptx": PPTX,
}
_ALIASES = {
    "text/x-markdown": MARKDOWN, "text/md": MARKDOWN,
    "text/prs.fallenstein.rst": RST, "text/x-restructuredtext": RST, "text/restructuredtext": RST,
    "application/xhtml+xml": HTML, "application/x-pdf": PDF,
    "application/csv": CSV, "text/comma-separated-values": CSV, "text/x-csv": CSV, "application/vnd.ms-excel.sheet.macroenabled.12": XLSX,
}
_MAGIC_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # a Compound File (OLE2) container
# (prefix, media type): binary signatures that override names. None can start real text.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
    (b"\x1f\x8b", "application/gzip"),
    (b"\xfd7zXZ\x00", "application/x-xz"),
    (b"7z\xbc\xaf\x27\x1c", "application/x-7z-compressed"),
    (b"Rar!\x1a\x07", "application/vnd.rar"),
    (_MAGIC_OLE, OLE),  # legacy .doc/.xls, or an encrypted OOXML file
    (b"\x7fELF", "application/x-executable"),
    (b"\x00asm", "application/wasm"),
)
_PDF_WINDOW = 1024
"""Readers accept %PDF- anywhere in the first KiB (some files start with junk)."""


def normalize_media_type(media_type: str | None) -> str | None:
    """Lower case, parameters dropped, common aliases mapped to the canonical type."""
    if not media_type:
        return None
    base = media_type.split(";", 1)[0].strip().lower()
    return _ALIASES.get(base, base) or None


def sniff(data: bytes) -> str | None:
    """The media type the bytes themselves prove, or None for text and unknown content."""
    if b"%PDF-" in data[:_PDF_WINDOW]:
        return PDF
    if data.startswith(b"PK\x03\x04"):
        return _sniff_zip(data)
    for prefix, media_type in _MAGIC:
        if data.startswith(prefix):
            return media_type
    return None


def _sniff_zip(data: bytes) -> str | None:
    """OOXML kind of a zip; None for a damaged zip, so the name decides and its parser reports it."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, ValueError, OSError):
        return None
    if "word/document.xml" in names:
        return DOCX
    if "xl/workbook.xml" in names:
        return XLSX
    if "ppt/presentation.xml" in names:
        return PPTX
    return "application/zip"


_ENCRYPTED_PACKAGE_ENTRY = "EncryptedPackage".encode("utf-16-le").ljust(64, b"\0") + b"\x22\x00\x02"
"""The start of a CFB directory entry (128 bytes, 128-aligned) for a stream named EncryptedPackage: the
name in UTF-16LE padded to 64 bytes, its length with the terminator (34), object type 2 (stream)."""


def is_encrypted_ooxml(data: bytes) -> bool:
    """Whether ``data`` is a password-protected Office file: a CFB container holding an ``EncryptedPackage``
    stream (MS-OFFCRYPTO, what Word, Excel, PowerPoint and LibreOffice write for .docx/.xlsx/.pptx with a
    password). Legacy .doc/.xls encrypt inside their own streams and have no such entry."""
    if not data.startswith(_MAGIC_OLE):
        return False
    at = data.find(_ENCRYPTED_PACKAGE_ENTRY, 512)
    while at >= 0:
        if at % 128 == 0:  # directory sectors start on a 512-byte boundary, entries every 128 bytes
            return True
        at = data.find(_ENCRYPTED_PACKAGE_ENTRY, at + 1)
    return False


def guess_media_type(filename: str, data: bytes, declared: str | None = None) -> str:
    """Best media type for ``data``: magic bytes, else the declared type, else the extension.
    Files without an extension count as plain text (they are decoded strictly later)."""
    sniffed = sniff(data)
    if sniffed is not None:
        return sniffed
    declared = normalize_media_type(declared)
    if declared and declared != OCTET_STREAM:
        return declared
    extension = posixpath.splitext(filename.replace("\\", "/").lower())[1]
    if not extension:
        return PLAIN
    return _EXTENSIONS.get(extension, OCTET_STREAM)
