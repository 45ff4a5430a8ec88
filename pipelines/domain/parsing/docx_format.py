"""DOCX via python-docx, after the zip guard: paragraphs and tables in body order; "Title" and
"Heading N" paragraph styles build the heading path; list paragraphs get a "- " marker; table
rows become "cell | cell" lines. Headers, footers and comments are not indexed."""

from __future__ import annotations

import io
import re

import docx
from docx.table import Table
from docx.text.paragraph import Paragraph

from pipelines.domain.errors import ParseError
from pipelines.domain.parsing.model import BlockCollector, HeadingStack, ParsedDocument
from pipelines.domain.parsing.zip_guard import check_ooxml_container

MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
_HEADING_STYLE = re.compile(r"^(?:heading\s*(\d)|title)$", re.IGNORECASE)


def parse_docx(data: bytes, collector: BlockCollector, media_type: str = MEDIA_TYPE) -> ParsedDocument:
    label = collector.label
    check_ooxml_container(data, collector.limits, label)
    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:  # python-docx raises KeyError, ValueError, PackageNotFoundError, ...
        raise ParseError(f"{label}: not a readable Word document ({type(exc).__name__})") from exc
    headings = HeadingStack(collector)
    for item in document.iter_inner_content():
        collector.check_time()
        if isinstance(item, Table):
            for row in _table_rows(item, collector):
                collector.add(row, headings.path)
        elif isinstance(item, Paragraph):
            level = _heading_level(item)
            if level is not None:
                headings.push(level, item.text)
            elif _is_list_item(item) and item.text.strip():
                collector.add("- " + item.text, headings.path)
            else:
                collector.add(item.text, headings.path)
    return collector.finish(media_type)


def _style_name(paragraph: Paragraph) -> str:
    try:
        return (paragraph.style.name or "") if paragraph.style is not None else ""
    except (KeyError, ValueError):
        return ""


def _heading_level(paragraph: Paragraph) -> int | None:
    match = _HEADING_STYLE.match(_style_name(paragraph).strip())
    if match is None:
        return None
    return int(match.group(1)) if match.group(1) else 0  # Title sits above Heading 1


def _is_list_item(paragraph: Paragraph) -> bool:
    if _style_name(paragraph).lower().startswith("list"):
        return True
    ppr = paragraph._p.pPr  # numbering without a list style: direct w:numPr
    return ppr is not None and ppr.numPr is not None


def _table_rows(table: Table, collector: BlockCollector) -> list[str]:
    rows: list[str] = []
    for row in table.rows:
        cells: list[str] = []
        for cell in row.cells:
            text = collector.cell(cell.text)
            if text and (not cells or cells[-1] != text):  # merged cells repeat their text
                cells.append(text)
        rows.append(" | ".join(cells))
    return rows
