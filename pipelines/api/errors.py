"""HTTP errors of the API and the one table mapping every KbindexError code to an HTTP status.

Every error body is ``{"error": {"code": STABLE_CODE, "message": sanitized}}``: never a stack
trace, SQL or a server path (messages go through ``sanitize_message``).
"""

from __future__ import annotations

from pipelines.domain.errors import (
    DocumentTooLarge,
    EmbeddingError,
    Forbidden,
    IllegalTransition,
    IndexWriteFailed,
    InvalidRequest,
    KbindexError,
    QuotaExceeded,
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


class NotImplementedYet(KbindexError):
    """A documented request this server does not perform yet (HTTP 501); the message says what to do instead."""

    code = "NOT_IMPLEMENTED"
    retryable = False


class TooManyRequests(KbindexError):
    """This tenant has too many of these open at once; close one or try again shortly (HTTP 429)."""

    code = "TOO_MANY_REQUESTS"


class UploadTimeout(KbindexError):
    """The request body did not arrive in time (HTTP 408)."""

    code = "UPLOAD_TIMEOUT"


def status_for(exc: KbindexError) -> int:
    if isinstance(exc, Unauthorized):
        return 401
    if isinstance(exc, Forbidden):  # a subclass of InvalidRequest: checked before it
        return 403
    if isinstance(exc, (TaskNotFound, NotFound)):
        return 404
    if isinstance(exc, IllegalTransition):
        return 409
    if isinstance(exc, DocumentTooLarge):
        return 413
    if isinstance(exc, InvalidRequest):
        return 400
    if isinstance(exc, TooManyRequests):
        return 429
    if isinstance(exc, NotImplementedYet):
        return 501
    if isinstance(exc, UploadTimeout):
        return 408
    if isinstance(exc, QuotaExceeded):
        return 507
    if isinstance(exc, (IndexWriteFailed, EmbeddingError, ServiceUnavailable)):
        return 503
    return 500


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": sanitize_message(message)}}
