"""Markdown via markdown-it-py (CommonMark + tables): paragraphs, list items, table rows and code
blocks become blocks; ATX/setext headings build the heading path. YAML front matter is metadata
and is dropped; raw HTML blocks keep their text only.

markdown-it builds every token before returning (~330 bytes each): a text whose token estimate
(``estimate_tokens``) is over ``ParseLimits.max_markdown_tokens`` fails DOCUMENT_TOO_LARGE before parsing
(a million one-word list items would otherwise take 2 GB)."""

from __future__ import annotations

import re

from bs4 import BeautifulSoup
from markdown_it import MarkdownIt
from markdown_it.token import Token

from pipelines.domain.errors import DocumentTooLarge, ParseError
from pipelines.domain.parsing.model import BlockCollector, HeadingStack, ParsedDocument
from pipelines.domain.parsing.text_format import decode_text

MAX_NESTING = 50
_INLINE_MARKS = "*_`[]!<&\\>~"
"""What opens inline tokens (emphasis, code, links, images, autolinks and HTML, entities, escapes) or a
block quote."""
_LIST_MARKER = re.compile(r"(?:[-+*]|\d{1,9}[.)])[ \t]")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n.*?\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)


def parse_markdown(data: bytes, collector: BlockCollector, media_type: str = "text/markdown") -> ParsedDocument:
    text = _FRONT_MATTER.sub("", decode_text(data, collector.label).lstrip("\ufeff"), count=1)
    limit = collector.limits.max_markdown_tokens
    if estimate_tokens(text, limit) > limit:
        raise DocumentTooLarge(f"{collector.label}: Markdown of more than about {limit:,} elements")
    parser = MarkdownIt("commonmark", {"maxNesting": MAX_NESTING}).enable("table")
    tokens = parser.parse(text)
    if any(token.level >= MAX_NESTING - 1 for token in tokens):
        # markdown-it silently drops everything after the nesting limit: refuse instead.
        raise ParseError(f"{collector.label}: Markdown nested more than {MAX_NESTING} levels deep")
    headings = HeadingStack(collector)
    row: list[str] | None = None
    in_heading = 0
    for token in tokens:
        collector.check_time()
        if token.type == "heading_open":
            in_heading = int(token.tag[1])
        elif token.type == "heading_close":
            in_heading = 0
        elif token.type == "tr_open":
            row = []
        elif token.type == "tr_close":
            collector.add(" | ".join(cell for cell in row or [] if cell), headings.path)
            row = None
        elif token.type == "inline":
            content = _inline_text(token)
            if in_heading:
                headings.push(in_heading, content)
            elif row is not None:
                row.append(collector.cell(content))
            else:
                collector.add(content, headings.path)
        elif token.type in ("fence", "code_block"):
            collector.add(token.content, headings.path)
        elif token.type == "html_block":
            collector.add(BeautifulSoup(token.content, "lxml").get_text("\n"), headings.path)
    return collector.finish(media_type)


def estimate_tokens(text: str, limit: int) -> int:
    """An upper estimate of the tokens markdown-it makes of ``text``, in a few passes over the text:
    6 a non-blank line (a list item in a paragraph opens and closes three), 2 an inline mark or quote
    marker (emphasis and links open, close and are followed by text), 4 a table pipe (a cell opens, holds
    an inline token and its text, closes) or list marker (a nested list and its item open and close).
    Prose punctuation (``.,;:'"``) makes no token and is not counted."""
    lines = text.count("\n") - text.count("\n\n") + 1
    total = 6 * lines
    if total > limit:
        return total
    total += 2 * sum(text.count(mark) for mark in _INLINE_MARKS) + 4 * text.count("|")
    if total > limit:
        return total
    for _ in _LIST_MARKER.finditer(text):
        total += 4
        if total > limit:
            break
    return total


def _inline_text(token: Token) -> str:
    """Plain text of an inline token: text, code spans and image alt text, markup dropped."""
    parts: list[str] = []
    for child in token.children or []:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type == "softbreak":
            parts.append(" ")
        elif child.type == "hardbreak":
            parts.append("\n")
        elif child.type == "image":
            parts.append(child.content or "")
    return "".join(parts)
