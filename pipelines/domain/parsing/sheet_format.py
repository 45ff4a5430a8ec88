"""Spreadsheets: .xlsx via openpyxl (after the zip guard), .csv/.tsv via the csv module.

One section per sheet (the sheet name is the heading; a CSV has none), one block per row. When the
first non-empty row looks like a header (text in every cell, no numbers), each row is written as
"Header: value; Header: value", so a question about a cell's value finds the row with the names of
its columns, and every chunk of a long sheet carries the header (the chunker cuts between rows).
Without a header, rows are "value | value". Cell values: formulas as their last computed value,
whole floats without ".0", dates in ISO form."""

from __future__ import annotations

import csv
import datetime
import io
from collections.abc import Iterable, Iterator

from pipelines.domain.errors import DocumentTooLarge, ParseError
from pipelines.domain.parsing.model import BlockCollector, ParsedDocument
from pipelines.domain.parsing.text_format import decode_text
from pipelines.domain.parsing.zip_guard import check_ooxml_container

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
MAX_COLUMNS = 1000
"""Cells beyond this column are ignored (a sheet declaring 16,384 columns would otherwise cost a cell each)."""
MAX_EMPTY_ROWS = 10_000
"""A run of this many empty rows ends a sheet: formatting can stretch a sheet to a million empty rows."""
_CSV_FIELD_LIMIT = 1 << 20


def parse_xlsx(data: bytes, collector: BlockCollector, media_type: str = XLSX) -> ParsedDocument:
    label = collector.label
    check_ooxml_container(data, collector.limits, label)
    import openpyxl

    try:
        workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except Exception as exc:  # openpyxl raises KeyError, InvalidFileException, ValueError, ...
        raise ParseError(f"{label}: not a readable Excel workbook ({type(exc).__name__})") from exc
    try:
        sheets = 0
        for sheet in workbook.worksheets:
            sheets += 1
            title = collector.heading(str(sheet.title or ""))
            try:
                rows = sheet.iter_rows(values_only=True, max_col=MAX_COLUMNS)
                add_rows(((_cell_text(value) for value in row) for row in rows), collector, (title,) if title else ())
            except (DocumentTooLarge, ParseError):
                raise
            except Exception as exc:
                raise ParseError(f"{label}: sheet {sheets} is damaged ({type(exc).__name__})") from exc
    finally:
        workbook.close()
    collector.metadata["sheets"] = sheets
    return collector.finish(media_type, empty_hint="the workbook's sheets are empty")


def parse_csv(data: bytes, collector: BlockCollector, media_type: str = "text/csv") -> ParsedDocument:
    """CSV or TSV: decoded like text, delimiter sniffed from the first lines (default comma, tab for TSV)."""
    text = decode_text(data, collector.label)
    default = "\t" if media_type == "text/tab-separated-values" else ","
    try:
        dialect: type[csv.Dialect] | csv.Dialect = csv.Sniffer().sniff(text[:8192], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel_tab if default == "\t" else csv.excel
    previous = csv.field_size_limit(_CSV_FIELD_LIMIT)
    try:
        reader = csv.reader(io.StringIO(text), dialect)
        add_rows(_csv_rows(reader, collector.label), collector, ())
    finally:
        csv.field_size_limit(previous)
    return collector.finish(media_type)


def _csv_rows(reader: Iterable[list[str]], label: str) -> Iterator[Iterable[str]]:
    try:
        for row in reader:
            yield row[:MAX_COLUMNS]
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            raise DocumentTooLarge(f"{label}: a CSV field is longer than {_CSV_FIELD_LIMIT:,} characters") from exc
        raise ParseError(f"{label}: malformed CSV ({str(exc)[:80]})") from exc


def add_rows(rows: Iterable[Iterable[str]], collector: BlockCollector, path: tuple[str, ...]) -> None:
    """Rows become blocks under ``path``, labelled by the header row when there is one."""
    header: list[str] | None = None
    empty_run = 0
    for raw in rows:
        collector.check_time()
        cells = [collector.cell(value) if value else "" for value in raw]
        while cells and not cells[-1]:
            cells.pop()
        if not cells:
            empty_run += 1
            if empty_run >= MAX_EMPTY_ROWS:
                collector.warn(f"{' > '.join(path) or 'sheet'}: stopped after {MAX_EMPTY_ROWS:,} empty rows")
                return
            continue
        empty_run = 0
        if header is None:
            header = cells if _looks_like_header(cells) else []
            if header:
                collector.note_heading((*path, " | ".join(c for c in cells if c)))
                continue
        collector.add(_render(header, cells), path)


def _looks_like_header(cells: list[str]) -> bool:
    filled = [cell for cell in cells if cell]
    return len(filled) == len(cells) and not any(_is_number(cell) for cell in filled)


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def _render(header: list[str], cells: list[str]) -> str:
    if not header:
        return " | ".join(cell for cell in cells if cell)
    parts = []
    for index, cell in enumerate(cells):
        if cell:
            name = header[index] if index < len(header) else ""
            parts.append(f"{name}: {cell}" if name else cell)
    return "; ".join(parts)


def _cell_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, datetime.datetime) and value.time() == datetime.time():
        return value.date().isoformat()
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)
