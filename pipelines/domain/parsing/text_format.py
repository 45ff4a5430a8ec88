"""Bytes -> str for text formats (BOMs, UTF-8, then charset-normalizer), and the plain-text parser."""

from __future__ import annotations

import codecs
import re

import charset_normalizer

from pipelines.domain.errors import ParseError
from pipelines.domain.parsing.model import BlockCollector, ParsedDocument

# Longest first: the UTF-32-LE BOM starts with the UTF-16-LE one.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_BINARY_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
MAX_CONTROL_RATIO = 0.05
"""Share of control characters above which decoded "text" is taken for binary data."""


def decode_text(data: bytes, label: str) -> str:
    """Decode text bytes: a BOM decides; else strict UTF-8; else the best charset-normalizer guess
    (cp1252 when a Latin-script text fits it as well as the best guess). Binary data raises PARSE_ERROR."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return _refuse_binary(data[len(bom) :].decode(encoding), label)
            except UnicodeDecodeError as exc:
                raise ParseError(f"{label}: invalid {encoding} after its byte-order mark") from exc
    try:
        text = data.decode("utf-8")
        if "\x00" not in text:  # NULs: likely UTF-16/32 without a BOM, let the detector look
            return _refuse_binary(text, label)
    except UnicodeDecodeError:
        pass
    matches = charset_normalizer.from_bytes(data)
    best = matches.best()
    if best is None:
        raise ParseError(f"{label}: binary data, not text in any known encoding")
    encoding = best.encoding
    if all(_is_latin(alphabet) for alphabet in best.alphabets):
        # Few accented letters cannot tell Western code pages apart; cp1252 is by far the likeliest.
        if any("cp1252" in m.could_be_from_charset and m.percent_chaos <= best.percent_chaos for m in matches):
            encoding = "cp1252"
    return _refuse_binary(data.decode(encoding, errors="replace"), label)


_LATIN_ALPHABETS = frozenset({"Basic Latin", "Latin-1 Supplement", "General Punctuation", "Control character"})


def _is_latin(alphabet: str) -> bool:
    return alphabet in _LATIN_ALPHABETS or alphabet.startswith("Latin Extended")


def _refuse_binary(text: str, label: str) -> str:
    if text and len(_BINARY_CONTROL.findall(text)) > MAX_CONTROL_RATIO * len(text):
        raise ParseError(f"{label}: binary data, not text (too many control characters)")
    return text


def parse_text(data: bytes, collector: BlockCollector, media_type: str = "text/plain") -> ParsedDocument:
    """Plain text: one block per paragraph (blank-line separated), no headings."""
    text = decode_text(data, collector.label)
    for paragraph in re.split(r"\n[^\S\n]*\n", text.replace("\r\n", "\n").replace("\r", "\n")):
        collector.add(paragraph)
    return collector.finish(media_type)
