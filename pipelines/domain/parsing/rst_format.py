"""reStructuredText via docutils: section titles build the heading path; paragraphs, literal
blocks, list items and table rows become blocks. File access (include, raw, csv-table :file:)
is disabled, docutils config files are ignored and no markup error halts the parse.

docutils builds its whole tree in one call, needs memory and time far out of proportion to some inputs
(the square of the nesting depth; tens of times the text for many small blocks) and has no limits of its
own, so the input is bounded before the call (size, lines, nesting depth) and the per-document time limit
is checked on every line docutils reads."""

from __future__ import annotations

import io
import re
from collections.abc import Callable

import docutils.core
from docutils import nodes
from docutils.readers import standalone

from pipelines.domain.errors import DocumentTooLarge, KbindexError, ParseError
from pipelines.domain.parsing.model import BlockCollector, ParsedDocument
from pipelines.domain.parsing.text_format import decode_text

MAX_RST_CHARS = 5_000_000
MAX_RST_LINES = 100_000
"""docutils keeps a tree node per block and a record per line: 100,000 lines of one-line list items already
take ~200 MB and ~15 s, so larger sources are refused (DOCUMENT_TOO_LARGE) rather than handed over."""
MAX_NESTING = 100
"""Indentation levels (block quotes, list items, directive bodies) beyond which the source counts as damaged:
docutils' memory grows with the square of the depth (2,000 levels: ~1.2 GB)."""
_MARKERS = re.compile(r"(?:(?:[-*+\u2022\u2023\u2043]|\(?(?:\d+|#|[a-zA-Z]|[ivxlcdmIVXLCDM]+)[.)])[ \t]+)+")
_MARKER = re.compile(r"[-*+\u2022\u2023\u2043][ \t]+|\(?(?:\d+|#|[a-zA-Z]|[ivxlcdmIVXLCDM]+)[.)][ \t]+")
"""List markers at the start of a line: each opens one more level ("- - - item" is three nested lists)."""
_SETTINGS = {
    "file_insertion_enabled": False,  # no include / csv-table :file: / raw :file:
    "raw_enabled": False,
    "_disable_config": True,  # ignore docutils.conf in the working directory
    "doctitle_xform": False,  # keep the top section a section, so its title joins the heading path
    "report_level": 5,
    "halt_level": 5,  # bad markup becomes system_message nodes, never an exception
    "input_encoding": "unicode",
}
_SKIP = (nodes.system_message, nodes.comment, nodes.substitution_definition, nodes.target, nodes.raw)


def parse_rst(data: bytes, collector: BlockCollector, media_type: str = "text/x-rst") -> ParsedDocument:
    label = collector.label
    text = decode_text(data, label).lstrip("\ufeff")
    if len(text) > MAX_RST_CHARS:
        raise DocumentTooLarge(
            f"{label}: {len(text):,} characters of reStructuredText, more than the {MAX_RST_CHARS:,} characters "
            "docutils is given"
        )
    lines = text.count("\n") + text.count("\r") - text.count("\r\n") + 1
    if lines > MAX_RST_LINES:
        raise DocumentTooLarge(f"{label}: {lines:,} lines of reStructuredText, more than the {MAX_RST_LINES:,} line limit")
    depth = nesting_depth(text)
    if depth > MAX_NESTING:
        raise ParseError(f"{label}: reStructuredText nested {depth:,} levels deep, more than {MAX_NESTING}")
    try:
        doctree = docutils.core.publish_doctree(
            text,
            reader=_TimedReader(collector.check_time),
            settings_overrides={**_SETTINGS, "warning_stream": io.StringIO()},
        )
    except KbindexError:
        raise
    except RecursionError as exc:
        raise ParseError(f"{collector.label}: reStructuredText is nested too deeply") from exc
    except Exception as exc:  # docutils has no common error base; any failure is a parse failure
        raise ParseError(f"{collector.label}: invalid reStructuredText ({type(exc).__name__})") from exc
    # Iterative walk in reading order: documents can be deeper than Python's recursion limit.
    stack: list[tuple[nodes.Node, tuple[str, ...]]] = [(doctree, ())]
    while stack:
        node, path = stack.pop()
        collector.check_time()
        if isinstance(node, _SKIP):
            continue
        if isinstance(node, nodes.section):
            title = next((child for child in node.children if isinstance(child, nodes.title)), None)
            heading = collector.heading(title.astext()) if title is not None else ""
            path = (*path, heading) if heading else path
            if heading:
                collector.note_heading(path)
            children = [child for child in node.children if child is not title]
        elif isinstance(node, nodes.row):
            cells = (collector.cell(entry.astext()) for entry in node.children)
            collector.add(" | ".join(cell for cell in cells if cell), path)
            continue
        elif isinstance(node, nodes.TextElement):
            collector.add(node.astext(), path)
            continue
        elif isinstance(node, nodes.Text):
            collector.add(node.astext(), path)
            continue
        else:
            children = list(node.children)
        stack.extend((child, path) for child in reversed(children))
    return collector.finish(media_type)


def nesting_depth(text: str) -> int:
    """An upper bound of the block nesting docutils would build: the longest chain of ever deeper indentation
    (tabs every 8 columns, as docutils expands them) plus the list markers that open a line."""
    deepest = 0
    indents: list[int] = []
    for line in text.splitlines():
        body = line.lstrip(" \t\f\v")
        if not body:
            continue
        indent = len(line[: len(line) - len(body)].expandtabs(8))
        while indents and indents[-1] > indent:
            indents.pop()
        if not indents or indents[-1] < indent:
            indents.append(indent)
        markers = _MARKERS.match(body)
        depth = len(indents) + (len(_MARKER.findall(markers.group())) if markers else 0)
        deepest = max(deepest, depth)
    return deepest


class _TimedReader(standalone.Reader):
    """The standalone reader, with the time limit checked whenever any docutils state machine (nested ones
    included) moves to another line: they all report line changes to ``document.note_source``."""

    def __init__(self, check_time: Callable[[], None]) -> None:
        super().__init__()
        self._check_time = check_time

    def new_document(self) -> nodes.document:
        document = super().new_document()
        note_source = document.note_source
        check_time = self._check_time

        def timed_note_source(source: object, offset: int | None) -> None:
            check_time()
            note_source(source, offset)

        document.note_source = timed_note_source  # type: ignore[method-assign]
        return document
