"""Reading a multipart upload without trusting its size: the body is parsed as it streams in.

A declared ``Content-Length`` over the limit is refused before a byte is read; otherwise the
stream is fed to python-multipart chunk by chunk and refused (413 ``DOCUMENT_TOO_LARGE``) as soon
as the body or the file part passes the limit. At most ``max_bytes`` of file data are held.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from python_multipart.multipart import MultipartParser, parse_options_header

from pipelines.domain.errors import DocumentTooLarge, InvalidRequest

# Room for the multipart boundaries and part headers around the file bytes.
ENVELOPE_BYTES = 64 * 1024


@dataclass
class Upload:
    filename: str
    content_type: str | None
    data: bytes


def _too_large(max_bytes: int) -> DocumentTooLarge:
    limit = f"{max_bytes // (1024 * 1024)} MB" if max_bytes >= 1024 * 1024 else f"{max_bytes} bytes"
    return DocumentTooLarge(f"the upload is larger than the {limit} limit")


async def read_upload(
    content_type: str | None,
    content_length: str | None,
    stream: AsyncIterator[bytes],
    *,
    field: str = "file",
    max_bytes: int,
) -> Upload:
    """The one file part named ``field`` of a multipart/form-data body, size-checked while streaming."""
    ctype, params = parse_options_header(content_type or "")
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise InvalidRequest(f"send the document as multipart/form-data with a '{field}' part")
    max_body = max_bytes + ENVELOPE_BYTES
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError as exc:
            raise InvalidRequest("Content-Length is not a number") from exc
        if declared > max_body:
            raise _too_large(max_bytes)

    state: dict[str, object] = {"headers": {}, "field": b"", "value": b""}
    found: list[Upload] = []
    current: dict[str, object] = {}
    buffer = bytearray()

    def on_part_begin() -> None:
        state["headers"] = {}
        current.clear()
        buffer.clear()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["field"] = bytes(state["field"]) + data[start:end]  # type: ignore[arg-type]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["value"] = bytes(state["value"]) + data[start:end]  # type: ignore[arg-type]

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

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if current.get("name") != field:
            return
        buffer.extend(data[start:end])
        if len(buffer) > max_bytes:
            raise _too_large(max_bytes)

    def on_part_end() -> None:
        if current.get("name") == field and not found:
            found.append(
                Upload(
                    filename=str(current.get("filename") or "upload"),
                    content_type=current.get("content_type"),  # type: ignore[arg-type]
                    data=bytes(buffer),
                )
            )
        buffer.clear()

    parser = MultipartParser(
        params[b"boundary"],
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
    received = 0
    async for chunk in stream:
        received += len(chunk)
        if received > max_body:
            raise _too_large(max_bytes)
        try:
            parser.write(chunk)
        except (DocumentTooLarge, InvalidRequest):
            raise
        except Exception as exc:  # noqa: BLE001 - python-multipart raises its own parse errors
            raise InvalidRequest("the multipart body is malformed") from exc
    try:
        parser.finalize()
    except Exception as exc:  # noqa: BLE001
        raise InvalidRequest("the multipart body is malformed") from exc
    if not found:
        raise InvalidRequest(f"the form has no '{field}' file part")
    return found[0]
