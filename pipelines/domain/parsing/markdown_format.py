"""Markdown via markdown-it-py (CommonMark + tables): paragraphs, list items, table rows and code
blocks become blocks; ATX/setext headings build the heading path. YAML front matter is metadata
and is dropped; raw HTML blocks keep their text only."""

from __future__ import annotations

import re

from bs4 import BeautifulSoup
from markdown_it import MarkdownIt
from markdown_it.token import Token

from pipelines.domain.errors import ParseError
from pipelines.domain.parsing.model import BlockCollector, HeadingStack, ParsedDocument
from pipelines.domain.parsing.text_format import decode_text

MAX_NESTING = 50
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n.*?\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)


def parse_markdown(data: bytes, collector: BlockCollector, media_type: str = "text/markdown") -> ParsedDocument:
    text = _FRONT_MATTER.sub("", decode_text(data, collector.label).lstrip("\ufeff"), count=1)
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
