"""PDF decompression bombs (issue #31): the pre-scan (``pdf_streams``) refuses a PDF whose streams decode
past ``ParseLimits.max_pdf_stream_bytes`` (one stream) or ``max_pdf_decoded_bytes`` (all), however the
stream is wrapped, before PDFium inflates it whole. The limits are lowered here so each bomb is a few MB
(the 1 GB one, with peak RSS, is in test_parser_bombs.py); the same files parse under the default limits,
which shows the refusal comes from the stated bound and nothing else."""

from __future__ import annotations

import base64
import binascii
import io
import zlib

import pytest

from bench.abuse.bombs import one_page_pdf
from pipelines.domain.errors import DocumentTooLarge
from pipelines.domain.parsing import ParseLimits, parse_document

MB = 1024 * 1024
TIGHT = ParseLimits(max_pdf_stream_bytes=2 * MB, max_pdf_decoded_bytes=6 * MB)
TEXT = b"BT /F1 12 Tf 72 720 Td (Refunds within 30 days) Tj ET"
PADDING = b" " * (3 * MB)
"""3 MB of spaces before the text: over TIGHT's 2 MB a stream, harmless to PDFium."""


_pdf = one_page_pdf


def _flate(data: bytes, level: int = 9) -> bytes:
    return zlib.compress(data, level)


def _run_length(data: bytes) -> bytes:
    """RunLengthDecode: runs of up to 128 equal bytes (``data`` is spaces then text: good enough)."""
    out = bytearray()
    for at in range(0, len(data), 128):
        piece = data[at: at + 128]
        out += bytes([257 - len(piece)]) + piece[:1] if piece == piece[:1] * len(piece) else bytes(
            [len(piece) - 1]) + piece
    return bytes(out) + b"\x80"


BOMBS = {
    "flate": lambda: _pdf(b"/Filter /FlateDecode", _flate(PADDING + TEXT)),
    "flate-in-array": lambda: _pdf(b"/Filter [/FlateDecode]", _flate(PADDING + TEXT)),
    "short-name": lambda: _pdf(b"/Filter /Fl", _flate(PADDING + TEXT)),
    "escaped-name": lambda: _pdf(b"/Filter /Fl#61teDecode", _flate(PADDING + TEXT)),
    "filter-by-reference": lambda: _pdf(b"/Filter 6 0 R", _flate(PADDING + TEXT), [b"/FlateDecode"]),
    "hex-then-flate": lambda: _pdf(b"/Filter [/ASCIIHexDecode /FlateDecode]",
                                   binascii.b2a_hex(_flate(PADDING + TEXT)) + b">"),
    "ascii85-then-flate": lambda: _pdf(b"/Filter [/A85 /Fl]", base64.a85encode(_flate(PADDING + TEXT)) + b"~>"),
    "flate-twice": lambda: _pdf(b"/Filter [/FlateDecode /FlateDecode]", _flate(_flate(PADDING + TEXT))),
    "run-length": lambda: _pdf(b"/Filter /RunLengthDecode", _run_length(PADDING + TEXT)),
    # "endstream" stored verbatim at the start of the data (level 0): a scan that stopped there would miss the rest
    "endstream-inside-data": lambda: _pdf(b"/Filter /FlateDecode", _flate(b"endstream endobj" + PADDING + TEXT, 0)),
    # each stream under 2 MB, all of them over 6 MB
    "many-streams": lambda: _pdf(b"/Filter /FlateDecode", _flate(TEXT), [
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(body) + body + b"\nendstream"
        for body in [_flate(b" " * (MB + MB // 2))] * 6]),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_pdf_stream_bomb_is_refused_before_pdfium_reads_it(name: str) -> None:
    data = BOMBS[name]()
    with pytest.raises(DocumentTooLarge, match="decode to more than 6 MiB in all" if name == "many-streams"
                       else r"PDF stream \(object 4\) decodes to more than 2 MiB"):
        parse_document(data, filename="bomb.pdf", limits=TIGHT)


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_the_same_pdf_parses_under_the_default_limits(name: str) -> None:
    """The bombs above are real PDFs PDFium reads (so the refusal is the bound, not a broken file)."""
    doc = parse_document(BOMBS[name](), filename="bomb.pdf")
    assert "Refunds within 30 days" in " ".join(block.text for block in doc.blocks)


def test_streams_under_the_limits_parse_and_encrypted_streams_are_left_to_pdfium() -> None:
    """A PDF whose streams stay under the limits parses; an owner-password (AES) PDF, whose streams are
    ciphertext the scan cannot inflate, still opens."""
    from pypdf import PdfReader, PdfWriter

    small = _pdf(b"/Filter /FlateDecode", _flate(b" " * MB + TEXT))
    assert parse_document(small, filename="ok.pdf", limits=TIGHT).blocks
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(small)))
    writer.encrypt(user_password="", owner_password="owner-secret", algorithm="AES-128")
    out = io.BytesIO()
    writer.write(out)
    doc = parse_document(out.getvalue(), filename="aes.pdf", limits=TIGHT)
    assert "Refunds within 30 days" in doc.blocks[0].text
