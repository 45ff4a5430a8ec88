"""Publishing a document version: store the bytes, then record the version and its PENDING task(s).

The version row, the task row(s) and their events commit in one transaction; the event trigger
NOTIFYs listeners. The same bytes for the same document again create nothing and return the
existing task, re-queued if it was CANCELLED (a cancel is never a dead end); changed bytes make
version n+1. Concurrent publishes of one document are serialized by a row lock on the document.
"""

from __future__ import annotations

import mimetypes
import os
import posixpath
from dataclasses import asdict, dataclass

from pipelines.domain.errors import InvalidRequest, QuotaExceeded
from pipelines.domain.identifiers import validate_document_id, validate_tenant
from pipelines.domain.partition_keys import version_partition_key
from resources.blob_store import BlobStore, content_hash
from resources.database import Database

mimetypes.add_type("text/markdown", ".md")
mimetypes.add_type("text/markdown", ".markdown")
mimetypes.add_type("text/x-rst", ".rst")
mimetypes.add_type("application/vnd.openxmlformats-officedocument.wordprocessingml.document", ".docx")


@dataclass(frozen=True)
class PublishResult:
    tenant_id: str
    document_id: str
    version: int
    task_id: int
    status: str
    created: bool
    profile: str
    content_hash: str
    requeued: bool = False
    """Same bytes as the latest version, whose CANCELLED task this publish put back to PENDING."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def media_type_for(filename: str) -> str:
    guessed, _ = mimetypes.guess_type(filename, strict=False)
    return guessed or "application/octet-stream"


def safe_filename(filename: str) -> str:
    """The last path component only, without control characters (it is a label, never a path)."""
    name = posixpath.basename(filename.replace("\\", "/")).strip()
    name = "".join(ch for ch in name if ch.isprintable())[:255]
    return name or "unnamed"


QUOTA_ENV = "KBINDEX_TENANT_QUOTA_BYTES"
DEFAULT_QUOTA_BYTES = 10 * 1024**3


def quota_from_env() -> int | None:
    """Per-tenant stored bytes (KBINDEX_TENANT_QUOTA_BYTES, default 10 GiB; 0 turns the quota off)."""
    value = int(os.environ.get(QUOTA_ENV) or DEFAULT_QUOTA_BYTES)
    return value if value > 0 else None


class Publisher:
    def __init__(
        self,
        db: Database,
        blobs: BlobStore,
        *,
        max_attempts: int = 5,
        max_bytes: int = 50 * 1024 * 1024,
        quota_bytes: int | None | str = "env",
    ) -> None:
        self.db = db
        self.blobs = blobs
        self.max_attempts = max_attempts
        self.max_bytes = max_bytes
        self.quota_bytes = quota_from_env() if quota_bytes == "env" else quota_bytes

    def _over_quota(self, tenant_id: str, stored: int) -> QuotaExceeded:
        return QuotaExceeded(
            f"tenant {tenant_id} would store {stored:,} bytes, more than its quota of {self.quota_bytes:,}; "
            "remove documents or ask for a larger quota"
        )

    def _is_latest(self, tenant_id: str, document_id: str, data: bytes) -> bool:
        """Whether ``data`` are the document's latest bytes (publishing them again stores nothing new)."""
        latest = self.db.fetch_one("document_version_latest", {"tenant_id": tenant_id, "document_id": document_id})
        return latest is not None and latest["content_hash"] == content_hash(data)

    def publish(
        self, tenant_id: str, document_id: str, data: bytes, filename: str, media_type: str | None = None
    ) -> PublishResult:
        validate_tenant(tenant_id)
        document_id = validate_document_id(document_id)  # NFC: one document however the id was typed
        if len(data) > self.max_bytes:
            raise InvalidRequest(f"file is larger than the {self.max_bytes // (1024 * 1024)} MB limit")
        name = safe_filename(filename)
        if self.quota_bytes is not None:  # before the bytes are stored: a refused publish leaves no file
            row = self.db.fetch_one("tenant_storage_get", {"tenant_id": tenant_id})
            stored = int(row["stored_bytes"]) if row else 0
            if stored + len(data) > self.quota_bytes and not self._is_latest(tenant_id, document_id, data):
                raise self._over_quota(tenant_id, stored + len(data))
        digest = self.blobs.put(data)  # bytes first: a failed transaction leaves only an unreferenced blob
        key = {"tenant_id": tenant_id, "document_id": document_id}
        with self.db.transaction() as tx:
            tx.fetch_one("document_lock", key)
            latest = tx.fetch_one("document_version_latest", key)
            if latest is not None and latest["content_hash"] == digest:
                version = latest["version_number"]
            else:
                version = (latest["version_number"] if latest else 0) + 1
                tx.execute(
                    "document_version_insert",
                    {
                        **key,
                        "version": version,
                        "content_hash": digest,
                        "byte_size": len(data),
                        "filename": name,
                        "media_type": media_type or media_type_for(name),
                        "partition_key": version_partition_key(tenant_id, document_id, version),
                    },
                )
                charged = tx.fetch_one("tenant_storage_charge", {"tenant_id": tenant_id, "byte_size": len(data)})
                if self.quota_bytes is not None and charged and charged["stored_bytes"] > self.quota_bytes:
                    raise self._over_quota(tenant_id, int(charged["stored_bytes"]))  # rolls the version back
            tasks = tx.fetch_all("index_task_ensure", {**key, "version": version, "max_attempts": self.max_attempts})
            if not tasks:  # raised inside the transaction: the version row is rolled back with it
                raise InvalidRequest("no active index profile: activate one with `kbindex profile activate NAME`")
        primary = next((t for t in tasks if t["is_active"]), tasks[0])
        return PublishResult(
            tenant_id=tenant_id,
            document_id=document_id,
            version=version,
            task_id=primary["task_id"],
            status=primary["status"],
            created=bool(primary["created"]),
            requeued=bool(primary["requeued"]),
            profile=primary["profile"],
            content_hash=digest,
        )


__all__ = ["PublishResult", "Publisher", "content_hash", "media_type_for", "safe_filename"]
