"""Issue 16: PDF engines and budgets, recovery of truncated PDFs, OCR of scanned pages, headings as text,
and the new formats (.pptx, .xlsx, .csv, .eml). Every fixture is made here or committed; the shared corpus
is used only when present."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from pipelines.domain.errors import DependencyMissing, EmptyDocument, ParseError
from pipelines.domain.parsing import ParseLimits, guess_media_type, parse_document
from pipelines.domain.parsing import detect, ocr, pdf_format

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "documents"
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"
ZH_PDF = CORPUS / "zh-debian-reference" / "debian-reference.zh-cn.pdf"


def text_of(doc) -> str:
    return "\n".join(block.text for block in doc.blocks)


def text_pdf(text: str) -> bytes:
    from tests.unit.test_hostile_inputs import _pdf_with_text

    return _pdf_with_text(text)


def scanned_pdf(*pages: str) -> bytes:
    """One image per page (no text layer), each with one line drawn by Pillow's built-in font."""
    from PIL import Image, ImageDraw, ImageFont

    images = []
    for line in pages:
        image = Image.new("L", (900, 120), 255)
        ImageDraw.Draw(image).text((20, 35), line, fill=0, font=ImageFont.load_default(size=36))
        images.append(image)
    out = io.BytesIO()
    images[0].save(out, "PDF", resolution=100, save_all=True, append_images=images[1:])
    return out.getvalue()


def merged(*pdfs: bytes) -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    for data in pdfs:
        for page in PdfReader(io.BytesIO(data)).pages:
            writer.add_page(page)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


# --- headings are text --------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "filename"), [
    ("<h3>Die Rückgabe ist innerhalb von 30 Tagen möglich.</h3>".encode(), "fragment.html"),
    (b"# Refunds\n\n## Within 30 days\n", "headings.md"),
    (b"Refunds\n=======\n", "title.rst"),
])
def test_a_document_of_headings_only_is_its_headings(data: bytes, filename: str) -> None:
    doc = parse_document(data, filename=filename)
    assert doc.blocks and ("Rückgabe" in text_of(doc) or "Refunds" in text_of(doc))


def test_headings_do_not_become_blocks_when_there_is_body_text() -> None:
    doc = parse_document(b"<h1>Guide</h1><h2>Refunds</h2><p>paid in 30 days</p>", filename="x.html")
    assert [(b.heading_path, b.text) for b in doc.blocks] == [(("Guide", "Refunds"), "paid in 30 days")]


# --- PDF: engines, budgets, truncated files ------------------------------------------------------


def test_pdfium_reads_text_and_says_so() -> None:
    doc = parse_document((FIXTURES / "pdflatex-4-pages.pdf").read_bytes(), filename="a.pdf")
    assert doc.metadata["pdf_engine"] == "pdfium" and doc.page_count == 4 and not doc.warnings


def test_pypdf_is_the_fallback_when_pdfium_refuses(monkeypatch) -> None:
    def refuse(data, label):
        raise RuntimeError("PDFium: Data format error")

    monkeypatch.setattr(pdf_format, "_PdfiumPages", refuse)
    doc = parse_document(text_pdf("Leave is 25 days a year"), filename="a.pdf")
    assert doc.metadata["pdf_engine"] == "pypdf" and "Leave is 25 days" in text_of(doc)
    assert any("PDFium could not open" in w for w in doc.warnings)


def test_a_pdf_missing_its_end_of_file_marker_is_read_with_a_warning() -> None:
    data = (FIXTURES / "pdflatex-4-pages.pdf").read_bytes()
    doc = parse_document(data[: data.rfind(b"%%EOF")], filename="cut.pdf")
    assert doc.page_count == 4 and "Hello, here is some text" in text_of(doc)
    assert any("end-of-file marker" in w for w in doc.warnings)


def test_a_pdf_cut_in_half_without_a_catalog_is_still_a_parse_error() -> None:
    with pytest.raises(ParseError, match="truncated"):
        parse_document((FIXTURES / "truncated.pdf").read_bytes(), filename="truncated.pdf")


def test_the_time_budget_grows_with_pages_up_to_the_cap() -> None:
    from pipelines.domain.parsing.model import BlockCollector

    collector = BlockCollector(limits=ParseLimits(time_limit_s=10, seconds_per_page=0.5, max_time_s=100), label="x")
    collector.add_time(0.5 * 619)
    assert collector.budget_s == 100
    collector = BlockCollector(limits=ParseLimits(time_limit_s=10, seconds_per_page=0.5, max_time_s=1000), label="x")
    collector.add_time(0.5 * 619)
    assert collector.budget_s == 10 + 309.5


def test_a_700_page_pdf_parses_well_within_its_budget() -> None:
    from pypdf import PdfReader, PdfWriter

    source = PdfReader(io.BytesIO((FIXTURES / "pdflatex-4-pages.pdf").read_bytes()))
    writer = PdfWriter()
    for _ in range(175):
        for page in source.pages:
            writer.add_page(page)
    out = io.BytesIO()
    writer.write(out)
    started = time.monotonic()
    doc = parse_document(out.getvalue(), filename="manual.pdf", limits=ParseLimits(time_limit_s=5, seconds_per_page=0.05))
    assert doc.page_count == 700 and max(b.page for b in doc.blocks) == 700
    assert time.monotonic() - started < 5 + 0.05 * 700


@pytest.mark.skipif(not ZH_PDF.exists(), reason="shared corpus not present")
def test_the_251_page_chinese_manual_keeps_its_cjk_text() -> None:
    doc = parse_document(ZH_PDF.read_bytes(), filename="zh.pdf")
    assert doc.page_count == 251 and "命名管道是一个像管道一样的文件" in text_of(doc)


# --- OCR -----------------------------------------------------------------------------------------


def test_a_scanned_page_becomes_text_with_its_page_number() -> None:
    doc = parse_document(merged(text_pdf("Leave is 25 days a year"), scanned_pdf("Invoice payable within fourteen days")),
                         filename="mixed.pdf")
    pages = {block.page: block.text for block in doc.blocks}
    assert "Leave is 25 days" in pages[1] and "fourteen days" in pages[2]
    assert doc.metadata["ocr_pages"] == 1 and doc.metadata["ocr_seconds"] > 0  # only the page without text


def test_chinese_scan_is_read() -> None:
    doc = parse_document((FIXTURES / "scanned-zh-debian-reference.pdf").read_bytes(), filename="zh-scan.pdf")
    assert "命名管道" in text_of(doc) and doc.blocks[0].page == 1


def test_ocr_switched_off_leaves_a_scan_empty_and_says_why() -> None:
    with pytest.raises(EmptyDocument, match="OCR is switched off"):
        parse_document(scanned_pdf("Invoice payable within fourteen days"), filename="scan.pdf", ocr=False)


def test_a_page_ocr_cannot_read_is_reported_and_the_rest_is_kept(monkeypatch) -> None:
    def fail(pixels):
        raise RuntimeError("onnxruntime failed")

    monkeypatch.setattr(ocr, "ocr_image", fail)
    doc = parse_document(merged(text_pdf("Leave is 25 days a year"), scanned_pdf("unreadable")), filename="mixed.pdf")
    assert "Leave is 25 days" in text_of(doc)
    assert any("page 2: OCR failed" in w for w in doc.warnings) and doc.metadata["ocr_failed_pages"] == [2]


def test_a_scan_whose_every_page_fails_ocr_is_empty(monkeypatch) -> None:
    monkeypatch.setattr(ocr, "ocr_image", lambda pixels: "")
    with pytest.raises(EmptyDocument, match="OCR found no text"):
        parse_document(scanned_pdf("a", "b"), filename="scan.pdf")


def test_a_missing_ocr_package_is_named(monkeypatch) -> None:
    def missing(pixels):
        raise ImportError("No module named 'rapidocr_onnxruntime'")

    monkeypatch.setattr(ocr, "ocr_image", missing)
    with pytest.raises(DependencyMissing, match="rapidocr-onnxruntime"):
        parse_document(scanned_pdf("Invoice"), filename="scan.pdf")


def test_ocr_stops_at_the_cap_without_failing_the_document(monkeypatch) -> None:
    monkeypatch.setattr(ocr, "ocr_image", lambda pixels: time.sleep(0.3) or "Refunds within 30 days")
    limits = ParseLimits(time_limit_s=1, seconds_per_page=0.01, ocr_seconds_per_page=0.5, max_time_s=2)
    doc = parse_document(scanned_pdf(*["x"] * 20), filename="long.pdf", limits=limits)
    assert 0 < doc.metadata["ocr_pages"] < 20 and doc.metadata["ocr_skipped_pages"] == 20 - doc.metadata["ocr_pages"]
    assert any("cap is reached" in w for w in doc.warnings)


# --- slides, sheets, CSV, mail -------------------------------------------------------------------


def test_pptx_slides_are_sections_with_notes_and_slide_numbers() -> None:
    from tests.acceptance.test_office_formats_searchable import _pptx

    doc = parse_document(_pptx(), filename="deck.pptx")
    assert doc.media_type == detect.PPTX and doc.page_count == 1
    assert [(b.heading_path, b.text, b.page) for b in doc.blocks] == [
        (("Warehouse safety",), "Forklift drivers renew their licence every two years", 1),
        (("Warehouse safety", "Speaker notes"), "Remind everyone about the sprinkler inspection in Bremen", 1),
    ]


def test_xlsx_rows_carry_their_header_one_section_per_sheet() -> None:
    import openpyxl

    book = openpyxl.Workbook()
    book.active.title = "Rates"
    book.active.append(["Vehicle", "Rate", "Since"])
    book.active.append(["Van", 0.42, __import__("datetime").datetime(2024, 3, 1)])
    book.create_sheet("Raw").append([1, 2.0, None, "x"])
    out = io.BytesIO()
    book.save(out)
    doc = parse_document(out.getvalue(), filename="book.xlsx")
    assert [(b.heading_path, b.text) for b in doc.blocks] == [
        (("Rates",), "Vehicle: Van; Rate: 0.42; Since: 2024-03-01"),
        (("Raw",), "1 | 2 | x"),
    ]


def test_csv_delimiter_is_sniffed_and_tsv_works() -> None:
    doc = parse_document(b"office;extension\nOslo;5521\n", filename="o.csv")
    assert text_of(doc) == "office: Oslo; extension: 5521" and doc.media_type == detect.CSV
    assert text_of(parse_document(b"office\text\nOslo\t5521\n", filename="o.tsv")) == "office: Oslo; ext: 5521"


def test_eml_headers_body_and_attachments() -> None:
    from tests.acceptance.test_office_formats_searchable import _eml

    doc = parse_document(_eml(), filename="leave.eml")
    assert doc.metadata["email"]["subject"] == "Parental leave" and doc.metadata["email"]["from"] == "hr@example.com"
    assert [(b.heading_path, b.text) for b in doc.blocks] == [
        (("Parental leave",), "Parental leave requests reach human resources eight weeks ahead."),
        (("Parental leave", "Attachment: care-days.txt"), "Grandparents receive two extra care days per year."),
    ]


def test_eml_html_body_and_a_failed_attachment_is_a_warning() -> None:
    from email.message import EmailMessage

    message = EmailMessage()
    message["From"], message["Subject"] = "a@example.com", "Policy"
    message.set_content("<html><body><p>Refunds within <b>30</b> days</p></body></html>", subtype="html")
    message.add_attachment((FIXTURES / "libreoffice-writer-password.pdf").read_bytes(), maintype="application",
                           subtype="pdf", filename="secret.pdf")
    doc = parse_document(message.as_bytes(), filename="m.eml")
    assert text_of(doc) == "Refunds within 30 days"
    assert doc.metadata["attachments_failed"] == [{"name": "secret.pdf", "code": "ENCRYPTED_DOCUMENT"}]


def test_attachments_share_the_message_character_budget() -> None:
    from tests.unit.test_hostile_inputs import _eml

    data = _eml(attachments=(("big.txt", b"refund days " * 2000),))
    doc = parse_document(data, filename="m.eml", limits=ParseLimits(max_chars=5000))
    assert "Refunds are paid" in text_of(doc) and doc.metadata["attachments_failed"][0]["code"] == "DOCUMENT_TOO_LARGE"


@pytest.mark.parametrize(("filename", "expected"), [
    ("a.csv", detect.CSV), ("a.tsv", detect.TSV), ("a.eml", detect.EML), ("a.xlsx", detect.XLSX), ("a.pptx", detect.PPTX),
])
def test_new_types_by_extension(filename: str, expected: str) -> None:
    assert guess_media_type(filename, b"x") == expected


# --- issue #31: password-protected Office files, the OCR budget of a document ---------------------------


def _cfb(streams: dict[str, bytes]) -> bytes:
    """A minimal Compound File (CFB v3, 512-byte sectors) holding ``streams`` (each padded to 4 KiB, so none
    goes to the mini stream): what an encrypted .docx/.xlsx/.pptx (EncryptionInfo + EncryptedPackage) or a
    legacy .doc (WordDocument, 1Table) is on the outside. At most three streams (one directory sector)."""
    import struct

    free, end, fat_sector, nostream = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD, 0xFFFFFFFF
    assert len(streams) <= 3
    fat = [fat_sector, end]  # sector 0: the FAT; sector 1: the directory
    entries = []
    names = list(streams)
    for index, (name, payload) in enumerate(streams.items()):
        payload = payload.ljust(4096, b"\0")
        start = len(fat)
        count = len(payload) // 512
        fat += [start + i + 1 for i in range(count - 1)] + [end]
        right = index + 2 if index + 1 < len(names) else nostream  # siblings chained to the right
        entries.append((name, 2, nostream, right, nostream, start, len(payload)))
    root = ("Root Entry", 5, nostream, nostream, 1 if names else nostream, end, 0)

    def entry(name: str, kind: int, left: int, right: int, child: int, start: int, size: int) -> bytes:
        encoded = (name.encode("utf-16-le") + b"\0\0").ljust(64, b"\0")
        return (encoded + struct.pack("<HBB3I", 2 * len(name) + 2, kind, 1, left, right, child) + bytes(16)
                + bytes(4) + bytes(16) + struct.pack("<IQ", start, size))

    unused = bytes(64) + struct.pack("<HBB3I", 0, 0, 0, nostream, nostream, nostream) + bytes(48)
    directory = b"".join(entry(*e) for e in [root, *entries]).ljust(512, b"\0")
    directory = directory[: 128 * (1 + len(entries))] + unused * (3 - len(entries))
    header = (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(16) + struct.pack("<HHHHH", 0x3E, 3, 0xFFFE, 9, 6)
              + bytes(6) + struct.pack("<IIIIIIIII", 0, 1, 1, 0, 4096, end, 0, end, 0)
              + struct.pack("<109I", 0, *[free] * 108))
    fat_bytes = struct.pack(f"<{len(fat)}I", *fat).ljust(512, b"\xff")
    data = b"".join(payload.ljust(4096, b"\0") for payload in streams.values())
    return header + fat_bytes + directory + data


_ENCRYPTED_STREAMS = {"EncryptionInfo": b"\x04\x00\x04\x00\x40\x00\x00\x00<encryption/>",
                      "EncryptedPackage": b"\x00\x10\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 16}


@pytest.mark.parametrize("filename", ["secret.xlsx", "secret.docx", "secret.pptx", "secret"])
def test_a_password_protected_office_file_is_encrypted(filename: str) -> None:
    """What Word/Excel/PowerPoint write with a password is a CFB container, not a zip: it used to end
    UNSUPPORTED_DOCUMENT (as a legacy .doc); the user must learn that a password is the reason."""
    from pipelines.domain.errors import EncryptedDocument

    with pytest.raises(EncryptedDocument, match="password-protected Office file"):
        parse_document(_cfb(_ENCRYPTED_STREAMS), filename=filename)


@pytest.mark.parametrize("filename", ["old.doc", "old.xls", "old.docx"])
def test_a_legacy_ole_file_is_still_unsupported(filename: str) -> None:
    from pipelines.domain.errors import UnsupportedDocument

    legacy = _cfb({"WordDocument": b"\xec\xa5" + "EncryptedPackage".encode("utf-16-le"), "1Table": b"x"})
    assert not detect.is_encrypted_ooxml(legacy)  # the name inside a stream is not a directory entry
    with pytest.raises(UnsupportedDocument):
        parse_document(legacy, filename=filename)


def test_the_test_container_is_a_real_cfb() -> None:
    """The hand-written container reads as CFB with olefile when it is installed (not a dependency)."""
    olefile = pytest.importorskip("olefile")
    with olefile.OleFileIO(io.BytesIO(_cfb(_ENCRYPTED_STREAMS))) as ole:
        assert sorted(ole.listdir()) == [["EncryptedPackage"], ["EncryptionInfo"]]
        assert ole.openstream("EncryptedPackage").read(8) == b"\x00\x10\x00\x00\x00\x00\x00\x00"


def test_ocr_pages_over_the_document_cap_fail_too_large(monkeypatch) -> None:
    """A scan needing OCR on more pages than ``max_ocr_pages`` ends DOCUMENT_TOO_LARGE, without OCR of the
    page past the cap (before #31 the pages ran on until the 900 s ``max_time_s``)."""
    from pipelines.domain.errors import DocumentTooLarge

    read: list[int] = []
    monkeypatch.setattr(ocr, "ocr_image", lambda pixels: read.append(1) or "Refunds within 30 days")
    with pytest.raises(DocumentTooLarge, match="more than 3 scanned pages need OCR"):
        parse_document(scanned_pdf(*["x"] * 5), filename="scan.pdf", limits=ParseLimits(max_ocr_pages=3))
    assert len(read) == 3
    doc = parse_document(scanned_pdf(*["x"] * 3), filename="scan.pdf", limits=ParseLimits(max_ocr_pages=3))
    assert doc.metadata["ocr_pages"] == 3


def test_ocr_seconds_over_the_document_budget_fail_too_large(monkeypatch) -> None:
    """Once ``max_ocr_seconds`` of OCR are spent, the next page needing OCR ends DOCUMENT_TOO_LARGE, even
    though the page budget and ``max_time_s`` would allow more."""
    from pipelines.domain.errors import DocumentTooLarge

    read: list[int] = []
    monkeypatch.setattr(ocr, "ocr_image", lambda pixels: read.append(1) or time.sleep(0.2) or "Refunds")
    limits = ParseLimits(max_ocr_seconds=0.3, max_time_s=900, time_limit_s=600)
    with pytest.raises(DocumentTooLarge, match="still needs OCR after 0 s of it, the 0.3 s budget"):
        parse_document(scanned_pdf(*["x"] * 6), filename="scan.pdf", limits=limits)
    assert len(read) == 2  # 0.2 s, 0.4 s: the third page is refused
