"""Garbage collection of stored document bytes, run by the retention job after the chunks are gone.

A blob may be deleted when no version needs it any more (statement ``blob_live_hashes``): none of its
versions is its document's latest, named by a search pointer, published or touched by a task within
the retention window, or has an open task. That covers the bytes of long-superseded versions, and
the orphans of publishes that failed after storing their bytes (no version at all).

A blob younger than ``grace_seconds`` is never deleted: a publish stores its bytes *before* its
transaction opens, and ``BlobStore.put`` renews the age of bytes it finds already stored. That alone
left a window (issue #31): a publish of the same bytes that renewed and committed between this pass's
liveness check and its delete lost its file. So a publish holds its hash (advisory lock ``blob_hold``,
shared) from inside its transaction until it commits (storing the bytes again under it if they went
meanwhile), and each blob this pass found dead is deleted
under the same lock, exclusive (``blob_collect_lock``, not waited for: a blob a publish holds is left for
the next pass) after its liveness is checked again under it: a publish either committed before (its
version makes the blob live) or stores the bytes after the delete (a fresh file).
Versions whose bytes are deleted are marked (``bytes_released_at``) and their bytes and versions given
back to the tenant's quotas (``blob_release_versions``); marking comes first, so a crash between the two
steps only leaves a file for the next pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from resources.blob_store import BlobStore
from resources.database import Database, Session

DEFAULT_GRACE_SECONDS = 3600.0
BATCH = 500


@dataclass(frozen=True)
class BlobGcReport:
    blobs_deleted: int = 0
    bytes_released: int = 0
    temporary_files_deleted: int = 0

    def to_metadata(self) -> dict[str, int]:
        return {
            "blobs_deleted": self.blobs_deleted,
            "blob_bytes_released": self.bytes_released,
            "blob_temporary_files_deleted": self.temporary_files_deleted,
        }


@contextmanager
def collect_lock(session: Session, digest: str) -> Iterator[bool]:
    """The blob's exclusive lock against publishes of the same bytes (``blob_collect_lock``, tried, never waited
    for), held on ``session`` for the block: yields whether it was granted. Every deleter of blobs takes it
    (this pass, and ``resources/eraser.py``) around its re-check and its delete."""
    locked = bool(session.fetch_one("blob_collect_lock", {"content_hash": digest})["locked"])
    try:
        yield locked
    finally:
        if locked:
            session.fetch_one("blob_collect_unlock", {"content_hash": digest})


def collect_blobs(
    db: Database,
    blobs: BlobStore,
    *,
    window_seconds: float,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    now: datetime | None = None,
) -> BlobGcReport:
    """Delete blobs no version needs (see the module docstring); returns what was removed."""
    deleted = released = temporary = 0
    batch: list[tuple[str, str]] = []

    def flush() -> None:
        nonlocal deleted, released
        hashes = [h for h, _ in batch]
        params = {"now": now, "window_seconds": float(window_seconds)}
        live = {r["content_hash"] for r in db.fetch_all("blob_live_hashes", {"hashes": hashes, **params})}
        with db.session() as s:  # one connection: the session lock is taken and given back on it
            for digest, path in ((h, p) for h, p in batch if h not in live):
                with collect_lock(s, digest) as locked:
                    if not locked:
                        continue  # a publish of these bytes is in flight
                    if s.fetch_all("blob_live_hashes", {"hashes": [digest], **params}):
                        continue  # a publish committed a version that needs them since the batch check
                    rows = s.fetch_all("blob_release_versions", {"hashes": [digest], "now": now})
                    released += sum(int(r["released_bytes"]) for r in rows)
                    blobs.delete(path)
                    deleted += 1
        batch.clear()

    for digest, age, path in blobs.stored():
        if age < grace_seconds:
            continue
        if not digest:  # a temporary file left by a put() that died midway
            blobs.delete(path)
            temporary += 1
            continue
        batch.append((digest, path))
        if len(batch) >= BATCH:
            flush()
    if batch:
        flush()
    return BlobGcReport(blobs_deleted=deleted, bytes_released=released, temporary_files_deleted=temporary)
