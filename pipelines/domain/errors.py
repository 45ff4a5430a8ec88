"""The one error hierarchy of kbindex, each error carrying its stable code.

    KbindexError                      code, retryable, message (short, sanitized)
    ├── DocumentError                 permanent: the document itself is the problem
    │   ├── UnsupportedDocument       UNSUPPORTED_DOCUMENT
    │   ├── ParseError                PARSE_ERROR
    │   ├── EncryptedDocument         ENCRYPTED_DOCUMENT
    │   ├── EmptyDocument             EMPTY_DOCUMENT
    │   ├── DocumentTooLarge          DOCUMENT_TOO_LARGE
    │   ├── BlobNotFound              BLOB_NOT_FOUND
    │   └── DependencyMissing         DEPENDENCY_MISSING: a library this file needs is not installed
    ├── EmbeddingError
    │   ├── EmbeddingInvalidResponse  EMBEDDING_INVALID_RESPONSE (permanent)
    │   ├── EmbeddingTimeout          EMBEDDING_TIMEOUT (transient)
    │   ├── EmbeddingRateLimited      EMBEDDING_RATE_LIMITED (transient)
    │   └── EmbeddingUnavailable      EMBEDDING_UNAVAILABLE (transient)
    ├── IndexWriteFailed              INDEX_WRITE_FAILED (transient; database errors land here)
    ├── RunCrashed                    RUN_CRASHED (transient)
    │   (bookkeeping codes, no class: LEASE_ATTEMPTS_EXHAUSTED, RUN_NEVER_STARTED; see BOOKKEEPING_CODES)
    ├── InternalError                 INTERNAL_ERROR (retried a bounded number of times)
    ├── InvalidRequest                INVALID_REQUEST: bad tenant, document id, profile name... (HTTP 400)
    │   ├── SourceOverlap             SOURCE_OVERLAP: two sources of a tenant could name the same document
    │   └── RetentionWindowTooShort   RETENTION_WINDOW_TOO_SHORT: a retention run's window under the floor
    ├── SourceFileUnreadable          SOURCE_FILE_UNREADABLE: a source's file could not be read (permissions, I/O)
    ├── QuotaExceeded                 QUOTA_EXCEEDED: the tenant's stored bytes or live versions would pass a quota (HTTP 507)
    ├── ArtifactUntrusted             ARTIFACT_UNTRUSTED: a run artifact another user owns or could write (not loaded)
    └── QueueError                    refusals of the task queue, not task failures
        ├── FenceRejected             a fenced write changed nothing
        │   ├── LeaseLost             the lease expired or was taken over
        │   └── TaskCancelled         the task was cancelled while this run held it
        ├── IllegalTransition         the state machine forbids it (CLI exit 3, HTTP 409)
        └── TaskNotFound              no such task (HTTP 404)

Retry policy is keyed on the code (``is_retryable``), never on message text.
"""

from __future__ import annotations

import re

PERMANENT_CODES = frozenset(
    {
        "UNSUPPORTED_DOCUMENT",
        "PARSE_ERROR",
        "ENCRYPTED_DOCUMENT",
        "EMPTY_DOCUMENT",
        "DOCUMENT_TOO_LARGE",
        "BLOB_NOT_FOUND",
        "DEPENDENCY_MISSING",
        "EMBEDDING_INVALID_RESPONSE",
    }
)
TRANSIENT_CODES = frozenset(
    {
        "EMBEDDING_TIMEOUT",
        "EMBEDDING_RATE_LIMITED",
        "EMBEDDING_UNAVAILABLE",
        "INDEX_WRITE_FAILED",
        "RUN_CRASHED",
        "INTERNAL_ERROR",
    }
)
# LEASE_ATTEMPTS_EXHAUSTED: leases ran out with no attempts left. RUN_NEVER_STARTED: the task's runs were
# created and never began, KBINDEX_RESERVATION_GIVEBACKS times (the daemon or the run launcher is broken).
BOOKKEEPING_CODES = frozenset({"LEASE_ATTEMPTS_EXHAUSTED", "RUN_NEVER_STARTED"})
ALL_CODES = PERMANENT_CODES | TRANSIENT_CODES | BOOKKEEPING_CODES

MAX_MESSAGE_CHARS = 300


def is_retryable(code: str) -> bool:
    """Whether a task failing with ``code`` may be tried again (unknown codes: yes, bounded)."""
    return code not in PERMANENT_CODES and code not in BOOKKEEPING_CODES


_URL_CREDENTIALS_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)[^/\s@]*@")
_PATH_RE = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-+@~ ]+){2,}/?")
_SQL_RE = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|FROM|WHERE)\b.*", re.IGNORECASE | re.DOTALL)


def sanitize_message(message: str) -> str:
    """Short, single-line, no server paths, no SQL, no traceback: safe to show an API caller."""
    first = next((line.strip() for line in str(message).splitlines() if line.strip()), "")
    first = first.replace("Traceback (most recent call last):", "").strip()
    first = _URL_CREDENTIALS_RE.sub(r"\1<credentials>@", first)  # https://AKIA:secret@host -> https://<credentials>@host
    first = _PATH_RE.sub("<path>", first)
    first = _SQL_RE.sub("<sql>", first)
    if len(first) > MAX_MESSAGE_CHARS:
        first = first[: MAX_MESSAGE_CHARS - 1] + "…"
    return first


class KbindexError(Exception):
    """Base of every error kbindex raises on purpose."""

    code: str = "INTERNAL_ERROR"
    retryable: bool = True

    def __init__(self, message: str = "", **data: object) -> None:
        self.message = sanitize_message(message or self.__class__.__doc__ or self.code)
        self.data = data
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class DocumentError(KbindexError):
    retryable = False


class UnsupportedDocument(DocumentError):
    """The file type is not one kbindex can read."""

    code = "UNSUPPORTED_DOCUMENT"


class ParseError(DocumentError):
    """The file is damaged or not what its name says."""

    code = "PARSE_ERROR"


class EncryptedDocument(DocumentError):
    """The file is password-protected."""

    code = "ENCRYPTED_DOCUMENT"


class EmptyDocument(DocumentError):
    """The file has no text to index."""

    code = "EMPTY_DOCUMENT"


class DocumentTooLarge(DocumentError):
    """The file exceeds a size, page or character limit."""

    code = "DOCUMENT_TOO_LARGE"


class BlobNotFound(DocumentError):
    """The stored bytes of this version are missing."""

    code = "BLOB_NOT_FOUND"


class DependencyMissing(DocumentError):
    """The file is fine, but reading it needs a Python package that is not installed.

    Permanent until an operator installs the package (the message names it); then ``kbindex retry``.
    """

    code = "DEPENDENCY_MISSING"

    @classmethod
    def for_package(cls, label: str, package: str, why: str) -> DependencyMissing:
        return cls(f"{label}: {why} needs the Python package '{package}', which is not installed; "
                   f"install it (pip install '{package}') and retry the task", package=package)


class EmbeddingError(KbindexError):
    pass


class EmbeddingInvalidResponse(EmbeddingError):
    """The embedder answered with the wrong count, order, model or dimension."""

    code = "EMBEDDING_INVALID_RESPONSE"
    retryable = False


class EmbeddingTimeout(EmbeddingError):
    """The embedder did not answer in time."""

    code = "EMBEDDING_TIMEOUT"


class EmbeddingRateLimited(EmbeddingError):
    """The embedder asked us to slow down."""

    code = "EMBEDDING_RATE_LIMITED"


class EmbeddingUnavailable(EmbeddingError):
    """The embedder could not be reached or loaded."""

    code = "EMBEDDING_UNAVAILABLE"


class IndexWriteFailed(KbindexError):
    """The database refused or lost a write; it is safe to try again."""

    code = "INDEX_WRITE_FAILED"


class RunCrashed(KbindexError):
    """The run process died before it could record an outcome."""

    code = "RUN_CRASHED"


class InternalError(KbindexError):
    """Something unexpected happened; it is retried a bounded number of times."""

    code = "INTERNAL_ERROR"


class InvalidRequest(KbindexError):
    """The request itself is malformed (an identifier, a limit, a name)."""

    code = "INVALID_REQUEST"
    retryable = False


class InvalidMetadata(InvalidRequest):
    """A version's metadata or allow list breaks the rules (key names, value types, sizes)."""

    code = "INVALID_METADATA"


class InvalidFilter(InvalidRequest):
    """A search filter or principal cannot be understood."""

    code = "INVALID_FILTER"


class Forbidden(InvalidRequest):
    """The caller's token does not carry the right this request needs."""

    code = "FORBIDDEN"


class SourceOverlap(InvalidRequest):
    """Two sources of one tenant could name the same document (same relative path, same id prefix): one
    source's file would overwrite the other's document, or its vanishing delete it. Give one a ``--prefix``."""

    code = "SOURCE_OVERLAP"


class RetentionWindowTooShort(InvalidRequest):
    """A retention run asked for a window shorter than KBINDEX_RETENTION_MIN_WINDOW_SECONDS: nothing deleted."""

    code = "RETENTION_WINDOW_TOO_SHORT"


class SourceFileUnreadable(KbindexError):
    """A file a source listed could not be read (permission denied, an I/O error): the source's ledger records it,
    and a pass tries it again when its size or stamp moves, or on ``--retry-failed``."""

    code = "SOURCE_FILE_UNREADABLE"


class QuotaExceeded(KbindexError):
    """The tenant's stored document bytes or live document versions would pass its quota (the message says which)."""

    code = "QUOTA_EXCEEDED"
    retryable = False


class ArtifactUntrusted(KbindexError):
    """A stored run artifact is owned by another user, writable by group or others, or a symbolic link.

    Artifacts are pickles: loading one runs whatever its writer put in it. Such a file is never loaded.
    """

    code = "ARTIFACT_UNTRUSTED"


class DevAlreadyRunning(KbindexError):
    """Another `kbindex dev` holds this KBINDEX_HOME: a second would start a second Dagster daemon on the same
    instance and take over the embedding service's socket."""

    code = "DEV_ALREADY_RUNNING"
    retryable = False


class QueueError(KbindexError):
    """The task queue refused an operation (not a task failure)."""

    retryable = False


class FenceRejected(QueueError):
    """A fenced write changed nothing: this run no longer holds the lease."""

    code = "FENCE_REJECTED"


class LeaseLost(FenceRejected):
    """The lease expired or another run took the task over."""

    code = "LEASE_LOST"


class TaskCancelled(FenceRejected):
    """The task was cancelled while this run held it."""

    code = "TASK_CANCELLED"


class IllegalTransition(QueueError):
    """The task state machine does not allow this change."""

    code = "ILLEGAL_TRANSITION"


class TaskNotFound(QueueError):
    """There is no such task."""

    code = "TASK_NOT_FOUND"


_BY_CODE: dict[str, type[KbindexError]] = {
    cls.code: cls
    for cls in (
        UnsupportedDocument,
        ParseError,
        EncryptedDocument,
        EmptyDocument,
        DocumentTooLarge,
        BlobNotFound,
        DependencyMissing,
        EmbeddingInvalidResponse,
        EmbeddingTimeout,
        EmbeddingRateLimited,
        EmbeddingUnavailable,
        IndexWriteFailed,
        RunCrashed,
        InternalError,
    )
}


def error_for_code(code: str, message: str = "") -> KbindexError:
    """Rebuild a typed error from a stored code (used by fault injection and tests)."""
    return _BY_CODE.get(code, InternalError)(message)


def classify(exc: BaseException) -> KbindexError:
    """Map any exception to a typed error with a stable code: the one translation point for run failures."""
    if isinstance(exc, KbindexError):
        return exc
    if isinstance(exc, TimeoutError):
        return EmbeddingTimeout(str(exc) or "timed out")
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return DependencyMissing.for_package("document", exc.name.partition(".")[0], "processing")
    if isinstance(exc, MemoryError):
        return DocumentTooLarge("ran out of memory while processing the document")
    name = type(exc).__name__
    return InternalError(f"{name}: {exc}" if str(exc) else name)
