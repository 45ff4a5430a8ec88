"""Publishing a document version: store the bytes, then record the version and its PENDING task(s).

The version row, the task row(s) and their events commit in one transaction; the event trigger
NOTIFYs listeners. The same bytes with the same metadata and allow list for the same document again
create nothing and return the existing task, re-queued if it was CANCELLED (a cancel is never a dead
end); changed bytes, metadata or allow list make version n+1 (DESIGN.md "metadata": part of a version's
identity; a change of metadata alone is indexed by copying the previous version's chunks,
resources/chunk_copy.py). Concurrent publishes of one document are serialized by a row lock on the document.
``publish_many`` records a batch of one tenant's documents the same way, in one transaction (`kbindex publish
DIR`, source passes): the whole batch becomes due at once.

A delete (``delete``) records a tombstone the same way: version n+1 without bytes, and its task(s), in
one transaction under the same lock and through the same statements. It keeps the deleted version's allow
list (and metadata), so a tombstone's task tells no more about the document than the version did.
"""

from __future__ import annotations

import json
import mimetypes
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
import posixpath
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from pipelines.domain.errors import IndexWriteFailed, InvalidRequest, KbindexError, QuotaExceeded
from pipelines.domain.identifiers import validate_document_id, validate_tenant
from pipelines.domain.metadata import canonical_allow, canonical_metadata
from pipelines.domain.partition_keys import version_partition_key
from resources.blob_store import BlobStore, content_hash
from resources.database import Database, DatabaseError, Session, raised_on_purpose

T = TypeVar("T")

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
    metadata: dict[str, Any] = field(default_factory=dict)
    allow: list[str] | None = None
    """Principals that may read the version; None: the whole tenant."""
    tasks: list[dict[str, Any]] = field(default_factory=list)
    """Every task of the version (one per target profile): task_id, profile, status."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class PublishRequest:
    """One document of a ``Publisher.publish_many`` batch: what ``publish`` takes, as one value."""

    document_id: str
    data: bytes
    filename: str
    media_type: str | None = None
    metadata: Mapping[str, Any] | None = None
    allow: Iterable[str] | None = None
    """Principals that may read the version; None: the whole tenant."""
    with_commit: Callable[[Session], None] | None = None
    """Run inside the batch's transaction after this document's version (source sync's ledger row)."""


@dataclass(frozen=True)
class _Item:
    """A validated request: canonical id, metadata and allow list, its content hash."""

    document_id: str
    data: bytes
    name: str
    media_type: str
    meta: dict[str, Any]
    allowed: list[str] | None
    digest: str
    with_commit: Callable[[Session], None] | None


NO_ACTIVE_PROFILE = "no active index profile: activate one with `kbindex profile activate NAME`"
REFUSED = "KB001"
"""The SQLSTATE of a publish the server refused (kbindex_refuse, migration 0054)."""

TOMBSTONE = "tombstone"
"""document_version.kind of a delete: a version without bytes (migration 0029)."""


@dataclass(frozen=True)
class DeleteResult:
    """What ``Publisher.delete`` did: ``deleted`` (a new tombstone and its task(s)), ``already_deleted`` (the
    latest version is a tombstone: its task(s), nothing new) or ``not_found`` (never published: nothing)."""

    tenant_id: str
    document_id: str
    outcome: str
    version: int | None = None
    task_id: int | None = None
    status: str | None = None
    profile: str | None = None
    created: bool = False
    requeued: bool = False
    tasks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def message(self) -> str:
        if self.outcome == "not_found":
            return f"nothing to delete: {self.document_id} was never published"
        if self.outcome == "already_deleted":
            return f"already deleted: {self.document_id} v{self.version} is a tombstone (task {self.task_id} {self.status})"
        return f"deleted {self.document_id}: tombstone v{self.version}, task {self.task_id} {self.status}"

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "message": self.message}


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


VERSIONS_QUOTA_ENV = "KBINDEX_TENANT_QUOTA_VERSIONS"
DEFAULT_QUOTA_VERSIONS = 2_000_000


def quota_from_env() -> int | None:
    """Per-tenant stored bytes (KBINDEX_TENANT_QUOTA_BYTES, default 10 GiB; 0 turns the quota off)."""
    value = int(os.environ.get(QUOTA_ENV) or DEFAULT_QUOTA_BYTES)
    return value if value > 0 else None


def versions_quota_from_env() -> int | None:
    """Per-tenant live document versions (KBINDEX_TENANT_QUOTA_VERSIONS, default 2,000,000; 0 turns it off).

    The byte quota alone let 1-byte documents make unlimited versions, and each is rows, a task per target
    profile, a partition key and a share of a run (issue #31). A version stops counting when retention or an
    erase releases its bytes; a tombstone counts and is never refused (a delete must always be possible)."""
    value = int(os.environ.get(VERSIONS_QUOTA_ENV) or DEFAULT_QUOTA_VERSIONS)
    return value if value > 0 else None


# `kbindex publish DIR` and the benches publish this many documents (and at most this many bytes) per
# publish_many transaction: a burst lands due at once, in transactions that hold their row locks briefly.
BATCH_DOCUMENTS = int(os.environ.get("KBINDEX_PUBLISH_BATCH", "1000"))
BATCH_BYTES = int(os.environ.get("KBINDEX_PUBLISH_BATCH_BYTES", str(64 * 1024 * 1024)))


def batched(items: Sequence[T], size: Callable[[T], int], max_items: int | None = None,
            max_bytes: int | None = None) -> Iterator[list[T]]:
    """``items`` in order, cut into batches of at most ``max_items`` and ``max_bytes`` (by ``size``; a larger
    item is a batch of its own). Defaults: BATCH_DOCUMENTS and BATCH_BYTES."""
    max_items = BATCH_DOCUMENTS if max_items is None else max_items
    max_bytes = BATCH_BYTES if max_bytes is None else max_bytes
    batch: list[T] = []
    held = 0
    for item in items:
        weight = size(item)
        if batch and (len(batch) >= max(1, max_items) or held + weight > max_bytes):
            yield batch
            batch, held = [], 0
        batch.append(item)
        held += weight
    if batch:
        yield batch


class Publisher:
    def __init__(
        self,
        db: Database,
        blobs: BlobStore,
        *,
        max_attempts: int = 5,
        max_bytes: int = 50 * 1024 * 1024,
        quota_bytes: int | None | str = "env",
        quota_versions: int | None | str = "env",
        fast: Any | None = None,
    ) -> None:
        """``fast``: a ``resources.chunk_copy.FastPublish`` that indexes, in this process and right after the
        commit, the versions that need no computing (deletes, metadata-only changes); None leaves all to runs."""
        self.db = db
        self.fast = fast
        self.blobs = blobs
        self.max_attempts = max_attempts
        self.max_bytes = max_bytes
        self.quota_bytes = quota_from_env() if quota_bytes == "env" else quota_bytes
        self.quota_versions = versions_quota_from_env() if quota_versions == "env" else quota_versions

    def _over_quota(self, tenant_id: str, stored: int) -> QuotaExceeded:
        return QuotaExceeded(
            f"tenant {tenant_id} would store {stored:,} bytes, more than its stored-bytes quota of "
            f"{self.quota_bytes:,} ({QUOTA_ENV}); remove documents or ask for a larger quota"
        )

    def _over_versions(self, tenant_id: str, versions: int) -> QuotaExceeded:
        return QuotaExceeded(
            f"tenant {tenant_id} would hold {versions:,} document versions, more than its versions quota of "
            f"{self.quota_versions:,} ({VERSIONS_QUOTA_ENV}); superseded versions count until retention releases "
            "them: publish less often or ask for a larger quota"
        )

    def _check_quotas(self, tenant_id: str, stored: int, versions: int) -> None:
        if self.quota_bytes is not None and stored > self.quota_bytes:
            raise self._over_quota(tenant_id, stored)
        if self.quota_versions is not None and versions > self.quota_versions:
            raise self._over_versions(tenant_id, versions)

    def _is_latest(self, tenant_id: str, document_id: str, digest: str) -> bool:
        """Whether ``digest`` names the document's latest bytes (publishing them again stores nothing new)."""
        latest = self.db.fetch_one("document_version_latest", {"tenant_id": tenant_id, "document_id": document_id})
        return latest is not None and latest["content_hash"] == digest

    def publish(
        self, tenant_id: str, document_id: str, data: bytes, filename: str, media_type: str | None = None, *,
        metadata: Mapping[str, Any] | None = None, allow: Iterable[str] | None = None,
        with_commit: Callable[[Session], None] | None = None,
    ) -> PublishResult:
        """Store the bytes and record version n+1 with its task(s), unless the latest version has the same bytes,
        metadata and allow list (then its task). ``metadata``: pipelines/domain/metadata.py's rules;
        ``allow``: principals that may read it (None: the whole tenant). ``with_commit``: run inside the
        version's transaction, so that what it writes commits with the version or not at all (source sync's
        ledger row). InvalidMetadata, InvalidRequest, QuotaExceeded."""
        validate_tenant(tenant_id)
        item = self._prepare(PublishRequest(document_id, data, filename, media_type, metadata=metadata, allow=allow,
                                            with_commit=with_commit))
        if self.quota_bytes is not None or self.quota_versions is not None:
            # Before the bytes are stored: a refused publish leaves no file.
            row = self.db.fetch_one("tenant_storage_get", {"tenant_id": tenant_id})
            self._precheck_quotas(tenant_id, item, int(row["stored_bytes"]), int(row["live_versions"]))
        # Bytes first, outside the transaction (a slow store never holds a connection or nears the server's
        # idle-in-transaction limit): a failed transaction leaves only an unreferenced blob.
        self.blobs.put(data)
        try:
            with self.db.transaction(pipelined=True) as tx:  # two round trips and a checkout, not eight
                version, sent = self._record(tx, tenant_id, item)
        except DatabaseError as exc:
            refusal = self._refusal(tenant_id, exc)
            if refusal is None:
                raise
            raise refusal from exc
        tasks = sent.fetchall()  # arrived with the COMMIT
        return self._result(tenant_id, item, version,
                            self._fast_publish(tenant_id, item.document_id, version, tasks, tombstone=False))

    def publish_many(self, tenant_id: str, requests: Sequence[PublishRequest]) -> list[PublishResult | KbindexError]:
        """Publish a batch of one tenant's documents in one transaction: what ``publish`` does for each, but every
        version and task of the batch commits at once, so the claiming sensor sees the whole batch due together
        and plans it as a few big runs, instead of claiming its first few documents and leaving the rest for the
        daemon's next loop (issue #34: ~2.9 s of a 1,000-document burst's median wait).

        Returns one outcome per request, in order: its PublishResult, or the KbindexError that refused it
        (InvalidMetadata, InvalidRequest, QuotaExceeded); a refused document changes nothing and the others
        publish. A refusal that is not the document's own (no active profile, a ``with_commit`` hook's error) is
        returned for every document not refused before it, and nothing of the batch is committed; a database
        failure (IndexWriteFailed) is raised, and nothing of it is committed either. No savepoints: a quota is
        checked before a document writes anything (a thousand subtransactions would overflow every session's
        snapshot cache).
        Documents are locked in document-id order, so concurrent batches cannot deadlock; the same document
        twice in a batch makes consecutive versions, in request order. The caller sizes batches (the CLI: by
        count and bytes): the transaction holds each document's row lock until it commits. An invalid tenant
        refuses every document with the same error."""
        try:
            validate_tenant(tenant_id)
        except KbindexError as exc:
            return [exc] * len(requests)
        outcomes: list[PublishResult | KbindexError | None] = [None] * len(requests)
        items: list[tuple[int, _Item]] = []
        for i, request in enumerate(requests):
            try:
                items.append((i, self._prepare(request)))
            except KbindexError as exc:
                outcomes[i] = exc
        if items and (self.quota_bytes is not None or self.quota_versions is not None):
            # Before the bytes are stored, as publish does: a document refused here leaves no file.
            row = self.db.fetch_one("tenant_storage_get", {"tenant_id": tenant_id})
            stored, versions = int(row["stored_bytes"]), int(row["live_versions"])
            admitted = []
            for i, item in items:
                try:
                    self._precheck_quotas(tenant_id, item, stored, versions)
                except QuotaExceeded as exc:
                    outcomes[i] = exc
                    continue
                stored, versions = stored + len(item.data), versions + 1  # an upper bound: a repeat adds nothing
                admitted.append((i, item))
            items = admitted
        if not items:
            return outcomes  # type: ignore[return-value]  # every request refused: each has its error
        blobs = {item.digest: item.data for _, item in items}
        for data in blobs.values():
            self.blobs.put(data)
        items.sort(key=lambda pair: pair[1].document_id)  # stable: one document's requests keep their order
        recorded: list[tuple[int, _Item, int, list[dict[str, Any]]]] = []
        try:
            # Pipelined (issue #32): BEGIN, the locks and the latest versions go in one wait, the rows and the tasks
            # in a second, the totals and COMMIT in a third, whatever the batch holds.
            with self.db.transaction(pipelined=True) as tx:
                # Locks in the order every publish takes them: the bytes, the documents, then the tenant's totals.
                digests = sorted(blobs)
                tx.execute_many("blob_hold", [{"content_hash": digest} for digest in digests])
                documents = list(dict.fromkeys(item.document_id for _, item in items))
                tx.execute_many("document_lock", [{"tenant_id": tenant_id, "document_id": document_id}
                                                  for document_id in documents])
                locked = tx.submit("tenant_storage_lock", {"tenant_id": tenant_id})
                latest = tx.fetch_all("document_version_latest_many",  # waits for the locks too
                                      {"tenant_id": tenant_id, "document_ids": documents})
                totals = locked.fetchone()
                for digest in digests:  # under the holds
                    self._store_if_collected(digest, blobs[digest])
                added = {"byte_size": 0, "versions": 0}

                def charge(size: int) -> None:  # the row is locked: these totals are exact
                    self._check_quotas(tenant_id, int(totals["stored_bytes"]) + added["byte_size"] + size,
                                       int(totals["live_versions"]) + added["versions"] + 1)
                    added["byte_size"] += size
                    added["versions"] += 1

                recorded = self._record_many(tx, tenant_id, items, latest, charge, outcomes)
                if added["versions"]:
                    tx.submit("tenant_storage_add", {"tenant_id": tenant_id, **added})  # waits with the COMMIT
        except IndexWriteFailed:
            raise
        except KbindexError as exc:  # no active profile, a with_commit hook's refusal: the batch is rolled back
            return [o if o is not None else exc for o in outcomes]
        done = set()
        if self.fast is not None:  # one copy-source lookup for the batch, not one per document
            done = {o.task_id for o in self.fast.after_publish_many(
                tenant_id, [(item.document_id, version, tasks) for _, item, version, tasks in recorded],
                tombstone=False) if o.outcome in ("published", "superseded")}
        for i, item, version, tasks in recorded:
            outcomes[i] = self._result(tenant_id, item, version,
                                       [{**t, "status": "SUCCEEDED"} if t["task_id"] in done else t for t in tasks])
        return [o for o in outcomes if o is not None]

    def publish_all(self, tenant_id: str, requests: Sequence[PublishRequest]) -> list[PublishResult]:
        """``publish_many`` for callers whose documents must all go in (`kbindex dev`'s samples, the benches):
        the first refusal is raised (the documents not refused are published)."""
        outcomes = self.publish_many(tenant_id, requests)
        refused = next((o for o in outcomes if isinstance(o, KbindexError)), None)
        if refused is not None:
            raise refused
        return outcomes  # type: ignore[return-value]  # none refused

    def _prepare(self, request: PublishRequest) -> _Item:
        """Validate one request and compute what its transaction needs (InvalidMetadata, InvalidRequest)."""
        document_id = validate_document_id(request.document_id)  # NFC: one document however the id was typed
        meta = canonical_metadata(request.metadata)
        allowed = canonical_allow(request.allow)
        if len(request.data) > self.max_bytes:
            raise InvalidRequest(f"file is larger than the {self.max_bytes // (1024 * 1024)} MB limit")
        name = safe_filename(request.filename)
        return _Item(document_id, request.data, name, request.media_type or media_type_for(name), meta, allowed,
                     content_hash(request.data), request.with_commit)

    def _precheck_quotas(self, tenant_id: str, item: _Item, stored: int, versions: int) -> None:
        """QuotaExceeded if ``item`` would pass a quota from these totals, unless it repeats the latest bytes."""
        try:
            self._check_quotas(tenant_id, stored + len(item.data), versions + 1)
        except QuotaExceeded:
            if not self._is_latest(tenant_id, item.document_id, item.digest):
                raise

    def _record(self, tx: Session, tenant_id: str, item: _Item) -> tuple[int, Any]:
        """``publish``'s transaction: version n+1 of the document and its task(s), or the latest version's if it has
        the same bytes, metadata and allow list. Returns the version and the cursor its tasks arrive on.

        In a pipelined transaction the statements go in two waits: the locks with the latest version, then the
        charge, the version row, the tasks and ``publish_refusals`` with the COMMIT. The server refuses there (no
        profile to index it, a quota passed on the charged totals) before COMMIT is carried out, so nothing of a
        refused publish commits (``_refusal`` turns it into the typed error)."""
        key = {"tenant_id": tenant_id, "document_id": item.document_id}
        tx.submit("blob_hold", {"content_hash": item.digest})
        tx.submit("document_lock", key)
        latest = tx.fetch_one("document_version_latest", key)  # waits for the locks too
        self._store_if_collected(item.digest, item.data)  # under the hold
        charged = not self._is_repeat(latest, item)
        if not charged:
            version = latest["version_number"]
        else:
            tx.submit("tenant_storage_charge", {"tenant_id": tenant_id, "byte_size": len(item.data)})
            row = self._version_row(key, latest, kind="content", content_hash=item.digest, byte_size=len(item.data),
                                    filename=item.name, media_type=item.media_type, metadata=item.meta,
                                    allow=item.allowed)
            tx.submit("document_version_insert", row)
            version = row["version"]
        tasks = tx.submit("index_task_ensure", {**key, "version": version, "max_attempts": self.max_attempts})
        tx.submit("publish_refusals", {"tenant_id": tenant_id, "charged": charged,
                                       "quota_bytes": self.quota_bytes, "quota_versions": self.quota_versions})
        if item.with_commit is not None:
            item.with_commit(tx)
        return version, tasks

    def _refusal(self, tenant_id: str, exc: DatabaseError) -> KbindexError | None:
        """The typed error for a publish the server refused (``publish_refusals``); None for any other error."""
        raised = raised_on_purpose(exc, REFUSED)
        if raised is None:
            return None
        reason, detail = raised
        stored, versions = (int(n) for n in (detail or "0 0").split())
        if reason == "QUOTA_BYTES":
            return self._over_quota(tenant_id, stored)
        if reason == "QUOTA_VERSIONS":
            return self._over_versions(tenant_id, versions)
        return InvalidRequest(NO_ACTIVE_PROFILE)

    def _record_many(self, tx: Session, tenant_id: str, items: list[tuple[int, _Item]],
                     latest_rows: list[dict[str, Any]], charge: Callable[[int], None],
                     outcomes: list[Any]) -> list[tuple[int, _Item, int, list[dict[str, Any]]]]:
        """``_record`` for a locked batch whose latest versions were read (``document_version_latest_many``), one wait
        in all instead of two a document: every new version's row, then every version's tasks, sent together.
        Versions are decided in request order before anything is written, so the same document twice makes
        consecutive versions and a quota refusal (into ``outcomes``) writes nothing."""
        latest = {r["document_id"]: r for r in latest_rows}
        rows: list[dict[str, Any]] = []
        decided: list[tuple[int, _Item, int]] = []
        for i, item in items:
            before = latest.get(item.document_id)
            if self._is_repeat(before, item):
                decided.append((i, item, before["version_number"]))
                continue
            try:
                charge(len(item.data))
            except QuotaExceeded as exc:  # refused before anything of it was written
                outcomes[i] = exc
                continue
            key = {"tenant_id": tenant_id, "document_id": item.document_id}
            row = self._version_row(key, before, kind="content", content_hash=item.digest, byte_size=len(item.data),
                                    filename=item.name, media_type=item.media_type, metadata=item.meta,
                                    allow=item.allowed)
            rows.append(row)
            latest[item.document_id] = {"version_number": row["version"], "content_hash": item.digest,
                                        "metadata": item.meta, "allow_principals": item.allowed}
            decided.append((i, item, row["version"]))
        tx.execute_many("document_version_insert", rows)
        tasks = tx.fetch_many("index_task_ensure", [
            {"tenant_id": tenant_id, "document_id": item.document_id, "version": version,
             "max_attempts": self.max_attempts} for _, item, version in decided])
        recorded = []
        for (i, item, version), version_tasks in zip(decided, tasks, strict=True):
            if not version_tasks:  # raised inside the transaction: the batch is rolled back with it
                raise InvalidRequest(NO_ACTIVE_PROFILE)
            if item.with_commit is not None:
                item.with_commit(tx)
            recorded.append((i, item, version, version_tasks))
        return recorded

    def _store_if_collected(self, digest: str, data: bytes) -> None:
        """Under ``blob_hold``: store the bytes again if garbage collection deleted them before it. The hold keeps
        them until the version commits (resources/blob_gc.py takes the same lock, exclusive, around its re-check
        and delete)."""
        if not self.blobs.exists(digest):
            self.blobs.put(data)

    @staticmethod
    def _result(tenant_id: str, item: _Item, version: int, tasks: list[dict[str, Any]]) -> PublishResult:
        """What ``publish`` returns for a committed version and its tasks (after the fast path)."""
        primary = next((t for t in tasks if t["is_active"]), tasks[0])
        return PublishResult(
            tenant_id=tenant_id,
            document_id=item.document_id,
            version=version,
            task_id=primary["task_id"],
            status=primary["status"],
            created=bool(primary["created"]),
            requeued=bool(primary["requeued"]),
            profile=primary["profile"],
            content_hash=item.digest,
            metadata=item.meta,
            allow=item.allowed,
            tasks=[{"task_id": t["task_id"], "profile": t["profile"], "status": t["status"]} for t in tasks],
        )

    def delete(self, tenant_id: str, document_id: str) -> DeleteResult:
        """Delete a document: record a tombstone, version n+1 without bytes, and its PENDING task(s), in one
        transaction, exactly as a publish records a content version (same lock, same version numbering, same
        ``index_task_ensure``). Its fenced publish later moves the search pointer onto it (resources/index_sink.py).

        Idempotent, never an error: a document never published gets nothing (``not_found``); one whose latest
        version is already a tombstone gets that tombstone's task(s) back (``already_deleted``; a CANCELLED one
        is re-queued, as a publish of the same bytes would).
        """
        validate_tenant(tenant_id)
        document_id = validate_document_id(document_id)
        try:
            with self.db.transaction(pipelined=True) as tx:  # two round trips, not seven
                sent = self._send_delete(tx, tenant_id, document_id)
                if isinstance(sent, _SentDelete):  # no version row without a task: the server refuses
                    tx.submit("publish_refusals", {"tenant_id": tenant_id, "charged": False, "quota_bytes": None,
                                                   "quota_versions": None})
        except DatabaseError as exc:
            refusal = self._refusal(tenant_id, exc)
            if refusal is None:
                raise
            raise refusal from exc
        if isinstance(sent, DeleteResult):
            return sent
        rows = sent.tasks.fetchall()  # arrived with the COMMIT
        result = sent.result(rows)
        if result.outcome != "deleted" or self.fast is None:
            return result
        tasks = self._fast_publish(tenant_id, document_id, result.version, rows, tombstone=True)  # with attempts
        primary = next((t for t in tasks if t["task_id"] == result.task_id), tasks[0])
        return replace(result, status=primary["status"], tasks=[
            {"task_id": t["task_id"], "profile": t["profile"], "status": t["status"]} for t in tasks])

    def _fast_publish(self, tenant_id: str, document_id: str, version: int, tasks: list[dict[str, Any]], *,
                      tombstone: bool) -> list[dict[str, Any]]:
        """Hand the committed version's tasks to the fast path (if any); the tasks with their statuses after it."""
        if self.fast is None or not any(t["status"] == "PENDING" for t in tasks):
            return tasks
        done = {o.task_id for o in self.fast.after_publish(tenant_id, document_id, version, tasks, tombstone=tombstone)
                if o.outcome in ("published", "superseded")}
        return [{**t, "status": "SUCCEEDED"} if t["task_id"] in done else t for t in tasks]

    def delete_in(self, tx: Session, tenant_id: str, document_id: str) -> DeleteResult:
        """``delete`` inside the caller's transaction (erase deletes and purges in one): locks the document row,
        which the caller then holds until it commits. Arguments already validated.

        In a pipelined transaction the statements go in two waits: the lock with the latest version, then the
        tombstone row, its charge and its tasks."""
        sent = self._send_delete(tx, tenant_id, document_id)
        if isinstance(sent, DeleteResult):
            return sent
        rows = sent.tasks.fetchall()
        if not rows:  # raised inside the transaction: the version row is rolled back with it
            raise InvalidRequest(NO_ACTIVE_PROFILE)
        return sent.result(rows)

    def _send_delete(self, tx: Session, tenant_id: str, document_id: str) -> DeleteResult | _SentDelete:
        """A delete's statements: the lock with the latest version (one wait), then, sent without waiting, the
        tombstone row and its charge (unless the latest version is already one) and its tasks; ``not_found``
        when the document was never published."""
        key = {"tenant_id": tenant_id, "document_id": document_id}
        locked = tx.submit("document_lock_existing", key)
        latest = tx.fetch_one("document_version_latest", key)  # read after the lock: waits for it too
        if not locked.fetchone():  # no document row: nothing was ever published (latest is None then too)
            latest = None
        if latest is None:
            return DeleteResult(tenant_id, document_id, "not_found")
        if latest["kind"] == TOMBSTONE:
            version = latest["version_number"]
        else:
            row = self._version_row(key, latest, kind=TOMBSTONE, content_hash=None, byte_size=0,
                                    filename=latest["filename"], media_type=latest["media_type"],
                                    metadata=latest["metadata"], allow=latest["allow_principals"])
            tx.submit("document_version_insert", row)
            version = row["version"]
            # Counted like any version (a row, tasks, a partition key), never refused: a delete is always possible.
            tx.submit("tenant_storage_charge", {"tenant_id": tenant_id, "byte_size": 0})
        tasks = tx.submit("index_task_ensure", {**key, "version": version, "max_attempts": self.max_attempts})
        return _SentDelete(tenant_id, document_id, "deleted" if latest["kind"] != TOMBSTONE else "already_deleted",
                           version, tasks)

    @staticmethod
    def _is_repeat(latest: Mapping[str, Any] | None, item: _Item) -> bool:
        """The document's latest version has ``item``'s bytes, metadata and allow list: publishing it adds nothing."""
        return latest is not None and (latest["content_hash"], latest["metadata"], latest["allow_principals"]) == (
            item.digest, item.meta, item.allowed)

    @staticmethod
    def _version_row(key: dict[str, str], latest: Mapping[str, Any] | None, *, kind: str, content_hash: str | None,
                     byte_size: int, filename: str, media_type: str, metadata: Mapping[str, Any],
                     allow: list[str] | None) -> dict[str, Any]:
        """``document_version_insert``'s parameters for version n+1 of the locked document (content or tombstone)."""
        version = (latest["version_number"] if latest else 0) + 1
        return {**key, "version": version, "kind": kind, "content_hash": content_hash, "byte_size": byte_size,
                "filename": filename, "media_type": media_type,
                "metadata": json.dumps(dict(metadata), ensure_ascii=False), "allow_principals": allow,
                "partition_key": version_partition_key(key["tenant_id"], key["document_id"], version)}


@dataclass(frozen=True)
class _SentDelete:
    """A delete whose tasks (``index_task_ensure``'s cursor) are still on their way."""

    tenant_id: str
    document_id: str
    outcome: str
    version: int
    tasks: Any

    def result(self, tasks: list[dict[str, Any]]) -> DeleteResult:
        """The DeleteResult, from the version's task rows (one per target profile; the active one's first)."""
        primary = next((t for t in tasks if t["is_active"]), tasks[0])
        return DeleteResult(
            self.tenant_id, self.document_id, self.outcome, version=self.version, task_id=primary["task_id"],
            status=primary["status"], profile=primary["profile"], created=bool(primary["created"]),
            requeued=bool(primary["requeued"]),
            tasks=[{"task_id": t["task_id"], "profile": t["profile"], "status": t["status"]} for t in tasks],
        )


__all__ = ["BATCH_BYTES", "BATCH_DOCUMENTS", "TOMBSTONE", "batched", "DeleteResult", "PublishRequest", "PublishResult", "Publisher", "content_hash", "media_type_for", "safe_filename"]
