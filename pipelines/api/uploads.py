"""Reading a multipart upload without trusting its size, its pace or its shape.

A declared ``Content-Length`` over the limit is refused before a byte is read. The body is then
received into a spooled temporary file (memory up to ``SPOOL_MEMORY_BYTES``, then a 0600 file on
disk), refused with 413 ``DOCUMENT_TOO_LARGE`` as soon as it passes the limit and with 408
``UPLOAD_TIMEOUT`` when a chunk takes longer than ``idle_timeout`` or the whole body longer than
``total_timeout``. Only then is it parsed, in a worker thread (never on the event loop: a body of
many tiny parts costs CPU), the file part going to a second spool; more than ``max_parts`` parts is
400. The caller gets the file part's bytes once: memory per upload is about one copy of the file.
Small text parts named in ``text_fields`` (a publish's ``metadata`` and ``allow``) come back as strings,
each at most ``MAX_FIELD_BYTES`` or its own limit in ``text_limits`` (INVALID_METADATA beyond); other parts
are ignored. ``read_uploads`` reads a batch the same way: up to ``max_files`` file parts, each at most ``max_bytes``, the body at most
``max_total_bytes``.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import IO

from anyio import CapacityLimiter, to_thread
from python_multipart.multipart import MultipartParser, parse_options_header

from pipelines.api.errors import UploadTimeout
from pipelines.domain.errors import DocumentTooLarge, InvalidMetadata, InvalidRequest

# Room for the multipart boundaries and part headers around the file bytes.
ENVELOPE_BYTES = 64 * 1024
SPOOL_MEMORY_BYTES = 1024 * 1024
READ_BLOCK = 256 * 1024
MAX_PARTS = 16
MAX_FIELD_BYTES = 16 * 1024
IDLE_TIMEOUT = 30.0
TOTAL_TIMEOUT = 300.0
_PARSE_LIMITER = CapacityLimiter(2)
"""At most two bodies are parsed at once, on their own threads: the shared thread pool stays free."""


@dataclass
class Upload:
    filename: str
    content_type: str | None
    data: bytes
    fields: dict[str, list[str]] = field(default_factory=dict)
    """The ``text_fields`` parts present, by name, in the order sent (a name may repeat)."""
    named: bool = True
    """The part had a filename (``filename`` is "upload" otherwise)."""


def _too_large(max_bytes: int) -> DocumentTooLarge:
    limit = f"{max_bytes // (1024 * 1024)} MB" if max_bytes >= 1024 * 1024 else f"{max_bytes} bytes"
    return DocumentTooLarge(f"the upload is larger than the {limit} limit")


async def read_upload(
    content_type: str | None,
    content_length: str | None,
    stream: AsyncIterator[bytes],
    *,
    field: str = "file",
    text_fields: tuple[str, ...] = (),
    max_bytes: int,
    max_parts: int = MAX_PARTS,
    idle_timeout: float = IDLE_TIMEOUT,
    total_timeout: float = TOTAL_TIMEOUT,
) -> Upload:
    """The one file part named ``field`` of a multipart/form-data body, checked while it streams in."""
    files, fields = await read_uploads(content_type, content_length, stream, field=field, text_fields=text_fields,
                                       max_bytes=max_bytes, max_files=1, max_total_bytes=max_bytes,
                                       max_parts=max_parts, idle_timeout=idle_timeout, total_timeout=total_timeout)
    files[0].fields = fields
    return files[0]


async def read_uploads(
    content_type: str | None,
    content_length: str | None,
    stream: AsyncIterator[bytes],
    *,
    field: str = "file",
    text_fields: tuple[str, ...] = (),
    max_bytes: int,
    max_files: int,
    max_total_bytes: int,
    max_parts: int | None = None,
    text_limits: Mapping[str, int] | None = None,
    idle_timeout: float = IDLE_TIMEOUT,
    total_timeout: float = TOTAL_TIMEOUT,
) -> tuple[list[Upload], dict[str, list[str]]]:
    """Every file part named ``field`` of a batch (at most ``max_files``, each at most ``max_bytes``, the body at
    most ``max_total_bytes``: 413 beyond; parts at most ``max_parts``, by default the files and MAX_PARTS more), in
    the order sent, and the ``text_fields`` parts shared by them all (a part named in ``text_limits`` may be that
    long, and the body that much longer; MAX_FIELD_BYTES otherwise)."""
    if max_parts is None:
        max_parts = max_files + MAX_PARTS
    ctype, params = parse_options_header(content_type or "")
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise InvalidRequest(f"send the document as multipart/form-data with a '{field}' part")
    text_limits = dict(text_limits or {})
    max_body = max_total_bytes + ENVELOPE_BYTES + sum(text_limits.values())
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError as exc:
            raise InvalidRequest("Content-Length is not a number") from exc
        if declared > max_body:
            raise _too_large(max_total_bytes)
    body = await _spool_body(stream, max_body, max_total_bytes, idle_timeout, total_timeout,
                             b"--" + params[b"boundary"], max_parts)
    try:
        return await to_thread.run_sync(
            _parse, body, params[b"boundary"], field, max_bytes, max_parts, text_fields, max_files, max_total_bytes,
            text_limits, limiter=_PARSE_LIMITER,
        )
    finally:
        body.close()


async def _spool_body(
    stream: AsyncIterator[bytes],
    max_body: int,
    max_bytes: int,
    idle_timeout: float,
    total_timeout: float,
    delimiter: bytes,
    max_parts: int,
) -> IO[bytes]:
    """The whole body in a spooled temporary file, size-, time- and part-checked chunk by chunk.

    Delimiters are counted as the body arrives (``bytes.count``: C speed, with the chunk seams
    covered), so a body of many tiny parts is refused after its first chunk, not after 50 MB.
    """
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115 - closed by the caller
    loop = asyncio.get_running_loop()
    deadline = loop.time() + total_timeout
    chunks = stream.__aiter__()
    received = 0
    delimiters = 0
    seam = b""
    try:
        while True:
            wait = min(idle_timeout, deadline - loop.time())
            try:
                if wait <= 0:
                    raise TimeoutError
                chunk = await asyncio.wait_for(chunks.__anext__(), wait)
            except StopAsyncIteration:
                break
            except TimeoutError as exc:
                raise UploadTimeout("the upload body did not arrive in time; send it again") from exc
            received += len(chunk)
            if received > max_body:
                raise _too_large(max_bytes)
            delimiters += (seam + chunk).count(delimiter)
            seam = chunk[-(len(delimiter) - 1):] if len(chunk) >= len(delimiter) - 1 else (seam + chunk)[-(len(delimiter) - 1):]
            if delimiters > max_parts + 1:  # n parts have n + 1 delimiters
                raise InvalidRequest(f"the form has more than {max_parts} parts")
            spool.write(chunk)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool


def _parse(body: IO[bytes], boundary: bytes, field: str, max_bytes: int, max_parts: int,
           text_fields: tuple[str, ...] = (), max_files: int = 1,
           max_total_bytes: int | None = None,
           text_limits: Mapping[str, int] | None = None) -> tuple[list[Upload], dict[str, list[str]]]:
    """Parse the spooled body (in a worker thread); each ``field`` part's data go through one spool in turn.
    With ``max_files`` 1 a second file part is ignored; with more, one past ``max_files`` is refused, and so
    are files whose bytes add up to more than ``max_total_bytes``."""
    state: dict[str, object] = {"headers": {}, "field": b"", "value": b"", "parts": 0}
    found: list[Upload] = []
    texts: dict[str, list[str]] = {}
    text = bytearray()
    current: dict[str, object] = {}
    data = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115 - closed below
    size = [0, 0]  # this file's bytes, all files' bytes

    def on_part_begin() -> None:
        state["parts"] = int(state["parts"]) + 1  # type: ignore[call-overload]
        if int(state["parts"]) > max_parts:  # type: ignore[call-overload]
            raise InvalidRequest(f"the form has more than {max_parts} parts")
        state["headers"] = {}
        current.clear()
        text.clear()

    def on_header_field(chunk: bytes, start: int, end: int) -> None:
        state["field"] = bytes(state["field"]) + chunk[start:end]  # type: ignore[arg-type]

    def on_header_value(chunk: bytes, start: int, end: int) -> None:
        state["value"] = bytes(state["value"]) + chunk[start:end]  # type: ignore[arg-type]

    def on_header_end() -> None:
        headers = state["headers"]
        assert isinstance(headers, dict)
        headers[bytes(state["field"]).lower()] = bytes(state["value"])  # type: ignore[arg-type]
        state["field"], state["value"] = b"", b""

    def on_headers_finished() -> None:
        headers = state["headers"]
        assert isinstance(headers, dict)
        _, disp = parse_options_header(headers.get(b"content-disposition", b""))
        current["name"] = disp.get(b"name", b"").decode("utf-8", "replace")
        current["filename"] = disp.get(b"filename", b"").decode("utf-8", "replace") if b"filename" in disp else None
        part_type = headers.get(b"content-type")
        current["content_type"] = part_type.decode("latin-1") if part_type else None
        current["take"] = current["name"] == field and len(found) < max_files
        if current["name"] == field and not current["take"] and max_files > 1:
            raise InvalidRequest(f"the form has more than {max_files} '{field}' parts")
        size[0] = 0
        data.seek(0)
        data.truncate()

    def on_part_data(chunk: bytes, start: int, end: int) -> None:
        if current.get("name") in text_fields and current.get("name") != field:
            text.extend(chunk[start:end])
            limit = (text_limits or {}).get(str(current.get("name")), MAX_FIELD_BYTES)
            if len(text) > limit:
                raise InvalidMetadata(f"the form field '{current.get('name')}' is larger than {limit} bytes")
            return
        if not current.get("take"):
            return
        size[0] += end - start
        size[1] += end - start
        if size[0] > max_bytes:
            raise _too_large(max_bytes)
        if max_total_bytes is not None and size[1] > max_total_bytes:
            raise _too_large(max_total_bytes)
        data.write(chunk[start:end])

    def on_part_end() -> None:
        name = current.get("name")
        if name in text_fields and name != field:
            try:
                texts.setdefault(str(name), []).append(bytes(text).decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InvalidMetadata(f"the form field '{name}' is not UTF-8 text") from exc
            text.clear()
            return
        if current.get("take"):
            data.seek(0)
            found.append(
                Upload(
                    filename=str(current.get("filename") or "upload"),
                    content_type=current.get("content_type"),  # type: ignore[arg-type]
                    data=data.read(),
                    named=bool(current.get("filename")),
                )
            )

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    with data:
        try:
            while block := body.read(READ_BLOCK):
                parser.write(block)
            parser.finalize()
        except (DocumentTooLarge, InvalidRequest):  # InvalidMetadata is an InvalidRequest
            raise
        except Exception as exc:  # noqa: BLE001 - python-multipart raises its own parse errors
            raise InvalidRequest("the multipart body is malformed") from exc
    if not found:
        raise InvalidRequest(f"the form has no '{field}' file part")
    return found, texts
