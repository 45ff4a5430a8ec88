"""The fenced publish transaction (DESIGN.md invariant 3): all of a version's chunks + pointer + SUCCEEDED, or nothing.

One transaction publishes one version or a batch of them (``publish_many``: a run's versions, so a
small document does not pay a dozen round trips and a commit of its own; issue #14). In it:
  1. ``queue.send_lock_fenced``: lock the task rows (task-id order) and re-check each fence (owner, lease
     attempt, unexpired); a version whose lease was lost or whose task was cancelled is left out with
     LeaseLost / TaskCancelled and nothing of it is written. Every chunk id is then re-derived from
     that row's version and profile: chunks made for another profile or version are refused, whatever
     the caller passed. The fast path (resources/chunk_copy.py) sends its claim of the task just before, in
     the same transaction, fenced on the attempt that claim grants (``publish(claim=True)``).
  2. ``search_pointer_advance_fenced``: move each pointer forward only (key order, so concurrent publishes
     lock pointer rows in one order), the version read from the task row where the fence holds; sent with
     the lock, so both wait once (a version step 1's checks refuse sends the transaction again without it).
     A version whose document already points at a newer one is superseded: none of its chunks are written
     (a note goes to the task's history).
  3. ``chunk_delete_stale`` + ``chunk_upsert``: write the chunks by stable id (invariant 5), one
     statement per ``write_batch`` rows across versions; a re-run rewrites nothing. A count per version
     proves every row is there (``index_rows_check``: the server aborts the transaction if not).
     (Measured on 2,000 rows, without the HNSW index: unnest of parallel
     arrays with vectors sent in binary ~20k rows/s, COPY into a temp table + INSERT SELECT ~15-30k,
     executemany ~16k; with the HNSW index every method runs at the index's ~500-800 rows/s. unnest keeps
     one named statement and no temp-table DDL in the transaction; the vectors MUST go binary
     (``%(embeddings)b``): text-formatted vector[] costs 30x.) Each row also records ``embed_digest``
     (sha256 of the chunk's ``embed_text``) so a later version can reuse its vector
     (resources/embedding_reuse.py), and under a context profile ``context_title`` (the document title its
     lexical row reads too; chunks with a title are refused under a profile without context). The lexical
     (BM25) rows of the same chunks go in right after each batch (``lexical_chunk_upsert``,
     resources/lexical.py; stale ones went with their chunks, by cascade), and ``lexical_stats_reconcile``
     then makes each tenant's BM25 statistics count the versions now pointed (one statement per tenant and
     profile, in that order: stats rows are locked in one global order).
  4. ``queue.complete_published``: RUNNING -> SUCCEEDED with their events, in the same transaction, and the
     server's check that each task moved.
The count and completion checks raise in the server (SQLSTATE KB002, ``kbindex_publish_abort``, migration
0055), so they are sent with COMMIT and wait for nothing; an aborted transaction becomes the typed error here.
A tombstone (a delete) is published like any version, with zero chunks: its pointer moves forward onto it,
nothing is written, and the reconcile takes the document out of its tenant's BM25 statistics; the previous
version's chunks stay until retention removes them, like any superseded version's.
Readers never see a pointer without all its chunks and lexical rows: all become visible at commit
(invariant 4), to dense and lexical search at the same instant.

A batch fails as a whole only on database trouble or a failed count; it is then published again one
version per transaction, so the version at fault fails alone and its batch-mates still publish.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pipelines.domain.chunking import VersionIdentity, chunk_id, content_digest
from pipelines.domain.errors import (
    EmbeddingInvalidResponse,
    IndexWriteFailed,
    InternalError,
    InvalidRequest,
    KbindexError,
)
from resources.database import Database, DatabaseError, Session, raised_on_purpose
from resources.embedding_reuse import embed_digest
from resources.lexical import profile_analyzer
from resources.lexical import version_columns, write_lexical
from resources.task_queue import Lease, TaskQueue

WRITE_BATCH = 500
BATCH_VERSIONS = 64
"""Versions per publish transaction at most (and about WRITE_BATCH chunks): long enough to spread a
commit and a dozen statements over many small documents, short enough to hold task rows briefly."""


class ChunkLike(Protocol):
    """What the sink needs of a chunk (pipelines.domain.chunking.Chunk has these fields)."""

    @property
    def chunk_id(self) -> str: ...
    @property
    def ordinal(self) -> int: ...
    @property
    def heading_path(self) -> Sequence[str]: ...
    @property
    def page(self) -> int | None: ...
    @property
    def text(self) -> str: ...
    @property
    def token_count(self) -> int: ...
    @property
    def content_digest(self) -> str: ...


@dataclass(frozen=True)
class PublishOutcome:
    """What the publish transaction did: the version became searchable, or it was superseded."""

    task_id: int
    tenant_id: str
    document_id: str
    version_number: int
    profile: str
    chunk_count: int
    superseded: bool
    pointer_version: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PublishItem:
    """One version to publish: its lease, chunks and vectors, and optionally the run's idea of the task (``work``)."""

    lease: Lease
    chunks: Sequence[ChunkLike]
    vectors: np.ndarray
    work: Any | None = None
    claim: bool = False
    """Claim the task in the same transaction first (``lease`` is the lease that claim grants)."""


class ClaimMissed(Exception):
    """A publish that was to claim its task first did not get the lease it expected (the task was not claimable, or
    another claim moved its attempt): the transaction rolled back, nothing changed."""

    def __init__(self, task_id: int) -> None:
        super().__init__(f"task {task_id} was not claimable as expected: left to the pipeline")
        self.task_id = task_id


class _Refused(Exception):
    """Versions refused by their checks after their pointer moved in the same transaction: it must roll back."""

    def __init__(self, errors: dict[int, KbindexError]) -> None:
        super().__init__(f"{len(errors)} versions refused after their pointer moved")
        self.errors = errors


PUBLISH_ABORTED = "KB002"
"""The SQLSTATE of a publish transaction the server aborted in one of its checks (kbindex_publish_abort, migration
0055)."""


class IndexSink:
    """Writes embedded versions to the index in the fenced publish transaction."""

    def __init__(self, db: Database, queue: TaskQueue, *, write_batch: int = WRITE_BATCH,
                 batch_versions: int = BATCH_VERSIONS) -> None:
        if write_batch < 1 or batch_versions < 1:
            raise ValueError("write_batch and batch_versions must be >= 1")
        self.db = db
        self.queue = queue
        self.write_batch = write_batch
        self.batch_versions = batch_versions

    def publish(
        self, lease: Lease, chunks: Sequence[ChunkLike], vectors: np.ndarray, *, work: Any | None = None,
        claim: bool = False,
    ) -> PublishOutcome:
        """Commit ``chunks`` with their ``vectors`` for the leased task, move the pointer, mark SUCCEEDED.

        The task's tenant, document, version and profile come from the locked task row, never from the
        caller; ``work`` (anything with those attributes plus ``model`` and ``dimension``, e.g. the run's
        TaskWork) is cross-checked against that row and the profile. Raises LeaseLost / TaskCancelled
        (nothing written), EmbeddingInvalidResponse if the vectors do not fit the profile, IndexWriteFailed
        on database trouble (nothing written).

        ``claim``: the transaction first claims the task for ``lease.owner``, sent with the fence and waiting with
        it (the fast path: one round trip fewer than a claim of its own); ``lease`` is the lease that claim grants
        (``TaskQueue.lease_to_claim``). If it grants none or another, ClaimMissed (rolled back: the task is as it
        was, for the pipeline). Any other failure rolls the claim back with the rest.
        """
        (result,) = self._transaction([PublishItem(lease, chunks, vectors, work, claim)])
        if isinstance(result, Exception):
            raise result
        return result

    def publish_many(self, items: Sequence[PublishItem]) -> list[PublishOutcome | Exception]:
        """Publish many versions (leases of one owner), a batch per transaction; one outcome per item, in order:
        a ``PublishOutcome``, or the error that kept that version out (nothing of it written)."""
        results: list[PublishOutcome | Exception | None] = [None] * len(items)
        for batch in self._batches(items):
            try:
                done = self._transaction([items[i] for i in batch])
            except Exception as exc:  # noqa: BLE001 - find the version at fault: publish each on its own
                if len(batch) == 1:
                    done = [exc]
                else:
                    done = []
                    for i in batch:
                        try:
                            done.extend(self._transaction([items[i]]))
                        except Exception as single:  # noqa: BLE001 - that version's own failure
                            done.append(single)
            for i, result in zip(batch, done, strict=True):
                results[i] = result
        return results  # type: ignore[return-value]

    def _batches(self, items: Sequence[PublishItem]) -> list[list[int]]:
        """Item indexes in batches of at most ``batch_versions`` versions and about ``write_batch`` chunks,
        with no two items of one task or one document (one pointer row per batch statement)."""
        batches: list[list[int]] = []
        current: list[int] = []
        seen: set[Any] = set()
        rows = 0
        for i, item in enumerate(items):
            work = item.work
            document = (getattr(work, "tenant_id", None), getattr(work, "document_id", None)) if work else None
            keys = {("task", item.lease.task_id)} | ({("doc", document)} if document else set())
            if current and (len(current) >= self.batch_versions or rows + len(item.chunks) > self.write_batch
                            or keys & seen or work is None):
                batches.append(current)
                current, seen, rows = [], set(), 0
            current.append(i)
            seen |= keys
            rows += len(item.chunks)
            if work is None:  # without the run's idea of the task its document is unknown: alone
                batches.append(current)
                current, seen, rows = [], set(), 0
        if current:
            batches.append(current)
        return batches

    def _transaction(self, items: Sequence[PublishItem]) -> list[PublishOutcome | Exception]:
        """One transaction for ``items`` (distinct tasks and documents); per-item errors are returned, and
        anything that spoils the whole transaction raises (it rolls back)."""
        out: list[PublishOutcome | Exception | None] = [None] * len(items)
        for i, item in enumerate(items):
            try:
                _check_batch(item.chunks, item.vectors)
            except KbindexError as exc:
                out[i] = exc
        # Pipelined: BEGIN, the writes, the checks and the completion wait for nothing; the fence, the tasks'
        # profiles and the pointer move wait once together, COMMIT once more (over a slow link: bench/relay.py).
        while True:
            try:
                return self._pipelined(items, out)
            except _Refused as refused:  # rolled back; again without the refused (each pass refuses one more)
                for i, exc in refused.errors.items():
                    out[i] = exc
            except DatabaseError as exc:
                aborted = self._aborted(exc, items)
                if aborted is None:
                    raise
                raise aborted from exc

    def _pipelined(self, items: Sequence[PublishItem],
                   out: list[PublishOutcome | Exception | None]) -> list[PublishOutcome | Exception]:
        """The transaction itself; ``out`` holds the items already refused. The tasks' profiles, the fenced lock and
        the fenced pointer move go out together and wait once; a version its checks then refuse had its pointer
        moved with the rest, so the transaction is given up (``_Refused``) and sent again without it."""
        with self.db.transaction(pipelined=True) as tx:
            pending = [i for i in range(len(items)) if out[i] is None]
            if not pending:
                return out  # type: ignore[return-value]
            leases = [items[i].lease for i in pending]
            for i in pending:
                if items[i].claim:  # the claim first: the fence below then holds on the lease it grants
                    self.queue.send_claim_ahead(tx, items[i].lease)
            sent = tx.submit("index_profile_of_tasks", {"task_ids": [lease.task_id for lease in leases]})
            lock, fence = self.queue.send_lock_fenced(tx, leases)
            advanced = tx.submit("search_pointer_advance_fenced",
                                 {**fence, "chunk_counts": [len(items[i].chunks) for i in pending]})
            locked, refused = self.queue.read_lock_fenced(tx, leases, lock)  # waits for all three
            moved = {r["task_id"] for r in advanced.fetchall()}
            lost = {lease.task_id: exc for lease, exc in refused}
            missed = [items[i].lease.task_id for i in pending if items[i].claim and items[i].lease.task_id in lost]
            if missed:  # its claim may have granted another attempt: roll that back too
                raise ClaimMissed(missed[0])
            keys: dict[int, dict[str, Any]] = {}
            profiles: dict[str, dict[str, Any] | None] = {row["name"]: row for row in sent.fetchall()}
            spoiled: dict[int, KbindexError] = {}
            for i in pending:
                item = items[i]
                if item.lease.task_id in lost:
                    out[i] = lost[item.lease.task_id]
                    continue
                task = locked[item.lease.task_id]
                key = {name: task[name] for name in ("tenant_id", "document_id", "profile", "version_number")}
                if key["profile"] not in profiles:
                    profiles[key["profile"]] = tx.fetch_one("index_profile_get", {"name": key["profile"]})
                try:
                    _check_item(item, key, profiles[key["profile"]])
                except KbindexError as exc:
                    if item.lease.task_id in moved:
                        spoiled[i] = exc
                    out[i] = exc
                    continue
                keys[i] = key
            if spoiled:
                raise _Refused(spoiled)
            ready = sorted(keys, key=lambda i: _order(keys[i]))
            if not ready:
                return out  # type: ignore[return-value]
            writing = [i for i in ready if items[i].lease.task_id in moved]
            for i in ready:
                if i not in writing:
                    out[i] = self._superseded(tx, items[i].lease, keys[i])
            self._write_versions(tx, [(keys[i], items[i]) for i in writing], profiles)
            for i in writing:
                out[i] = PublishOutcome(task_id=items[i].lease.task_id, chunk_count=len(items[i].chunks),
                                        superseded=False, pointer_version=keys[i]["version_number"], **keys[i])
            self.queue.complete_published(tx, [items[i].lease for i in ready],
                                          [0 if i not in writing else len(items[i].chunks) for i in ready])
        return out  # type: ignore[return-value]

    def _write_versions(self, tx: Session, versions: list[tuple[dict[str, Any], PublishItem]],
                        profiles: dict[str, Any]) -> None:
        """Chunk rows, lexical rows and statistics of the versions whose pointer moved; counts checked."""
        if not versions:
            return
        tx.execute("chunk_delete_stale", {  # cascades to lexical_chunk
            **version_columns([key for key, _ in versions]),
            "chunk_ids": [c.chunk_id for _, item in versions for c in item.chunks],
        })
        rows = [(key, chunk, vector) for key, item in versions for chunk, vector in zip(item.chunks, item.vectors)]
        by_profile: dict[str, list[Any]] = {}
        for row in rows:
            by_profile.setdefault(row[0]["profile"], []).append(row)
        for profile, profile_rows in by_profile.items():
            analyze = profile_analyzer(profiles[profile])  # its model's word pieces, or its own analyzer
            for start in range(0, len(profile_rows), self.write_batch):
                batch = profile_rows[start : start + self.write_batch]
                self._write(tx, batch)
                write_lexical(tx, [key for key, _, _ in batch], [chunk for _, chunk, _ in batch], analyze)
        tx.submit("index_rows_check", {  # the server aborts on a short count (_aborted)
            **version_columns([key for key, _ in versions]),
            "task_ids": [item.lease.task_id for _, item in versions],
            "expected": [len(item.chunks) for _, item in versions],
        })
        documents: dict[tuple[str, str], set[str]] = {}
        for key, _ in versions:
            documents.setdefault((key["tenant_id"], key["profile"]), set()).add(key["document_id"])
        for (tenant, profile), names in sorted(documents.items()):
            tx.submit("lexical_stats_reconcile", {"tenant_id": tenant, "profile": profile,
                                                  "document_ids": sorted(names)})  # waits with COMMIT

    def _aborted(self, exc: DatabaseError, items: Sequence[PublishItem]) -> KbindexError | None:
        """The typed error for a transaction the server aborted in ``index_rows_check`` or ``task_completed_check``
        (SQLSTATE KB002; it rolled back: nothing written); None for any other error."""
        raised = raised_on_purpose(exc, PUBLISH_ABORTED)
        if raised is None:
            return None
        reason, detail = raised
        task_id, found = int(detail.split()[0]), detail.split()[1:]
        if reason == "NOT_COMPLETED":  # the lease ran out during the transaction: why, as the task row says now
            lease = next(item.lease for item in items if item.lease.task_id == task_id)
            return self.queue.explain_refused(lease, "complete")
        chunks, lexical, expected = found
        # A chunk id already used by another version or profile: refused rather than published with a gap.
        return IndexWriteFailed(f"version has {chunks} chunk rows and {lexical} lexical rows after writing "
                                f"{expected}: chunk id clash", task_id=task_id)

    def _superseded(self, tx: Session, lease: Lease, key: dict[str, Any]) -> PublishOutcome:
        pointer = tx.fetch_one("search_pointer_get", key)
        newer = pointer["version_number"] if pointer else key["version_number"]
        tx.execute(
            "task_event_superseded",
            {
                "task_id": lease.task_id,
                "attempt": lease.attempt,
                "owner": lease.owner,
                "message": f"superseded: version {newer} is already searchable; version {key['version_number']} not written",
            },
        )
        return PublishOutcome(task_id=lease.task_id, chunk_count=0, superseded=True, pointer_version=newer, **key)

    @staticmethod
    def _write(tx: Session, rows: Sequence[tuple[dict[str, Any], ChunkLike, np.ndarray]]) -> None:
        chunks = [chunk for _, chunk, _ in rows]
        tx.execute(
            "chunk_upsert",
            {
                **version_columns([key for key, _, _ in rows]),
                "chunk_ids": [c.chunk_id for c in chunks],
                "ordinals": [c.ordinal for c in chunks],
                "heading_paths": [json.dumps(list(c.heading_path), ensure_ascii=False) for c in chunks],
                "pages": [c.page for c in chunks],
                "texts": [c.text for c in chunks],
                "token_counts": [c.token_count for c in chunks],
                "content_digests": [c.content_digest for c in chunks],
                "embed_digests": [_embed_digest_of(c) for c in chunks],
                "context_titles": [getattr(c, "context_title", None) for c in chunks],
                "embeddings": [np.ascontiguousarray(v, dtype=np.float32) for _, _, v in rows],
            },
        )


def _order(key: dict[str, Any]) -> tuple[str, str, str]:
    return (key["tenant_id"], key["document_id"], key["profile"])


def _check_item(item: PublishItem, key: dict[str, Any], profile: dict[str, Any] | None) -> None:
    """The version fits its locked task row and profile: else it is refused (nothing of it written)."""
    if profile is None:
        raise InvalidRequest(f"index profile {key['profile']!r} does not exist")
    if item.work is not None:
        _check_work(item.work, key, profile)
        if getattr(item.work, "tombstone", False) and len(item.chunks):
            raise InternalError(f"version {key['version_number']} is a tombstone: refusing to write chunks for it")
    _check_chunk_ids(item.chunks, key)
    if not profile.get("embed_context") and any(getattr(c, "context_title", None) for c in item.chunks):
        # A title would change this profile's lexical rows (and says the chunks were made for another recipe).
        raise InternalError(f"chunks carry a document title, profile {key['profile']} embeds no context")
    if len(item.chunks) and item.vectors.shape[1] != profile["dimension"]:
        raise EmbeddingInvalidResponse(
            f"embedding dimension {item.vectors.shape[1]}, profile {key['profile']} uses {profile['dimension']}"
        )


def _embed_digest_of(chunk: ChunkLike) -> str | None:
    """sha256 of the text the chunk's vector was computed from, if the chunk says (``embed_text``); else NULL.

    Only a known embed text makes a stored vector reusable by a later version (resources.embedding_reuse); a
    copied chunk carries its original's digest.
    """
    text = getattr(chunk, "embed_text", None)
    if isinstance(text, str):
        return embed_digest(text)
    return getattr(chunk, "embed_digest", None)  # a chunk copied from an earlier version (resources/chunk_copy.py)


def _check_work(work: Any, key: dict[str, Any], profile: dict[str, Any]) -> None:
    """The run's idea of the task must be the task row's: embeddings of one model and dimension (invariant 6)."""
    for name, value in key.items():
        if getattr(work, name, value) != value:
            raise InternalError(f"run state names {name}={getattr(work, name)!r}, the task row {value!r}")
    model, dimension = getattr(work, "model", profile["model"]), getattr(work, "dimension", profile["dimension"])
    if (model, dimension) != (profile["model"], profile["dimension"]):
        raise EmbeddingInvalidResponse(
            f"embedded with {model} ({dimension} dims), profile {profile['name']} uses "
            f"{profile['model']} ({profile['dimension']} dims)"
        )


def _check_chunk_ids(chunks: Sequence[ChunkLike], key: dict[str, Any]) -> None:
    """Every chunk id re-derived from the locked task row's own version and profile (invariant 5).

    Run state that belongs to another profile of the same version (or another version) can never
    be committed under this task, whatever the caller's files say (issue #12, defect 1).
    """
    identity = VersionIdentity(key["tenant_id"], key["document_id"], key["version_number"], key["profile"])
    for c in chunks:
        if c.content_digest != content_digest(c.text) or c.chunk_id != chunk_id(
            identity, c.ordinal, tuple(c.heading_path), c.content_digest
        ):
            raise InternalError(
                f"chunk {c.ordinal} was not made for version {key['version_number']} under profile "
                f"{key['profile']}: refusing to write"
            )


def _check_batch(chunks: Sequence[ChunkLike], vectors: np.ndarray) -> None:
    """One vector per chunk, finite, unique ids and ordinals: anything else is a bug upstream."""
    if not isinstance(vectors, np.ndarray) or vectors.ndim != 2 or vectors.shape[0] != len(chunks):
        raise EmbeddingInvalidResponse(
            f"{len(chunks)} chunks but {getattr(vectors, 'shape', None)} vectors: refusing to write"
        )
    if len(chunks) and not np.isfinite(vectors).all():
        raise EmbeddingInvalidResponse("embedding contains NaN or infinite values: refusing to write")
    if len({c.chunk_id for c in chunks}) != len(chunks) or len({c.ordinal for c in chunks}) != len(chunks):
        raise InternalError("duplicate chunk ids or ordinals in one version: refusing to write")
