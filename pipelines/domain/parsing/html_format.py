"""HTML via BeautifulSoup + lxml: page chrome (script, style, nav, header, footer, aside, ...) is
dropped, h1-h6 build the heading path, block elements become blocks and table rows become
"cell | cell" lines. The walk is iterative, so nesting depth cannot exhaust the Python stack.

BeautifulSoup holds ~700 bytes an element: a file with more than ``ParseLimits.max_html_elements`` tags
fails DOCUMENT_TOO_LARGE, counted on the bytes before anything is parsed (50 MB of ``<i>a</i>`` would
otherwise take 6 GB and minutes)."""

from __future__ import annotations

import re
import warnings

from bs4 import (
    BeautifulSoup,
    Comment,
    Declaration,
    Doctype,
    NavigableString,
    ProcessingInstruction,
    Tag,
    XMLParsedAsHTMLWarning,
)

from pipelines.domain.errors import DocumentTooLarge, ParseError
from pipelines.domain.parsing.model import BlockCollector, HeadingStack, ParsedDocument
from pipelines.domain.parsing.text_format import decode_text

_DROP = frozenset(
    {"script", "style", "nav", "header", "footer", "aside", "noscript", "template", "iframe", "svg",
     "canvas", "form", "button", "select", "head", "object", "embed"}
)
_BLOCK = frozenset(
    {"p", "div", "section", "article", "main", "li", "ul", "ol", "dl", "dt", "dd", "blockquote",
     "figure", "figcaption", "caption", "table", "thead", "tbody", "tfoot", "address", "hr", "body",
     "details", "summary", "fieldset", "legend", "center"}
)
_HEADING = re.compile(r"^h([1-6])$")
_SKIP_STRINGS = (Comment, Declaration, Doctype, ProcessingInstruction)
_NODE_START = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZbcdefghijklmnopqrstuvwxyz!?", b"a" * 53)
"""Maps every byte that can follow ``<`` to open a node (a tag, comment/doctype/CDATA, processing
instruction) to ``a``."""


def count_elements(data: bytes, limit: int) -> int:
    """Nodes ``data`` opens, counted without parsing: ``<`` then a letter, ``!`` or ``?``, in UTF-8,
    single-byte encodings and UTF-16 (``<\x00a`` in both byte orders). A bare ``<`` count, when it is
    within ``limit``, answers first (no copy of the data)."""
    bare = data.count(b"<")
    if bare <= limit:
        return bare
    mapped = data.translate(_NODE_START)
    return mapped.count(b"<a") + mapped.count(b"<\x00a")


def parse_html(data: bytes, collector: BlockCollector, media_type: str = "text/html") -> ParsedDocument:
    # Binary data named .html is refused like any other text format (PARSE_ERROR). Only the check uses this
    # decoding: BeautifulSoup still decodes the bytes itself, so a <meta charset> keeps deciding the encoding.
    decode_text(data, collector.label)
    limit = collector.limits.max_html_elements
    if count_elements(data, limit) > limit:
        raise DocumentTooLarge(f"{collector.label}: more than {limit:,} HTML elements")
    try:
        with warnings.catch_warnings():  # XHTML is common and parses fine as HTML
            warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
            soup = BeautifulSoup(data, "lxml")
    except Exception as exc:  # lxml/bs4 raise assorted errors on broken input
        raise ParseError(f"{collector.label}: unreadable HTML ({type(exc).__name__})") from exc
    if soup.title is not None and (title := collector.heading(soup.title.get_text())):
        collector.metadata["title"] = title  # the document's title, for profiles that embed context (chunking)
    headings = HeadingStack(collector)
    buffer: list[str] = []

    def flush() -> None:
        if buffer:
            collector.add("".join(buffer), headings.path)
            buffer.clear()

    # Explicit stack of (node, leaving) pairs: a pre-order walk with an exit event for blocks.
    stack: list[tuple[object, bool]] = [(soup, False)]
    while stack:
        node, leaving = stack.pop()
        if leaving:
            flush()
            continue
        if isinstance(node, NavigableString):
            if not isinstance(node, _SKIP_STRINGS):
                # Line breaks in HTML source are spaces; clean_text collapses the runs (in bounded memory).
                buffer.append(str(node).replace("\r", " ").replace("\n", " "))
            continue
        if not isinstance(node, Tag):
            continue
        collector.check_time()
        name = (node.name or "").lower()
        if name in _DROP:
            continue
        if heading := _HEADING.match(name):
            flush()
            headings.push(int(heading.group(1)), node.get_text(" "))
            continue
        if name == "tr":
            flush()
            cells = (collector.cell(cell.get_text(" ")) for cell in node.find_all(["td", "th"], recursive=False))
            collector.add(" | ".join(cell for cell in cells if cell), headings.path)
            continue
        if name == "pre":
            flush()
            collector.add(node.get_text(), headings.path)
            continue
        if name == "br":
            buffer.append("\n")
            continue
        if name in _BLOCK:
            flush()
            stack.append((node, True))
        stack.extend((child, False) for child in reversed(node.contents))
    flush()
    return collector.finish(media_type)
