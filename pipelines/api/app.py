"""The kbindex HTTP API: publish, follow and control index tasks, see document status, search, metrics.

``create_app(db_url=None, ...)`` builds the FastAPI app (OpenAPI at ``/openapi.json``; Swagger UI at ``/docs``
only with KBINDEX_API_DOCS=1; security headers on every response: pipelines.api.security):

    GET    /                                  status page (overview, upload, live progress, documents, search)
    GET    /whoami                            the tenant this token acts as, its kind and principals
    GET    /overview                          tasks by status, work in flight (bar, rate, ETA), failures by code
    POST   /documents/{document_id}/versions  multipart 'file' (+ 'metadata' JSON, 'allow' principals) -> 202 + task
                                              (new, or CANCELLED re-queued) | 200 + same task
    GET    /documents                         the tenant's documents with their status, a page at a time
                                              (?task_status=, ?error_code=, ?cursor= from X-Next-Cursor)
    GET    /documents/{document_id}           latest vs searchable version: INDEXING | SEARCHABLE | FAILED | STALE
                                              | DELETING | DELETED
    DELETE /documents/{document_id}           delete: a tombstone version -> 202 + its task | 200 when already
                                              deleted (same task) or never published (nothing to delete);
                                              ?erase=true erases: the delete, then the purge of every
                                              stored copy -> 200 + receipt (removed per kind, not_removed)
    GET    /tasks                             the tenant's tasks, newest first
    GET    /tasks/{task_id}                   status, stage, completed/total, percent, attempts, error, can_cancel/retry
    GET    /tasks/{task_id}/events            Server-Sent Events, resumable with Last-Event-ID
    DELETE /tasks/{task_id}                   cancel (409 with the reason when not allowed)
    POST   /tasks/{task_id}/retry             manual retry of a DEAD or CANCELLED task (409 otherwise)
    GET    /search?q=&k=&as=&filter=          search over the active profile, on behalf of principals, filtered
    GET    /metrics                           Prometheus text from the database, cached KBINDEX_METRICS_CACHE_SECONDS (15)
    GET    /healthz                           liveness: the process answers (never asks the database)
    GET    /readyz                            readiness: the database answers (503 within ~5 s when it does not)

Document ids may contain '/': the routes use ``{document_id:path}``. Every route but ``/``,
``/healthz``, ``/readyz`` and ``/metrics`` needs ``Authorization: Bearer <token>`` (pipelines.api.auth) and
sees only its tenant's data: another tenant's task or document answers 404. Errors are
``{"error": {"code": CODE, "message": sanitized}}`` (pipelines.api.errors).

Permissions (DESIGN.md invariant 8; pipelines.api.auth says what each kind of token may do): every route that
returns document data (search, documents, tasks, events, the overview) reads on behalf of the caller's
principals, in SQL (sql/queries/api.sql): a version whose allow list excludes them answers 404 or is left out
of a listing, exactly as another tenant's, and so is every version of a document whose search pointer
names such a version (a narrowed allow list hides the document from every route at the pointer flip, as from
search). Whole-tenant and service tokens may name the principals of a read with ``as=`` (repeatable); an
end-user token naming them gets 403 FORBIDDEN, and so do end-user and service tokens on every write.
Allow lists are shown (``allow``) to whole-tenant tokens only: they name other users and groups.

Environment: ``KBINDEX_DATABASE_URL`` (else the embedded PostgreSQL), ``KBINDEX_API_TOKENS`` (token
file), ``KBINDEX_API_MAX_UPLOAD_BYTES`` (default 50 MiB), ``KBINDEX_METRICS_TOKEN`` (/metrics needs
it as a bearer token; without it /metrics answers 401 unless ``KBINDEX_METRICS_PUBLIC=1``),
``KBINDEX_BLOB_URL``, ``KBINDEX_TENANT_QUOTA_BYTES``.

One tenant cannot take the service down for the others: event streams share one LISTEN connection
and are capped per tenant (429) and per process (503); uploads are capped per tenant (429) and per
process (503), spooled to disk, parsed off the event loop and timed out (408); /metrics is cached.
Searches are capped per tenant (429) and per process (503) and run on their own threads (a CapacityLimiter
of ``max_searches``), never on the shared pool the other routes and the token check use; a query embedding
through an HTTP provider gives up within $KBINDEX_SEARCH_EMBED_SECONDS (5) with its typed 503, Retry-After
when the provider gave one. ``/``, ``/healthz`` and ``/readyz`` take no thread from the shared pool either.

PostgreSQL away (a partition, a restart): ``/``, ``/healthz`` and a fresh ``/metrics`` answer as usual; every
route that reads or writes (the bearer token is checked in the database too) answers 503
``INDEX_WRITE_FAILED`` within about 5 s and never hangs: API connections give up on a silent link after
about 5 s and a request waits at most 4 s for a pooled connection (``KBINDEX_PG_API_*``,
resources.settings.ConnectionBounds). Open event streams stay open (keep-alive comments) and resume with
the events they missed once PostgreSQL is back (pipelines.api.sse).
"""


import json
import logging  # no `from __future__ import annotations`: FastAPI resolves the local Annotated aliases at runtime
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from datetime import datetime
from dataclasses import asdict, is_dataclass
from importlib import resources as importlib_resources
from typing import Annotated, Any

from anyio import CapacityLimiter, to_thread
from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipelines.api.auth import Caller, TokenAuth, install_log_redaction
from pipelines.api.errors import NotFound, ServiceUnavailable, Unauthorized, error_body, status_for
from pipelines.api.limits import Admission
from pipelines.api.metrics import ScrapeCache, build_registry
from pipelines.api.sse import EventHub, TaskStream
from pipelines.api.security import DOCS_CSP, SecurityHeaders, docs_enabled, page_csp
from pipelines.api.uploads import read_upload, read_uploads
from pipelines.api.views import (
    PAGE_SCAN_BUDGET,
    RATE_WINDOW_SECONDS,
    SCOPED_SCAN_TASKS,
    TASK_STATUSES,
    decode_cursor,
    document_json,
    encode_cursor,
    overview_json,
    task_json,
)
from pipelines.domain.errors import EmbeddingRateLimited, InvalidMetadata, InvalidRequest, KbindexError, TaskNotFound
from pipelines.domain.manifest import read_manifest
from pipelines.domain.metadata import ReadScope
from pipelines.domain.identifiers import validate_document_id
from pipelines.domain.task_states import TERMINAL, TaskStatus
from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.eraser import Eraser
from resources.database import Database
from resources.publisher import BATCH_BYTES, BATCH_DOCUMENTS, PublishRequest, Publisher, PublishResult
from resources.task_queue import TaskQueue

log = logging.getLogger("kbindex.api")

DEFAULT_MAX_UPLOAD_BYTES = 50 * 1024 * 1024
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
"""A batch's manifest part: about 4 KiB a document at the default 1,000 (a version's metadata is at most 8 KiB)."""
DEFAULT_METRICS_CACHE_SECONDS = 15.0
HTTP_CODES = {400: "INVALID_REQUEST", 401: "UNAUTHORIZED", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED",
              413: "DOCUMENT_TOO_LARGE", 415: "INVALID_REQUEST"}
SearchFn = Callable[..., Any]

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            "required": ["code", "message"],
        }
    },
}


def _err(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_SCHEMA}}}


COMMON_ERRORS: dict[int | str, dict[str, Any]] = {401: _err("Missing or invalid bearer token (UNAUTHORIZED)")}
TASK_ERRORS: dict[int | str, dict[str, Any]] = {**COMMON_ERRORS, 404: _err("No such task for this tenant (TASK_NOT_FOUND)")}
READ_ERRORS: dict[int | str, dict[str, Any]] = {
    **COMMON_ERRORS,
    400: _err("A malformed principal in as= (INVALID_FILTER)"),
    403: _err("An end-user token named principals with as= (FORBIDDEN)"),
}
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    **COMMON_ERRORS, 403: _err("End-user and service tokens are read-only (FORBIDDEN)")}
AS_DESCRIPTION = ("Read on behalf of these principals (repeatable: as=group:finance&as=user:alice). Service "
                  "tokens (search_as) and whole-tenant tokens only; without it a service token sees only versions "
                  "without an allow list, a whole-tenant token everything, an end-user token its own principals.")


class Reading:
    """A read request's caller and scope: whose data (``tenant_id``) on whose behalf (``scope``)."""

    def __init__(self, caller: Caller, scope: ReadScope) -> None:
        self.caller, self.scope = caller, scope

    @property
    def tenant_id(self) -> str:
        return self.caller.tenant_id

    @property
    def show_allow(self) -> bool:
        """Allow lists name other users and groups: only a whole-tenant token sees them."""
        return self.caller.whole_tenant

    def params(self) -> dict[str, Any]:
        """The SQL parameters of the scope (tenant, principals, see_all) for the api_* statements."""
        return {"tenant_id": self.tenant_id, "principals": list(self.scope.principals), "see_all": self.scope.see_all}


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return _jsonable(value.to_dict())
    if is_dataclass(value) and not isinstance(value, type):
        return _jsonable(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _multipart_body(file_schema: dict[str, Any], metadata_for: str, allow_for: str,
                    **more_parts: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI request body of a publish form: the file part(s), optional metadata, allow and ``more_parts``."""
    properties = {
        "file": file_schema,
        "metadata": {"type": "string", "description": f"A JSON object of metadata{metadata_for}"},
        "allow": {"type": "array", "items": {"type": "string"}, "description": f"Principals that may read {allow_for}"},
        **more_parts,
    }
    schema = {"type": "object", "properties": properties, "required": ["file"]}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


def _batch_result(document_id: str, outcome: "PublishResult | KbindexError") -> dict[str, Any]:
    """One document's entry in a batch publish's answer: what its single publish would have answered."""
    if isinstance(outcome, KbindexError):
        return {"document_id": document_id, "status": status_for(outcome), **error_body(outcome.code, outcome.message)}
    return {"document_id": outcome.document_id, "status": 202 if outcome.created or outcome.requeued else 200,
            "task_id": outcome.task_id, "version_number": outcome.version, "task_status": outcome.status,
            "location": f"/tasks/{outcome.task_id}"}


def _metadata_fields(fields: Mapping[str, list[str]]) -> tuple[dict[str, Any] | None, list[str] | None]:
    """A publish form's ``metadata`` (one JSON object) and ``allow`` parts (each a principal, or a JSON array of
    them) as Publisher.publish takes them; INVALID_METADATA when they cannot be read (the publisher checks the
    rest, before anything is stored)."""
    metadata: dict[str, Any] | None = None
    texts = fields.get("metadata") or []
    if len(texts) > 1:
        raise InvalidMetadata("send metadata as one JSON object, in one 'metadata' part")
    if texts and texts[0].strip():
        try:
            metadata = json.loads(texts[0])
        except ValueError as exc:
            raise InvalidMetadata("the 'metadata' part is not valid JSON") from exc
        if not isinstance(metadata, dict):
            raise InvalidMetadata("metadata must be a JSON object of key/value pairs")
    allow: list[str] | None = None
    for text in fields.get("allow") or []:
        text = text.strip()
        if text.startswith("["):
            try:
                items = json.loads(text)
            except ValueError as exc:
                raise InvalidMetadata("an 'allow' part starting with [ must be a JSON array of principals") from exc
            if not isinstance(items, list):
                raise InvalidMetadata("an 'allow' part is a principal or a JSON array of principals")
        else:
            items = [text]
        allow = (allow or []) + items
    return metadata, allow


def _default_search() -> SearchFn:
    try:
        from resources.search import search
    except ImportError as exc:
        raise ServiceUnavailable("search is not available in this installation") from exc
    return search


def _default_embedder() -> Any:
    """The active profile's embedder at each request (a warm embedding service if one answers), so
    `kbindex profile activate` to another model is followed without a restart (issue #12, defect 9)."""
    from resources.embedder import ProfileEmbedders
    from resources.settings import Settings

    return ProfileEmbedders(home=Settings.from_env().home)


class _StreamResponse(EventSourceResponse):
    """An event stream that gives its admission back however it ends, even if its body never started."""

    def __init__(self, stream: TaskStream, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stream = stream

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stream.close()


def _status_page() -> str:
    return importlib_resources.files("pipelines.api").joinpath("templates/index.html").read_text(encoding="utf-8")


def create_app(
    db_url: str | None = None,
    *,
    db: Database | None = None,
    tokens: Mapping[str, str] | None = None,
    tokens_file: str | None = None,
    blob_url: str | None = None,
    artifacts_dir: str | None = None,
    embedder: Any | None = None,
    search_fn: SearchFn | None = None,
    max_upload_bytes: int | None = None,
    fast_publish: bool | None = None,
    metrics_token: str | None = None,
    metrics_public: bool | None = None,
    metrics_cache_seconds: float | None = None,
    ping_seconds: float = 15.0,
    poll_seconds: float = 5.0,
    max_streams: int = 200,
    max_streams_per_tenant: int = 20,
    max_uploads: int = 8,
    max_uploads_per_tenant: int = 2,
    max_searches: int = 32,
    max_searches_per_tenant: int = 8,
    upload_idle_timeout: float = 30.0,
    upload_total_timeout: float = 300.0,
    max_batch_files: int = BATCH_DOCUMENTS,
    max_batch_bytes: int | None = None,
) -> FastAPI:
    """The API on ``db`` or ``db_url`` (default: KBINDEX_DATABASE_URL or the embedded server)."""
    from resources.chunk_copy import FastPublish, fast_publish_for
    from resources.settings import Settings, resolve_database_url

    settings = Settings.from_env()
    owns_db = db is None
    if db is None:
        db = Database(db_url or resolve_database_url(settings), min_size=1, max_size=10, role="api")
    if max_upload_bytes is None:
        max_upload_bytes = int(os.environ.get("KBINDEX_API_MAX_UPLOAD_BYTES") or DEFAULT_MAX_UPLOAD_BYTES)
    if max_batch_bytes is None:
        max_batch_bytes = int(os.environ.get("KBINDEX_API_MAX_BATCH_BYTES") or BATCH_BYTES)
    if metrics_token is None:
        metrics_token = os.environ.get("KBINDEX_METRICS_TOKEN") or None
    auth = TokenAuth.from_sources(db, tokens, tokens_file)
    install_log_redaction()
    queue = TaskQueue(db)
    publisher = Publisher(db, BlobStore(blob_url or settings.blob_url), max_bytes=max_upload_bytes,
                          fast=fast_publish_for(db) if fast_publish is None else FastPublish(db, queue) if fast_publish else None)
    eraser = Eraser(db, publisher.blobs, ArtifactStore(artifacts_dir or settings.artifacts_dir or settings.home / "artifacts"))
    if metrics_public is None:
        metrics_public = os.environ.get("KBINDEX_METRICS_PUBLIC", "").lower() in ("1", "true", "yes")
    if metrics_cache_seconds is None:
        metrics_cache_seconds = float(os.environ.get("KBINDEX_METRICS_CACHE_SECONDS") or DEFAULT_METRICS_CACHE_SECONDS)
    scrapes = ScrapeCache(build_registry(db), metrics_cache_seconds)
    metrics_limiter = CapacityLimiter(1)  # one scrape computation at a time; other scrapers wait without a thread
    page = _status_page().replace("{{max_upload_bytes}}", str(max_upload_bytes))
    state: dict[str, Any] = {"embedder": embedder}
    uploads = Admission("uploads", per_tenant=max_uploads_per_tenant, total=max_uploads)
    searches = Admission("searches", per_tenant=max_searches_per_tenant, total=max_searches)
    search_threads = CapacityLimiter(max_searches)  # searches never take the shared pool's 40 threads
    health_threads = CapacityLimiter(2)  # nor does /readyz: it answers while that pool is busy
    hub = EventHub(db, max_streams=max_streams, max_streams_per_tenant=max_streams_per_tenant)

    def close() -> None:
        if owns_db:
            db.close()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        close()

    app = FastAPI(
        title="kbindex",
        version="0.1.0",
        summary="Publish document versions, follow their index tasks live, search what is searchable.",
        description=(
            "Authenticate with `Authorization: Bearer <token>`; each token belongs to one tenant and sees only "
            "that tenant's documents and tasks. A whole-tenant token reads everything and may write; an end-user "
            "token reads as its fixed principals; a service token reads as the principals it names with `as=` "
            "(without them, only versions without an allow list). End-user and service tokens are read-only "
            "(403 FORBIDDEN). A version the caller may not read answers 404 like a missing one. "
            "Errors are `{\"error\": {\"code\", \"message\"}}` with stable codes."
        ),
        lifespan=lifespan,
        docs_url="/docs" if docs_enabled() else None,  # Swagger UI loads a CDN's script: off unless asked for
        redoc_url="/redoc" if docs_enabled() else None,
    )
    app.add_middleware(SecurityHeaders, policies={"/": page_csp(page), "/docs": DOCS_CSP, "/redoc": DOCS_CSP})
    app.state.db = db
    app.state.queue = queue
    app.state.event_hub = hub
    app.state.searches = searches
    app.state.close = close

    # -- errors ------------------------------------------------------------------------------

    @app.exception_handler(KbindexError)
    async def kbindex_error(_: Request, exc: KbindexError) -> JSONResponse:
        status = status_for(exc)
        if status >= 500:
            # A refusal to admit more work, or a provider's rate limit, is routine under load: no traceback for it.
            routine = isinstance(exc, (ServiceUnavailable, EmbeddingRateLimited))
            log.warning("request failed: %s", exc.code, exc_info=None if routine else exc)
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        wait = exc.data.get("wait") if isinstance(exc, EmbeddingRateLimited) else None
        if isinstance(wait, int) and wait > 0:  # the provider's pause (at most 300 s): when a retry may pass
            headers = {"Retry-After": str(wait)}
        return JSONResponse(error_body(exc.code, exc.message), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors()[:3]:
            where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "path", "header", "body"))
            parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
        return JSONResponse(error_body("INVALID_REQUEST", "; ".join(parts) or "invalid request"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_CODES.get(exc.status_code, "INTERNAL_ERROR" if exc.status_code >= 500 else "INVALID_REQUEST")
        message = exc.detail if isinstance(exc.detail, str) else code
        return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc)  # the trace stays in the server log
        return JSONResponse(error_body("INTERNAL_ERROR", "an internal error occurred"), status_code=500)

    # -- auth --------------------------------------------------------------------------------

    bearer = HTTPBearer(auto_error=False, description="A token from KBINDEX_API_TOKENS or the api_token table.")

    def caller(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Caller:
        return auth.caller_for(creds.credentials if creds else None)

    CallerDep = Annotated[Caller, Depends(caller)]

    def tenant(who: CallerDep) -> str:
        """Routes that return no document data: any token of the tenant."""
        return who.tenant_id

    def writer(who: CallerDep) -> str:
        """Routes that change documents or tasks: whole-tenant tokens only (403 before anything is read)."""
        return who.require_write()

    # No list bounds here: ReadScope.of refuses more than 100 principals or 20 filters as INVALID_FILTER.
    AsPrincipals = Annotated[list[str] | None, Query(alias="as", description=AS_DESCRIPTION)]

    def reading(who: CallerDep, acting_as: AsPrincipals = None) -> Reading:
        """Routes that return document data: the caller's read scope (403 for an end user's as=)."""
        return Reading(who, who.scope(acting_as))

    Tenant = Annotated[str, Depends(tenant)]
    Writer = Annotated[str, Depends(writer)]
    Reader = Annotated[Reading, Depends(reading)]
    TaskId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The task's id.")]
    DocumentId = Annotated[str, Path(description="The document id; may contain '/'.")]

    def owned_task(task_id: int, tenant_id: str, read: Reading | None = None) -> dict[str, Any]:
        """The task with its version's metadata and allow list, if ``read`` may see it (None: the whole tenant);
        another tenant's task, or one whose version the caller may not read, is the same 404 as a missing one."""
        params = read.params() if read is not None else {"tenant_id": tenant_id, "principals": [], "see_all": True}
        row = db.fetch_one("api_task_get_visible", {**params, "task_id": task_id})
        if row is None:  # the same answer as a missing task: nothing leaks
            raise TaskNotFound(f"task {task_id} does not exist", task_id=task_id)
        return row

    # -- page --------------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def status_page() -> HTMLResponse:  # no blocking work: answered on the event loop
        return HTMLResponse(page)

    @app.get("/healthz", tags=["operations"], summary="Liveness: the process answers (no database work)")
    async def healthz() -> dict[str, str]:
        """For a liveness probe: answered on the event loop, whatever PostgreSQL does (restarting the API would
        not bring a partitioned database back; /readyz says whether requests can be served)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"], summary="Readiness: the database answers",
             responses={503: _err("PostgreSQL is unreachable or failing (INDEX_WRITE_FAILED), within ~5 s")})
    async def readyz() -> dict[str, str]:
        """For a readiness probe: one statement through the API's pool, with the API's bounds."""
        await to_thread.run_sync(db.fetch_one, "index_profile_active", limiter=health_threads)
        return {"status": "ok"}

    @app.get(
        "/whoami",
        tags=["operations"],
        summary="The tenant this token acts as (the status page shows it)",
        responses=COMMON_ERRORS,
    )
    def whoami(who: CallerDep) -> dict[str, Any]:
        """``token``: ``tenant`` (whole tenant), ``user`` (fixed ``principals``) or ``service`` (search_as)."""
        return {"tenant_id": who.tenant_id, "token": who.kind,
                "principals": list(who.principals) if who.principals is not None else None,
                "search_as": who.search_as}

    # -- documents ---------------------------------------------------------------------------

    @app.post(
        "/documents/{document_id:path}/versions",
        status_code=202,
        tags=["documents"],
        summary="Publish a new version of a document",
        description=(
            "Upload the document's bytes as the multipart part `file`. Optional text parts: `metadata`, a JSON "
            "object (keys are identifiers; values strings, numbers, booleans, dates `YYYY-MM-DD` or lists of "
            "strings; at most 32 keys, 8 KiB), and `allow`, a principal that may read the version (`group:finance`, "
            "`user:alice`; repeat the part for more, or send one JSON array); without `allow` the whole tenant may "
            "read it. Metadata and allow list are part of the version: the same bytes with new ones make a new "
            "version, indexed without re-embedding. Bad metadata or principals answer 400 INVALID_METADATA and "
            "store nothing. A new version and its index task answer "
            "**202**; the same bytes, metadata and allow list as the latest version answer **200** with the existing "
            "task (never a duplicate), or **202** when that task was CANCELLED and this publish re-queued it (same "
            "task, PENDING again). Bodies over the size limit answer 413 DOCUMENT_TOO_LARGE, checked while "
            "streaming. Whole-tenant tokens only (403 FORBIDDEN for end-user and service tokens)."
        ),
        responses={
            200: {"description": "Same bytes as the latest version: the existing task"},
            202: {"description": "A new version was recorded, or its CANCELLED task re-queued; the PENDING task"},
            400: _err("Malformed form or document id (INVALID_REQUEST), metadata or allow list (INVALID_METADATA)"),
            413: _err("Upload over the size limit (DOCUMENT_TOO_LARGE)"),
            **WRITE_ERRORS,
        },
        openapi_extra=_multipart_body({"type": "string", "format": "binary"}, "", "the version"),
    )
    async def publish_version(document_id: DocumentId, request: Request, tenant_id: Writer) -> JSONResponse:
        document_id = validate_document_id(document_id)
        with uploads.slot(tenant_id):  # counted before the body is read: 429 for the tenant, 503 for all
            upload = await read_upload(
                request.headers.get("content-type"),
                request.headers.get("content-length"),
                request.stream(),
                text_fields=("metadata", "allow"),
                max_bytes=max_upload_bytes,
                idle_timeout=upload_idle_timeout,
                total_timeout=upload_total_timeout,
            )
            media_type = upload.content_type if upload.content_type not in (None, "application/octet-stream") else None
            metadata, allow = _metadata_fields(upload.fields)
            result = await run_in_threadpool(
                partial(publisher.publish, metadata=metadata, allow=allow),
                tenant_id, document_id, upload.data, upload.filename, media_type,
            )
            del upload
        task = await run_in_threadpool(owned_task, result.task_id, tenant_id)
        return JSONResponse(
            _jsonable(task_json(task)),
            status_code=202 if result.created or result.requeued else 200,  # a re-queue is new work
            headers={"Location": f"/tasks/{result.task_id}"},
        )

    @app.post(
        "/documents",
        tags=["documents"],
        summary="Publish many documents at once, in one transaction",
        description=(
            f"Upload each document as a multipart part `file`, its filename the document id (at most {max_batch_files} "
            "files; each within the single upload's size limit, the whole body within the batch limit: 413 "
            "DOCUMENT_TOO_LARGE beyond). Optional `metadata` and `allow` parts, as for a single publish, apply to "
            "every document of the batch, as `kbindex publish DIR --meta --allow` does. An optional `manifest` part "
            "gives documents their own: a JSON object keyed by filename, each entry `{\"metadata\": {...} or null, "
            "\"allow\": [...] or null}`; a key the entry sets replaces the shared value for that document (a "
            "malformed entry refuses its document only; a manifest naming a file not sent refuses the batch). All "
            "new versions and their tasks commit together, so they are indexed in a few big runs rather than one "
            "run per request. Each document gets its own result, in the order sent: `status` is what the single "
            "publish would have answered (**202** a new version or a re-queued task, **200** the same bytes, "
            "metadata and allow list as the latest version: its existing task), or that of its refusal, with `error` (an invalid id or "
            "metadata, over the tenant's quota): a refused document changes nothing and the others publish. The "
            "answer is **202** if any document made new work, else **200**. Whole-tenant tokens only."
        ),
        responses={
            200: {"description": "Nothing new: every document's result (existing tasks, refusals)"},
            202: {"description": "At least one new version or re-queued task; every document's result"},
            400: _err("Malformed form, too many files, bad shared metadata or allow list, or a manifest that "
                      "cannot be read or names a file not sent"),
            413: _err("A file over the upload limit, or the body over the batch limit (DOCUMENT_TOO_LARGE)"),
            **WRITE_ERRORS,
        },
        openapi_extra=_multipart_body({"type": "array", "items": {"type": "string", "format": "binary"},
                                       "description": "The documents; each part's filename is its document id"},
                                      ", for all", "every version",
                                      manifest={"type": "string", "description": (
                                          "A JSON object keyed by filename: each document's own metadata and/or "
                                          "allow list, replacing the shared ones")}),
    )
    async def publish_documents(request: Request, tenant_id: Writer) -> JSONResponse:
        with uploads.slot(tenant_id):  # one slot, like a single upload: the batch is one body
            files, fields = await read_uploads(
                request.headers.get("content-type"),
                request.headers.get("content-length"),
                request.stream(),
                text_fields=("metadata", "allow", "manifest"),
                text_limits={"manifest": MAX_MANIFEST_BYTES},
                max_bytes=max_upload_bytes,
                max_files=max_batch_files,
                max_total_bytes=max_batch_bytes,
                idle_timeout=upload_idle_timeout,
                total_timeout=upload_total_timeout,
            )
            metadata, allow = _metadata_fields(fields)
            manifest_parts = fields.get("manifest") or []
            if len(manifest_parts) > 1:
                raise InvalidMetadata("send the manifest as one JSON object, in one 'manifest' part")
            manifest = read_manifest(manifest_parts[0] if manifest_parts else None,
                                     {f.filename for f in files if f.named},
                                     keyed_by="each file part's filename, as sent")
            requests: list[PublishRequest] = []
            refused: dict[int, KbindexError] = {}
            for i, upload in enumerate(files):
                own = manifest.get(upload.filename) if upload.named else None
                try:
                    if not upload.named:
                        raise InvalidRequest("each 'file' part needs a filename: it is the document id")
                    document_id = validate_document_id(upload.filename)
                    if own is not None and own.error is not None:
                        raise own.error
                except KbindexError as exc:
                    refused[i] = exc
                    document_id = upload.filename
                media_type = upload.content_type if upload.content_type not in (None, "application/octet-stream") else None
                file_metadata, file_allow = own.apply(metadata, allow) if own is not None else (metadata, allow)
                requests.append(PublishRequest(document_id, upload.data, upload.filename, media_type,
                                               file_metadata, file_allow))
            del files
            valid = [r for i, r in enumerate(requests) if i not in refused]
            outcomes = iter(await run_in_threadpool(publisher.publish_many, tenant_id, valid) if valid else [])
            results = [_batch_result(r.document_id, refused[i] if i in refused else next(outcomes))
                       for i, r in enumerate(requests)]
        new_work = any(r["status"] == 202 for r in results)
        return JSONResponse({"results": results}, status_code=202 if new_work else 200)

    def page_keys(
        read: Reading, task_status: TaskStatus | None, error_code: str | None, cursor: str | None, limit: int
    ) -> tuple[list[dict[str, Any]], Callable[[dict[str, Any]], dict[str, Any]]]:
        """Up to ``limit`` document keys after ``cursor``, and how to make a cursor from a key.

        Each listing walks its own index newest first (api_document_page_*). A cursor holds the last key seen
        and the listing it came from (``kind``), so it cannot be replayed against another filter.
        """
        params: dict[str, Any] = {**read.params(), "limit": limit, "scan_budget": PAGE_SCAN_BUDGET}
        if task_status is None and error_code is None:
            key = decode_cursor(cursor, "recent") if cursor else {"published_at": "infinity", "document_id": "", "version": 0}
            try:
                published = key["published_at"]
                params["before_published_at"] = published if published == "infinity" else datetime.fromisoformat(published)
                params["before_document_id"] = str(key["document_id"])
                params["before_version"] = int(key["version"])
            except (KeyError, TypeError, ValueError) as exc:
                raise InvalidRequest("the cursor is not valid; start again from the first page") from exc
            keys = db.fetch_all("api_document_page_recent", params)
            return keys, lambda k: {
                "kind": "recent",
                "published_at": k["published_at"].isoformat(),
                "document_id": k["document_id"],
                "version": k["version_number"],
            }
        if error_code is not None and task_status not in (None, TaskStatus.DEAD, TaskStatus.RETRY_WAIT):
            raise InvalidRequest("with error_code, task_status can only be DEAD or RETRY_WAIT")
        kind = f"task:{task_status.value if task_status else ''}:{error_code or ''}"
        key = decode_cursor(cursor, kind) if cursor else {"task_id": 2**63 - 1}
        if type(key.get("task_id")) is not int or not 0 < key["task_id"] <= 2**63 - 1:
            raise InvalidRequest("the cursor is not valid; start again from the first page")
        params.update(task_status=task_status.value if task_status else None, before_task_id=key["task_id"])
        if error_code is not None:
            keys = db.fetch_all("api_document_page_by_error_code", {**params, "error_code": error_code})
        else:
            keys = db.fetch_all("api_document_page_by_task_status", params)
        return keys, lambda k: {"kind": kind, "task_id": k["task_id"]}

    def document_page(
        read: Reading, task_status: TaskStatus | None, error_code: str | None, cursor: str | None, limit: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of the documents the caller may see with their status, and the next page's cursor (None on
        the last page)."""
        walked, cursor_of = page_keys(read, task_status, error_code, cursor, limit + 1)
        keys = [k for k in walked if k["kept"]]
        more, keys = len(keys) > limit, keys[:limit]
        ids = [k["document_id"] for k in keys]
        rows = db.fetch_all("api_document_status", {**read.params(), "document_ids": ids}) if ids else []
        by_id = {r["document_id"]: r for r in rows}
        items = [_jsonable(document_json(by_id[i], show_allow=read.show_allow)) for i in ids if i in by_id]
        if more:
            return items, encode_cursor(cursor_of(keys[-1]))
        if walked and walked[-1]["depth"] == PAGE_SCAN_BUDGET:  # the walk's budget ran out: go on from there
            return items, encode_cursor(cursor_of(walked[-1]))
        return items, None

    @app.get(
        "/documents",
        tags=["documents"],
        summary="The tenant's documents and their status, a page at a time",
        description=(
            "Newest publish first. Filter with `task_status` (the status of the latest version's INDEX task under "
            "the active profile; newest task first) and/or `error_code` (latest versions DEAD or RETRY_WAIT with "
            "that code, as listed under `failures` by GET /overview). When there is a next page, the response "
            "carries its cursor in `X-Next-Cursor` and a `Link: <...>; rel=\"next\"` header: pass it back as "
            "`cursor` with the same filters. Only documents the caller may read are listed, each at its newest "
            "version the caller may read. A page walks at most "
            f"{PAGE_SCAN_BUDGET} index entries, so for a caller who may read few documents a page can be short or "
            "empty and still carry a next cursor: stop only when there is no `X-Next-Cursor`."
        ),
        responses={**READ_ERRORS, 400: _err("Bad filter or cursor (INVALID_REQUEST), bad as= (INVALID_FILTER)")},
    )
    def list_documents(
        read: Reader,
        request: Request,
        response: Response,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        task_status: Annotated[TaskStatus | None, Query(description="Status of the latest version's task")] = None,
        error_code: Annotated[
            str | None, Query(min_length=1, max_length=64, pattern=r"^[A-Z][A-Z0-9_]*$", description="A failure code")
        ] = None,
        cursor: Annotated[str | None, Query(max_length=4096, description="X-Next-Cursor of the previous page")] = None,
    ) -> list[dict[str, Any]]:
        items, next_cursor = document_page(read, task_status, error_code, cursor, limit)
        if next_cursor is not None:
            next_url = request.url.include_query_params(cursor=next_cursor)
            response.headers["X-Next-Cursor"] = next_cursor
            response.headers["Link"] = f'<{next_url.path}?{next_url.query}>; rel="next"'
        return items

    @app.get(
        "/overview",
        tags=["documents"],
        summary="The tenant's overview: tasks by status, work in flight with rate and ETA, failures by code",
        description=(
            "`in_flight`: open tasks (PENDING, RUNNING, RETRY_WAIT) and tasks finished since the oldest open one "
            "was queued, as one percentage. `rate.succeeded_per_minute` is measured over the last ten minutes (or "
            "since the oldest open task was queued, at least one minute); `eta_seconds` = open / rate (null while "
            "nothing succeeds). `failures`: documents whose latest version is DEAD or RETRY_WAIT, by error code; "
            "list them with GET /documents?error_code=CODE. A caller who may not read every version (an end-user "
            "token, `as=`) gets the same figures over the versions it may read among the tenant's newest "
            f"{SCOPED_SCAN_TASKS} tasks: `coverage.complete` is false when the tenant has that many tasks or more."
        ),
        responses=READ_ERRORS,
    )
    def overview(read: Reader) -> dict[str, Any]:
        statement = "api_tenant_overview" if read.scope.see_all else "api_tenant_overview_scoped"
        row = db.fetch_one(statement, {**read.params(), "now": None, "window_seconds": RATE_WINDOW_SECONDS,
                                       "scan_tasks": SCOPED_SCAN_TASKS, "statuses": TASK_STATUSES})
        assert row is not None  # an aggregate answers one row
        failures = db.fetch_all("api_tenant_failures_by_code", read.params())
        return _jsonable(overview_json(read.tenant_id, row, failures))

    @app.get(
        "/documents/{document_id:path}",
        tags=["documents"],
        summary="A document's latest version versus the version search serves",
        description=(
            "`status`: SEARCHABLE (search serves the latest version), INDEXING (its task is on the way; an older "
            "version may be served meanwhile), FAILED (the latest version failed and nothing is served; see "
            "`failure.code`/`failure.message`), STALE (the latest version failed; an older one is still served). "
            "`metadata` is the latest version's; `allow` its allow list (null: the whole tenant), shown to "
            "whole-tenant tokens only. The latest version is the newest the caller may read; a document whose "
            "served version the caller may not read answers 404 like a missing one."
        ),
        responses={**READ_ERRORS, 404: _err("No such document for this tenant and caller (NOT_FOUND)")},
    )
    def get_document(document_id: DocumentId, read: Reader) -> dict[str, Any]:
        document_id = validate_document_id(document_id)
        row = db.fetch_one("api_document_status", {**read.params(), "document_ids": [document_id]})
        if row is None:
            raise NotFound("no such document")
        return _jsonable(document_json(row, show_allow=read.show_allow))

    @app.delete(
        "/documents/{document_id:path}",
        status_code=202,
        tags=["documents"],
        summary="Delete a document: a tombstone version, indexed like any version",
        description=(
            "Records a tombstone (a new version without bytes) and its index task per profile. Search keeps serving "
            "the previous version until the tombstone's fenced publish, then returns nothing of the document in any "
            "mode. A new tombstone answers **202** with its task (`kind: delete`; `tasks` lists every profile's). "
            "Deleting again answers **200** with the existing tombstone's task (`outcome: already_deleted`), and a "
            "document never published answers **200** with `outcome: not_found` and no task: deletes are "
            "idempotent. Publishing afterwards creates the next version and the document comes back. "
            "`erase=true` erases: the same delete, then the purge of every stored copy of every version (chunks, "
            "vectors, lexical rows, run artifacts, bytes no other document shares); search returns nothing of it "
            "at once. Answers **200** with the receipt: `removed` per kind, `not_removed` with why; `outcome` is "
            "`erased`, `already_erased` or `not_found`."
        ),
        responses={
            200: {"description": "Already deleted (the existing task) or never published (nothing to delete)"},
            202: {"description": "A tombstone was recorded; its PENDING task"},
            **WRITE_ERRORS,
        },
    )
    def delete_document(
        document_id: DocumentId,
        tenant_id: Writer,
        erase: Annotated[bool, Query(description="Also purge every stored copy of every version (a receipt answers)")] = False,
    ) -> JSONResponse:
        document_id = validate_document_id(document_id)
        if erase:
            return JSONResponse(_jsonable(eraser.erase(tenant_id, document_id).to_dict()), status_code=200)
        result = publisher.delete(tenant_id, document_id)
        body: dict[str, Any] = {"outcome": result.outcome, "message": result.message,
                                "tenant_id": tenant_id, "document_id": document_id}
        if result.task_id is None:
            return JSONResponse(body, status_code=200)
        tasks = [task_json(owned_task(t["task_id"], tenant_id)) for t in result.tasks]
        primary = next(t for t in tasks if t["task_id"] == result.task_id)
        return JSONResponse(
            _jsonable({**primary, **body, "tasks": tasks}),
            status_code=202 if result.created or result.requeued else 200,
            headers={"Location": f"/tasks/{result.task_id}"},
        )

    # -- tasks -------------------------------------------------------------------------------

    @app.get(
        "/tasks",
        tags=["tasks"],
        summary="The tenant's tasks the caller may see, newest first",
        description="Tasks of versions the caller may not read are left out (see GET /tasks/{task_id}).",
        responses=READ_ERRORS,
    )
    def list_tasks(
        read: Reader,
        status: Annotated[TaskStatus | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[dict[str, Any]]:
        scan = limit if read.scope.see_all else max(limit, SCOPED_SCAN_TASKS)
        rows = db.fetch_all("api_task_list_visible", {**read.params(), "status": status.value if status else None,
                                                      "limit": limit, "scan_tasks": scan, "statuses": TASK_STATUSES})
        return [_jsonable(task_json(r, show_allow=read.show_allow)) for r in rows]

    @app.get(
        "/tasks/{task_id}",
        tags=["tasks"],
        summary="One task: status, stage, completed/total, percent, attempts, error, can_cancel, can_retry",
        description=(
            "With its version's `metadata`, and `allow` (its allow list, null: the whole tenant) for whole-tenant "
            "tokens. A task whose version the caller may not read, or of a document whose served version the "
            "caller may not read, answers 404 like a missing task."
        ),
        responses={**READ_ERRORS, **TASK_ERRORS},
    )
    def get_task(task_id: TaskId, read: Reader) -> dict[str, Any]:
        return _jsonable(task_json(owned_task(task_id, read.tenant_id, read), show_allow=read.show_allow))

    @app.delete(
        "/tasks/{task_id}",
        tags=["tasks"],
        summary="Cancel a PENDING, RETRY_WAIT or RUNNING task",
        responses={**TASK_ERRORS, **WRITE_ERRORS,
                   409: _err("The task's state does not allow it (ILLEGAL_TRANSITION), with the reason")},
    )
    def cancel_task(task_id: TaskId, tenant_id: Writer) -> dict[str, Any]:
        owned_task(task_id, tenant_id)
        queue.cancel(task_id)
        return _jsonable(task_json(owned_task(task_id, tenant_id)))

    @app.post(
        "/tasks/{task_id}/retry",
        tags=["tasks"],
        summary="Send a DEAD or CANCELLED task back to PENDING (same row, attempts kept, more granted)",
        responses={**TASK_ERRORS, **WRITE_ERRORS,
                   409: _err("Only DEAD or CANCELLED tasks can be retried (ILLEGAL_TRANSITION), with the reason")},
    )
    def retry_task(
        task_id: TaskId, tenant_id: Writer, attempts: Annotated[int, Query(ge=1, le=100)] = 3
    ) -> dict[str, Any]:
        owned_task(task_id, tenant_id)
        queue.retry(task_id, extra_attempts=attempts)
        return _jsonable(task_json(owned_task(task_id, tenant_id)))

    @app.get(
        "/tasks/{task_id}/events",
        tags=["tasks"],
        summary="The task's events as Server-Sent Events (resumable with Last-Event-ID)",
        description=(
            "Each event carries `id: <event_id>` and JSON data (status, stage, completed/total, percent, error). "
            "Reconnect with `Last-Event-ID` (or `?after=`) to receive exactly the events after it. Keep-alive "
            "comments are sent while idle; the stream ends after a terminal transition. A task that is already "
            "terminal with nothing newer to send answers 204 (EventSource stops reconnecting). The caller must "
            "be allowed to read the task (as GET /tasks/{task_id}); if a pointer flip narrows the document's allow "
            "list past the caller while the stream is open, the stream ends and reconnecting answers 404."
        ),
        responses={
            200: {"description": "text/event-stream", "content": {"text/event-stream": {}}},
            204: {"description": "Terminal, nothing after Last-Event-ID"},
            **READ_ERRORS,
            **TASK_ERRORS,
        },
    )
    async def task_events(
        task_id: TaskId,
        read: Reader,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
        after: Annotated[int | None, Query(ge=0, description="Resume after this event id")] = None,
    ) -> Response:
        try:
            last = int(last_event_id) if last_event_id not in (None, "") else (after or 0)
        except ValueError as exc:
            raise InvalidRequest("Last-Event-ID must be an event id") from exc
        tenant_id = read.tenant_id
        visible = None if read.scope.see_all else read.params()
        stream = hub.admit(tenant_id, task_id, last, visible)  # counted before any await: a burst cannot all pass
        try:
            row = await run_in_threadpool(owned_task, task_id, tenant_id, read)
            if TaskStatus(row["status"]) in TERMINAL and not await run_in_threadpool(queue.events, task_id, last):
                stream.close()
                return Response(status_code=204)
        except BaseException:
            stream.close()
            raise
        return _StreamResponse(
            stream,
            stream.messages(poll_seconds),
            ping=ping_seconds,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    # -- search ------------------------------------------------------------------------------

    @app.get(
        "/search",
        tags=["search"],
        summary="Search the tenant's searchable versions (active profile) on behalf of principals",
        description=(
            "Returns the `k` best chunks of the versions the caller may read whose metadata passes every "
            "`filter`, each hit with its version's `metadata`. Permissions and filters apply inside the SQL of "
            "every mode, before k. On whose behalf: an end-user token, its own principals (`as=` is 403 "
            "FORBIDDEN); a service token (search_as), the principals named with `as=` (repeatable), or without "
            "`as=` only versions without an allow list; a whole-tenant token, everything, or the `as=` "
            "principals. `filter` (repeatable, combined with AND): `key=value`, `key=a|b`, `key!=value`, "
            "`key>=2026-01-01`, `key<10` (numbers or dates), `key` (exists), `!key` (absent); on a list-valued "
            "key `=` means contains. `reranked`: null when the active profile has no reranker, true when the hits "
            "are in its reranker's order, false when the reranker failed and they are in the unreranked order, "
            "with `rerank_error` its stable code (EMBEDDING_TIMEOUT, EMBEDDING_RATE_LIMITED, EMBEDDING_UNAVAILABLE, "
            "EMBEDDING_INVALID_RESPONSE): a reranker failure never fails the search."
        ),
        responses={
            **READ_ERRORS,
            400: _err("Empty query or bad k (INVALID_REQUEST); bad filter or principal (INVALID_FILTER)"),
            429: _err("This tenant already has its share of searches in progress (TOO_MANY_REQUESTS)"),
            503: _err("Too many searches in progress (SERVICE_UNAVAILABLE), or the embedding provider is rate "
                      "limiting, slow or down (EMBEDDING_RATE_LIMITED with Retry-After, EMBEDDING_TIMEOUT, "
                      "EMBEDDING_UNAVAILABLE): the query embedding waits a few seconds at most"),
        },
    )
    async def search(
        who: CallerDep,
        q: Annotated[str, Query(min_length=1, max_length=2000, description="The question or keywords")],
        k: Annotated[int, Query(ge=1, le=100)] = 10,
        mode: Annotated[
            str | None,
            Query(
                pattern="^(hybrid|dense|lexical)$",
                description="hybrid (BM25 + vectors, fused), dense or lexical; default: the profile's (hybrid)",
            ),
        ] = None,
        acting_as: AsPrincipals = None,
        filters: Annotated[
            list[str] | None,
            Query(alias="filter", description="A metadata filter, e.g. dept=hr or effective>=2026-01-01"),
        ] = None,
    ) -> dict[str, Any]:
        scope = who.scope(acting_as, filters)  # 403 / INVALID_FILTER before anything is embedded or read
        if not q.strip():
            raise InvalidRequest("the query must not be blank")

        def run() -> tuple[list[Any], dict[str, Any]]:
            fn = search_fn or _default_search()
            if state["embedder"] is None:
                state["embedder"] = _default_embedder()
            found = fn(db, state["embedder"], q, tenant_id=who.tenant_id, k=k, mode=mode, read=scope)
            status = found.status() if callable(getattr(found, "status", None)) else {"reranked": None, "rerank_error": None}
            return _jsonable(list(found)), status

        with searches.slot(who.tenant_id):  # counted before any await: 429 for the tenant, 503 for all
            hits, status = await to_thread.run_sync(run, limiter=search_threads)
        # reranked: null (the profile has no reranker), true, or false with rerank_error (the unreranked order).
        return {"query": q, "k": k, "mode": mode, "hits": hits, **status}

    # -- model migration ---------------------------------------------------------------------

    @app.get(
        "/profiles/migrations",
        tags=["operations"],
        summary="Progress of shadow profiles being built: done/total, failures by code, rate, ETA",
        responses=COMMON_ERRORS,
    )
    def migrations(tenant_id: Tenant) -> dict[str, Any]:
        from resources.profiles import migration_progress

        # Profiles are global, their figures are not: the caller's documents and tasks only, no provider host.
        return {"migrations": _jsonable(migration_progress(db, tenant_id=tenant_id))}

    # -- metrics -----------------------------------------------------------------------------

    @app.get(
        "/metrics",
        tags=["operations"],
        summary="Prometheus metrics (queue depth, oldest due age, leases, failures by code, latency)",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    )
    async def metrics(authorization: Annotated[str | None, Header()] = None) -> Response:
        if metrics_token is None and not metrics_public:
            raise Unauthorized("metrics need KBINDEX_METRICS_TOKEN (or KBINDEX_METRICS_PUBLIC=1 to open them)")
        if metrics_token is not None:
            from hmac import compare_digest

            if not compare_digest((authorization or "").encode(), f"Bearer {metrics_token}".encode()):
                raise Unauthorized("the metrics token is not valid")
        text = scrapes.fresh() or await to_thread.run_sync(scrapes.get, limiter=metrics_limiter)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    return app
