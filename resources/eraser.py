"""Erase (DESIGN.md "erase", invariant 9): a delete followed by the purge of every stored copy of every version
of one document, in every profile, ending with a receipt.

    Eraser(db, blobs, artifacts).erase(tenant_id, document_id) -> EraseReceipt

One database transaction (statements in sql/queries/erase.sql), then the files:
  1. ``Publisher.delete_in``: the tombstone (version n+1 without bytes) and its task(s), unless the latest
     version is one already; the document row stays locked, so no publish of the document interleaves.
  2. ``erase_index_task_lock``: every task of the document, locked in task-id order. Open tasks of content
     versions are CANCELLED by the existing transition (``task_cancel``, with its event): a run holding one
     finds out at its next fenced write, and its publish (which locks the same rows first) either committed
     before the lock, so its rows are purged here, or fails its fence afterwards and writes nothing.
  3. The pointer. Erase does not wait for the tombstone's own run: it deletes the pointers that name a content
     version (``erase_search_pointer_delete``), so search returns nothing of the document from this commit on,
     in every mode, and ``lexical_stats_reconcile`` takes the document out of each profile's BM25 statistics in
     the same transaction. It does not move the pointer onto the tombstone itself: ``kbindex verify`` requires
     a pointer's task to be SUCCEEDED, and the tombstone's task is still PENDING; its ordinary fenced publish
     later inserts the pointer on the tombstone (forward only, zero chunks). With no pointer and no chunk of the
     document, every verify check holds at every instant in between.
  4. The purge: postings, lexical rows and ledger, chunk rows (text and vectors, which are also the only
     source of embedding reuse), retention bookkeeping; the versions are stripped (no content hash, filename
     ``erased``: a filename can be user data; byte size and media type stay), their bytes given back to the
     tenant's quota, and the tasks' stored error messages removed. Version and task rows stay: history, the
     state machine and the business keys need them; a manual retry of an erased version's task is refused.
  5. ``document_erasure_insert``: the erase is recorded with counts, never content.
After the commit: each task's run artifacts (``ArtifactStore.delete_task``) and each blob no other version
names (a blob shared with another document stays: only this document's reference went). The record is then
completed with those counts and anything that could not be removed, with why.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pipelines.domain.identifiers import validate_document_id, validate_tenant
from resources.artifact_store import ArtifactStore
from resources.blob_gc import collect_lock
from resources.blob_store import BlobStore
from resources.database import Database, Session
from resources.publisher import TOMBSTONE, Publisher

OPEN = ("PENDING", "RETRY_WAIT", "RUNNING")
CONTENT_KINDS = ("chunks", "lexical_rows", "lexical_postings", "search_pointers", "tasks_cancelled",
                 "versions_stripped", "blobs", "blob_references", "artifact_files")
"""Kinds whose removal makes an erase ``erased`` rather than ``already_erased`` (the BM25 ledger row a tombstone's
publish writes back holds no terms, so it does not count)."""


@dataclass
class EraseReceipt:
    """What an erase removed, per kind, and what it could not remove and why."""

    tenant_id: str
    document_id: str
    outcome: str
    """``erased`` (something was purged), ``already_erased`` (nothing left to purge) or ``not_found``."""
    tombstone_version: int | None = None
    tombstone_task_id: int | None = None
    removed: dict[str, int] = field(default_factory=dict)
    not_removed: list[dict[str, Any]] = field(default_factory=list)
    erasure_id: int | None = None
    erased_at: datetime | None = None
    vacuumed: bool = False

    @property
    def message(self) -> str:
        if self.outcome == "not_found":
            return f"nothing to erase: {self.document_id} was never published"
        counts = ", ".join(f"{kind} {n}" for kind, n in self.removed.items() if n) or "nothing left to remove"
        head = (f"erased {self.document_id}" if self.outcome == "erased"
                else f"already erased: {self.document_id}")
        tail = f"; not removed: {len(self.not_removed)} item(s)" if self.not_removed else ""
        return f"{head} (tombstone v{self.tombstone_version}): {counts}{tail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id, "document_id": self.document_id, "outcome": self.outcome,
            "tombstone_version": self.tombstone_version, "tombstone_task_id": self.tombstone_task_id,
            "removed": dict(self.removed), "not_removed": list(self.not_removed), "erasure_id": self.erasure_id,
            "erased_at": self.erased_at.isoformat() if self.erased_at else None, "vacuumed": self.vacuumed,
            "message": self.message,
        }


class Eraser:
    def __init__(self, db: Database, blobs: BlobStore, artifacts: ArtifactStore, *, max_attempts: int = 5) -> None:
        self.db = db
        self.blobs = blobs
        self.artifacts = artifacts
        self.publisher = Publisher(db, blobs, max_attempts=max_attempts, quota_bytes=None)

    def erase(self, tenant_id: str, document_id: str, *, vacuum: bool = False) -> EraseReceipt:
        """Delete, then purge every stored copy of the document (module docstring); idempotent. ``vacuum``: then
        VACUUM the touched tables (``erase_vacuum``), so the purged rows' dead versions are reclaimed now rather
        than by autovacuum later; it reads each whole table, so it is opt-in."""
        validate_tenant(tenant_id)
        document_id = validate_document_id(document_id)
        started = time.time()
        with self.db.transaction() as tx:
            deleted = self.publisher.delete_in(tx, tenant_id, document_id)
            if deleted.outcome == "not_found":
                return EraseReceipt(tenant_id, document_id, "not_found")
            receipt = EraseReceipt(tenant_id, document_id, "erased", tombstone_version=deleted.version,
                                   tombstone_task_id=deleted.task_id)
            tasks, hashes = self._purge(tx, receipt)
            row = tx.fetch_one("document_erasure_insert", {
                "tenant_id": tenant_id, "document_id": document_id, "tombstone_version": deleted.version,
                "removed": json.dumps(receipt.removed), "now": None,
            })
            assert row is not None
            receipt.erasure_id, receipt.erased_at = row["erasure_id"], row["started_at"]
        self._purge_files(receipt, tasks, hashes, started)
        if not any(receipt.removed.get(kind) for kind in CONTENT_KINDS):
            receipt.outcome = "already_erased"
        if vacuum and receipt.outcome != "not_found":
            with self.db.session() as s:
                s.execute("erase_vacuum")
            receipt.vacuumed = True
        self.db.fetch_one("document_erasure_finish", {
            "erasure_id": receipt.erasure_id, "removed": json.dumps(receipt.removed),
            "not_removed": json.dumps(receipt.not_removed),
        })
        return receipt

    def _purge(self, tx: Session, receipt: EraseReceipt) -> tuple[list[dict[str, Any]], list[str]]:
        """The database part, inside the erase transaction; returns the document's tasks and its former hashes."""
        key = {"tenant_id": receipt.tenant_id, "document_id": receipt.document_id}
        removed = receipt.removed
        tasks = tx.fetch_all("erase_index_task_lock", key)
        cancelled = 0
        for task in tasks:
            if task["kind"] != TOMBSTONE and task["status"] in OPEN:
                if tx.fetch_one("task_cancel", {"task_id": task["task_id"], "now": None}):
                    cancelled += 1
                if task["status"] == "RUNNING":
                    receipt.not_removed.append({
                        "kind": "artifact_files", "task_id": task["task_id"],
                        "why": "its run was RUNNING and is now cancelled: a file it writes before it notices is "
                               "removed by the artifact sweep, not by this erase",
                    })
        removed["tasks_cancelled"] = cancelled
        pointers = tx.fetch_all("erase_search_pointer_delete", key)
        removed["search_pointers"] = len(pointers)
        for row in tx.fetch_all("erase_lexical_document_profiles", key):
            tx.fetch_one("lexical_stats_reconcile", {**key, "profile": row["profile"],
                                                     "document_ids": [receipt.document_id]})
        removed["lexical_postings"] = tx.execute("erase_lexical_posting_delete", key)
        removed["lexical_rows"] = tx.execute("erase_lexical_chunk_delete", key)
        removed["lexical_ledger_rows"] = tx.execute("erase_lexical_document_delete", key)
        removed["chunks"] = tx.execute("erase_chunk_delete", key)
        removed["superseded_records"] = tx.execute("erase_superseded_version_delete", key)
        versions = tx.fetch_all("erase_document_version_strip", {**key, "now": None})
        removed["versions_stripped"] = len(versions)
        removed["quota_bytes_released"] = int(versions[0]["released_bytes"]) if versions else 0
        removed["task_error_messages"] = tx.execute("erase_index_task_strip", key)
        hashes = sorted({v["content_hash"] for v in versions if v["content_hash"]})
        shared = {r["content_hash"] for r in tx.fetch_all("erase_blob_hashes_referenced", {"hashes": hashes})}
        removed["blob_references"] = len(hashes)
        for digest in sorted(shared):
            receipt.not_removed.append({
                "kind": "blob", "content_hash": digest,
                "why": "another document's version has the same bytes: only this document's reference was removed",
            })
        return tasks, [h for h in hashes if h not in shared]

    def _purge_files(self, receipt: EraseReceipt, tasks: list[dict[str, Any]], hashes: list[str],
                     started: float) -> None:
        """Run artifacts of every task of the document, and its blobs that no other version names."""
        files = 0
        for task in tasks:
            try:
                files += self.artifacts.delete_task(task["task_id"])
            except OSError as exc:
                receipt.not_removed.append({"kind": "artifact_files", "task_id": task["task_id"],
                                            "why": f"could not delete: {type(exc).__name__}"})
        receipt.removed["artifact_files"] = files
        blobs = 0
        for digest in hashes:
            try:
                outcome = self._erase_blob(digest, started)
            except OSError as exc:
                receipt.not_removed.append({"kind": "blob", "content_hash": digest,
                                            "why": f"could not delete: {type(exc).__name__}"})
                continue
            if outcome in ("renewed", "held"):
                receipt.not_removed.append({
                    "kind": "blob", "content_hash": digest,
                    "why": "a publish stored the same bytes during the erase; blob garbage collection removes "
                           "them if no version names them",
                })
            elif outcome == "named":
                receipt.not_removed.append({"kind": "blob", "content_hash": digest,
                                            "why": "a version published since names the same bytes"})
            blobs += outcome == "deleted"
        receipt.removed["blobs"] = blobs

    def _erase_blob(self, digest: str, started: float) -> str:
        """One blob, under the lock every deleter of blobs takes (resources/blob_gc.py ``collect_lock``): ``held``
        (a publish of these bytes is between storing and committing), ``named`` (one committed a version that
        names them since the erase's check), else what ``BlobStore.erase`` says."""
        with self.db.session() as s, collect_lock(s, digest) as locked:
            if not locked:
                return "held"
            if s.fetch_all("erase_blob_hashes_referenced", {"hashes": [digest]}):
                return "named"
            return self.blobs.erase(digest, stored_before=started)


__all__ = ["EraseReceipt", "Eraser"]
