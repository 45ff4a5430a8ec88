"""Bytes -> str for text formats (BOMs, UTF-8, then charset-normalizer), and the plain-text parser."""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator

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


_COUNT_SLICE = 1 << 20


def _refuse_binary(text: str, label: str) -> str:
    """PARSE_ERROR when control characters make up too much of ``text``. Counted a slice at a time (findall
    keeps a list of its matches: over a whole 50 MB string of controls that list alone is 400 MB)."""
    allowed = MAX_CONTROL_RATIO * len(text)
    found = 0
    for start in range(0, len(text), _COUNT_SLICE):
        found += len(_BINARY_CONTROL.findall(text, start, start + _COUNT_SLICE))
        if found > allowed:
            raise ParseError(f"{label}: binary data, not text (too many control characters)")
    return text


_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n")


def paragraphs(text: str) -> Iterator[str]:
    """Blank-line separated paragraphs (line breaks already normalized to \\n), one at a time: a list of all
    of them costs an object per paragraph, far more than the text for a file of tiny paragraphs."""
    start = 0
    for match in _PARAGRAPH_BREAK.finditer(text):
        yield text[start : match.start()]
        start = match.end()
    yield text[start:] if start else text


def parse_text(data: bytes, collector: BlockCollector, media_type: str = "text/plain") -> ParsedDocument:
    """Plain text: one block per paragraph (blank-line separated), no headings."""
    text = decode_text(data, collector.label)
    for paragraph in paragraphs(text.replace("\r\n", "\n").replace("\r", "\n")):
        collector.add(paragraph)
    return collector.finish(media_type)
