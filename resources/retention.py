"""Retention: delete the chunks of versions search stopped reading more than a window ago.

    apply_retention(db, window_seconds=) -> RetentionReport(removed_versions, chunks_deleted, skipped_busy)

What "superseded" means, and why nothing searchable is ever touched:

- A trigger on ``search_pointer`` (migration 0006) records in ``superseded_version`` when a pointer moved
  away from a version (or was deleted), in the transaction that moved it, and forgets the record when a
  pointer comes back to that version. Retention only considers recorded versions older than the window.
- Chunk rows are per (document, profile, version); search reads a profile's chunks only through that
  profile's pointer (invariant 4). A version a pointer names is never deleted under that profile, so a
  ``profile rollback`` finds the previous active profile's pointed versions intact, and any version left
  behind within the window is still there for a rollback of the pointer itself.
- Each batch is one transaction: it share-locks every task of the due versions (any profile) and then
  their documents' pointers (the publish transaction's own order: task row, then pointer, so the two
  cannot deadlock), then deletes in one statement that re-checks everything under those locks: still
  superseded past the window, named by no pointer, no RUNNING task. While the batch holds the locks no
  claim can make such a task RUNNING and no publish or pointer move can touch those versions.
- A pass costs what is due, not the corpus: it reads ``superseded_version`` by ``superseded_at`` (its rows
  go with the chunks), never the table of every version ever published.
- Dagster partition keys are not retention's business: the lineage job (pipelines/lineage_job.py,
  resources/partition_keys.py) prunes the key of every version with nothing in flight once its lineage
  window or cap has passed, whether its chunks are still there or not. One mechanism, one ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from resources.database import Database

DEFAULT_WINDOW_SECONDS = 7 * 24 * 3600
BATCH_VERSIONS = 200
LOCK_TIMEOUT = "5s"


@dataclass(frozen=True)
class RetentionReport:
    """What one retention pass removed."""

    removed_versions: list[tuple[str, str, str, int]] = field(default_factory=list)
    """(tenant, document, profile, version) whose chunks were deleted."""
    chunks_deleted: int = 0
    skipped_busy: int = 0
    """Due versions left alone this pass: a task on them is RUNNING (or a pointer came back to them)."""

    def to_metadata(self) -> dict[str, Any]:
        return {
            "versions_removed": len(self.removed_versions),
            "chunks_deleted": self.chunks_deleted,
            "skipped_busy": self.skipped_busy,
        }


def apply_retention(
    db: Database,
    *,
    window_seconds: float,
    now: datetime | None = None,
    batch_versions: int = BATCH_VERSIONS,
    max_batches: int | None = None,
) -> RetentionReport:
    """Delete chunks of versions superseded more than ``window_seconds`` ago.

    ``now`` pins the clock (tests); None uses the database's. Runs batches of ``batch_versions`` versions,
    each in its own transaction, until none is due (or ``max_batches``).
    """
    if window_seconds < 0:
        raise ValueError("window_seconds must be >= 0")
    if batch_versions < 1:
        raise ValueError("batch_versions must be >= 1")
    clock = {"now": now, "window_seconds": float(window_seconds)}
    removed: list[tuple[str, str, str, int]] = []
    chunks_deleted = 0
    skipped: set[tuple[str, str, str, int]] = set()
    batches = 0
    while max_batches is None or batches < max_batches:
        batches += 1
        with db.transaction() as tx:
            tx.fetch_one("retention_lock_timeout", {"lock_timeout": LOCK_TIMEOUT})
            # Versions skipped earlier in this pass (a RUNNING task) stay due: look past them.
            due = tx.fetch_all("superseded_version_due", {**clock, "limit": batch_versions + len(skipped)})
            due = [d for d in due if _key(d) not in skipped][:batch_versions]
            if not due:
                break
            versions = {
                "tenant_ids": [d["tenant_id"] for d in due],
                "document_ids": [d["document_id"] for d in due],
                "profiles": [d["profile"] for d in due],
                "versions": [d["version_number"] for d in due],
            }
            tx.fetch_all("index_task_lock_retention", versions)
            tx.fetch_all("search_pointer_lock_retention", versions)
            rows = tx.fetch_all("chunk_delete_retained", {**versions, **clock})
        done = {_key(r) for r in rows}
        removed.extend(_key(r) for r in rows)
        chunks_deleted += sum(r["chunks_deleted"] for r in rows)
        # Due but not removed: a RUNNING task, or the pointer came back meanwhile (then it is no longer due).
        skipped.update(_key(d) for d in due if _key(d) not in done)
    return RetentionReport(removed_versions=removed, chunks_deleted=chunks_deleted, skipped_busy=len(skipped))


def _key(row: dict[str, Any]) -> tuple[str, str, str, int]:
    return (row["tenant_id"], row["document_id"], row["profile"], int(row["version_number"]))
