"""reStructuredText via docutils: section titles build the heading path; paragraphs, literal
blocks, list items and table rows become blocks. File access (include, raw, csv-table :file:)
is disabled, docutils config files are ignored and no markup error halts the parse."""

from __future__ import annotations

import io

import docutils.core
from docutils import nodes

from pipelines.domain.errors import ParseError
from pipelines.domain.parsing.model import BlockCollector, ParsedDocument
from pipelines.domain.parsing.text_format import decode_text

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
    text = decode_text(data, collector.label).lstrip("\ufeff")
    try:
        doctree = docutils.core.publish_doctree(text, settings_overrides={**_SETTINGS, "warning_stream": io.StringIO()})
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
            path = (*path, " ".join(title.astext().split())) if title is not None else path
            children = [child for child in node.children if child is not title]
        elif isinstance(node, nodes.row):
            cells = (" ".join(entry.astext().split()) for entry in node.children)
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
