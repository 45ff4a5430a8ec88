"""HTTP errors of the API and the one table mapping every KbindexError code to an HTTP status.

Every error body is ``{"error": {"code": STABLE_CODE, "message": sanitized}}``: never a stack
trace, SQL or a server path (messages go through ``sanitize_message``).
"""

from __future__ import annotations

from pipelines.domain.errors import (
    DocumentTooLarge,
    EmbeddingError,
    IllegalTransition,
    IndexWriteFailed,
    InvalidRequest,
    KbindexError,
    TaskNotFound,
    sanitize_message,
)


class Unauthorized(KbindexError):
    """A valid bearer token is required."""

    code = "UNAUTHORIZED"
    retryable = False


class NotFound(KbindexError):
    """There is no such resource for this tenant."""

    code = "NOT_FOUND"
    retryable = False


class ServiceUnavailable(KbindexError):
    """The server cannot serve this now; try again later."""

    code = "SERVICE_UNAVAILABLE"


def status_for(exc: KbindexError) -> int:
    if isinstance(exc, Unauthorized):
        return 401
    if isinstance(exc, (TaskNotFound, NotFound)):
        return 404
    if isinstance(exc, IllegalTransition):
        return 409
    if isinstance(exc, DocumentTooLarge):
        return 413
    if isinstance(exc, InvalidRequest):
        return 400
    if isinstance(exc, (IndexWriteFailed, EmbeddingError, ServiceUnavailable)):
        return 503
    return 500


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": sanitize_message(message)}}
