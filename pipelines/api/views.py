"""What the API shows of tasks, events, documents and a tenant's overview: rows in, JSON-ready dicts out.

Progress is the stage plus completed/total with the weighted ``overall_percent`` of
pipelines.domain.task_states: it reads 100 only once the task is SUCCEEDED.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from pipelines.domain.errors import InvalidRequest, sanitize_message
from pipelines.domain.task_states import (
    TERMINAL,
    Stage,
    TaskStatus,
    overall_percent,
    why_cannot_cancel,
    why_cannot_retry,
)


def _iso(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _percent(status: str, stage: str | None, completed: int | None, total: int | None) -> float:
    return overall_percent(TaskStatus(status), Stage(stage) if stage else None, completed or 0, total or 0)


def task_kind(row: dict[str, Any]) -> str:
    """What a task does: ``delete`` (its version is a tombstone: its publish takes the document out of search)
    or ``index`` (a content version)."""
    return "delete" if row.get("version_kind") == "tombstone" else "index"


def task_json(row: dict[str, Any], *, show_allow: bool = True) -> dict[str, Any]:
    """One index task for people and scripts; ``kind`` says whether it indexes a version or deletes the document.

    A row read with its version's metadata and allow list (``version_metadata``, ``version_allow``: the API's
    api_task_* statements) shows them as ``metadata`` and ``allow`` (None: the whole tenant may read it);
    ``show_allow`` False leaves ``allow`` out (principal-scoped callers: an allow list names other people).
    """
    status = TaskStatus(row["status"])
    cancel_reason = why_cannot_cancel(status)
    retry_reason = why_cannot_retry(status)
    code = row.get("error_code")
    out = {
        "task_id": row["task_id"],
        "tenant_id": row["tenant_id"],
        "document_id": row["document_id"],
        "version_number": row["version_number"],
        "profile": row["profile"],
        "task_type": row.get("task_type", "INDEX"),
        "kind": task_kind(row),
        "status": status.value,
        "terminal": status in TERMINAL,
        "stage": row.get("stage"),
        "completed": row.get("completed") or 0,
        "total": row.get("total") or 0,
        "percent": _percent(status, row.get("stage"), row.get("completed"), row.get("total")),
        "attempts": row["attempts"],
        "max_attempts": row["max_attempts"],
        "error": (
            {"code": code, "message": sanitize_message(row.get("error_message") or "")} if code else None
        ),
        "chunk_count": row.get("chunk_count"),
        "created_at": _iso(row.get("created_at")),
        "updated_at": _iso(row.get("updated_at")),
        "started_at": _iso(row.get("started_at")),
        "finished_at": _iso(row.get("finished_at")),
        "next_attempt_at": _iso(row.get("next_attempt_at")) if status in (TaskStatus.PENDING, TaskStatus.RETRY_WAIT) else None,
        "can_cancel": cancel_reason is None,
        "cannot_cancel_reason": cancel_reason,
        "can_retry": retry_reason is None,
        "cannot_retry_reason": retry_reason,
    }
    if "version_metadata" in row:
        out["metadata"] = dict(row["version_metadata"] or {})
        if show_allow:
            out["allow"] = row.get("version_allow")
    return out


def event_json(row: dict[str, Any]) -> dict[str, Any]:
    """One task_event row as an SSE payload: exactly what the table holds (replays are identical)."""
    return {
        "event_id": row["event_id"],
        "task_id": row["task_id"],
        "kind": row["kind"],
        "attempt": row["attempt"],
        "from_status": row["from_status"],
        "to_status": row["to_status"],
        "stage": row["stage"],
        "completed": row["completed"],
        "total": row["total"],
        "percent": _percent(row["to_status"], row["stage"], row["completed"], row["total"]),
        "error_code": row["error_code"],
        "message": sanitize_message(row["message"]) if row["message"] else None,
        "created_at": _iso(row["created_at"]),
        "terminal": is_terminal_event(row),
    }


def is_terminal_event(row: dict[str, Any]) -> bool:
    return row["kind"] == "transition" and TaskStatus(row["to_status"]) in TERMINAL


class DocumentStatus:
    INDEXING = "INDEXING"
    SEARCHABLE = "SEARCHABLE"
    DELETING = "DELETING"
    DELETED = "DELETED"
    FAILED = "FAILED"
    STALE = "STALE"


def document_json(row: dict[str, Any], *, show_allow: bool = True) -> dict[str, Any]:
    """Latest business version versus the version search serves, and one status word.

    SEARCHABLE: search serves the latest version. INDEXING: the latest version's task is still on its way
    (an older version may be served meanwhile). FAILED: the latest version failed (DEAD or CANCELLED) and
    nothing is served. STALE: the latest version failed while an older one is still served.
    For a deleted document (its latest version is a tombstone): DELETED once the tombstone's publish took it out
    of search, DELETING while that task is on its way (the previous version is still served), and STALE /
    FAILED as for any version when the delete's task failed.
    ``metadata`` and ``allow`` are the latest version's (the newest the caller may read); ``show_allow`` False
    leaves ``allow`` out.
    """
    latest = row["latest_version"]
    served = row.get("searchable_version")
    task_status = row.get("task_status")
    deleted = row.get("latest_kind") == "tombstone"
    failure = None
    if served is not None and served >= latest:
        status = DocumentStatus.DELETED if deleted else DocumentStatus.SEARCHABLE
    elif task_status in (TaskStatus.DEAD, TaskStatus.CANCELLED):
        status = DocumentStatus.STALE if served is not None else DocumentStatus.FAILED
        if task_status == TaskStatus.CANCELLED:
            failure = {"code": "TASK_CANCELLED", "message": "indexing of this version was cancelled; retry it or publish it again"}
        else:
            failure = {
                "code": row.get("error_code") or "INTERNAL_ERROR",
                "message": sanitize_message(row.get("error_message") or "indexing failed"),
            }
    else:
        status = DocumentStatus.DELETING if deleted else DocumentStatus.INDEXING
    task = None
    if row.get("task_id") is not None:
        task = {
            "task_id": row["task_id"],
            "kind": "delete" if deleted else "index",
            "status": task_status,
            "stage": row.get("stage"),
            "completed": row.get("completed") or 0,
            "total": row.get("total") or 0,
            "percent": _percent(task_status, row.get("stage"), row.get("completed"), row.get("total")),
            "attempts": row.get("attempts"),
            "error_code": row.get("error_code"),
        }
    return {
        "tenant_id": row["tenant_id"],
        "document_id": row["document_id"],
        "status": status,
        "deleted": deleted,
        "latest_version": latest,
        "latest_kind": row.get("latest_kind") or "content",
        "searchable_version": served,
        "profile": row.get("profile"),
        "filename": row.get("filename"),
        "media_type": row.get("media_type"),
        "byte_size": row.get("byte_size"),
        "published_at": _iso(row.get("published_at")),
        "searchable_since": _iso(row.get("searchable_since")),
        "searchable_chunks": row.get("searchable_chunks"),
        "metadata": dict(row.get("metadata") or {}),
        **({"allow": row.get("allow_principals")} if show_allow else {}),
        "failure": failure,
        "task": task,
    }


# -- status page overview and document list pages ------------------------------------------------------

RATE_WINDOW_SECONDS = 600.0  # the success rate is measured over the last ten minutes (never less than one)
# Per-request bounds that keep a principal-scoped caller's cost independent of the tenant's size: which
# versions a caller may read is in no index, so a caller who may read few documents would otherwise make a page
# or a count read the whole tenant (see api_document_page_recent and api_tenant_overview_scoped).
PAGE_SCAN_BUDGET = 2_000  # index entries one document page may walk; a page that spends it may come back short
SCOPED_SCAN_TASKS = 5_000  # newest tasks a scoped overview or task list reads
TASK_STATUSES = [s.value for s in TaskStatus]


def overview_json(tenant_id: str, row: dict[str, Any], failures: list[dict[str, Any]]) -> dict[str, Any]:
    """The tenant's overview: tasks by status, the work in flight as one bar, rate, ETA, failures by code.

    ``in_flight``: ``open`` = tasks PENDING, RUNNING or RETRY_WAIT; ``done`` = tasks finished (SUCCEEDED,
    DEAD, CANCELLED) since the oldest open one was queued (``since``); ``percent`` = done of done + open.
    ``rate``: tasks SUCCEEDED per minute over ``window_seconds``. ``eta_seconds`` = open / rate: 0.0 when
    nothing is open, None while nothing succeeds. ``failures``: documents whose latest version is DEAD or
    waits for a retry, by error code; each code filters GET /documents with ``error_code``.
    ``coverage``: a principal-scoped overview counts over the tenant's newest SCOPED_SCAN_TASKS tasks only
    (``tasks_read`` of them); ``complete`` is false once it read that many, whether or not there were more.
    """
    counts = row.get("tasks_by_status") or {}
    tasks_read = int(row["tasks_read"]) if row.get("tasks_read") is not None else None
    by_status = {s.value: int(counts.get(s.value, 0)) for s in TaskStatus}
    open_tasks = sum(by_status[s.value] for s in TaskStatus if s not in TERMINAL)
    done = int(row.get("finished_since_open") or 0) if open_tasks else 0
    total = open_tasks + done
    window = float(row.get("window_seconds") or RATE_WINDOW_SECONDS)
    succeeded = int(row.get("succeeded_in_window") or 0)
    per_minute = succeeded * 60.0 / window
    if open_tasks == 0:
        eta: float | None = 0.0
    else:
        eta = round(open_tasks / per_minute * 60.0, 1) if per_minute > 0 else None
    return {
        "tenant_id": tenant_id,
        "as_of": _iso(row.get("as_of")),
        "documents": int(row.get("documents") or 0),
        "tasks_by_status": by_status,
        "tasks_total": sum(by_status.values()),
        "in_flight": {
            "open": open_tasks,
            "done": done,
            "total": total,
            "percent": round(100.0 * done / total, 1) if total else 100.0,
            "since": _iso(row.get("open_since")) if open_tasks else None,
        },
        "rate": {
            "succeeded_per_minute": round(per_minute, 2),
            "succeeded_in_window": succeeded,
            "window_seconds": round(window, 1),
        },
        "eta_seconds": eta,
        "coverage": {"complete": row.get("tasks_complete") is not False, "tasks_read": tasks_read},
        "failures": [
            {
                "code": f["code"],
                "dead": int(f["dead"]),
                "retry_wait": int(f["retry_wait"]),
                "documents": int(f["dead"]) + int(f["retry_wait"]),
            }
            for f in failures
        ],
    }


def encode_cursor(key: dict[str, Any]) -> str:
    """An opaque page cursor (URL-safe base64 of compact JSON) for the keyset ``key``."""
    raw = json.dumps(key, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, expected: str) -> dict[str, Any]:
    """The keyset of ``cursor``, which must have been made for the same listing (``expected``: its kind).

    Raises InvalidRequest when the cursor is malformed or belongs to another filter.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest("the cursor is not valid; start again from the first page") from exc
    if not isinstance(key, dict) or key.get("kind") != expected:
        raise InvalidRequest("the cursor belongs to another listing; start again from the first page")
    return key
