"""PowerPoint (.pptx) via python-pptx, after the zip guard: one section per slide, headed by the
slide's title ("Slide N" when it has none) and paged by the slide number; text frames, tables (rows
as "cell | cell") and grouped shapes in shape order; speaker notes under "<title> > Speaker notes"."""

from __future__ import annotations

import io

from pipelines.domain.errors import DocumentTooLarge, ParseError
from pipelines.domain.parsing.model import BlockCollector, ParsedDocument
from pipelines.domain.parsing.zip_guard import check_ooxml_container

PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
NOTES_HEADING = "Speaker notes"


def parse_pptx(data: bytes, collector: BlockCollector, media_type: str = PPTX) -> ParsedDocument:
    label = collector.label
    check_ooxml_container(data, collector.limits, label)
    import pptx

    try:
        presentation = pptx.Presentation(io.BytesIO(data))
        slides = list(presentation.slides)
    except Exception as exc:  # python-pptx raises KeyError, PackageNotFoundError, ValueError, ...
        raise ParseError(f"{label}: not a readable PowerPoint file ({type(exc).__name__})") from exc
    if len(slides) > collector.limits.max_pages:
        raise DocumentTooLarge(f"{label}: {len(slides)} slides, more than the {collector.limits.max_pages} page limit")
    collector.add_time(collector.limits.seconds_per_page * len(slides))
    for number, slide in enumerate(slides, 1):
        collector.check_time()
        try:
            _slide(slide, number, collector)
        except (KeyError, ValueError, AttributeError, TypeError) as exc:
            raise ParseError(f"{label}: slide {number} is damaged ({type(exc).__name__})") from exc
    return collector.finish(media_type, len(slides), empty_hint="the slides have no text")


def _slide(slide, number: int, collector: BlockCollector) -> None:
    title_shape = slide.shapes.title
    title = collector.heading(title_shape.text_frame.text) if title_shape is not None and title_shape.has_text_frame else ""
    path = (title or f"Slide {number}",)
    collector.note_heading(path)
    stack = list(reversed(list(slide.shapes)))
    while stack:  # iterative: groups can nest
        shape = stack.pop()
        collector.check_time()
        if title_shape is not None and shape.shape_id == title_shape.shape_id:
            continue
        if shape.shape_type is not None and getattr(shape, "shapes", None) is not None:  # a group
            stack.extend(reversed(list(shape.shapes)))
        elif getattr(shape, "has_table", False) and shape.has_table:
            for row in shape.table.rows:
                cells = (collector.cell(cell.text) for cell in row.cells)
                collector.add(" | ".join(cell for cell in cells if cell), path, number)
        elif getattr(shape, "has_text_frame", False) and shape.has_text_frame:
            for paragraph in shape.text_frame.paragraphs:
                collector.add(paragraph.text, path, number)
    if slide.has_notes_slide:
        notes = slide.notes_slide.notes_text_frame
        if notes is not None:
            for paragraph in notes.paragraphs:
                collector.add(paragraph.text, (*path, NOTES_HEADING), number)
