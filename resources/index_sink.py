"""The fenced publish transaction (DESIGN.md invariant 3): all of a version's chunks + pointer + SUCCEEDED, or nothing.

In ONE transaction:
  1. ``queue.lock_fenced``: lock the task row and re-check the fence (owner, lease attempt, unexpired);
     a lost lease or a cancelled task raises LeaseLost / TaskCancelled and the transaction rolls back.
     Every chunk id is then re-derived from that row's version and profile: chunks made for another
     profile or version are refused, whatever the caller passed.
  2. ``search_pointer_advance``: move the pointer forward only. If a newer version is already pointed,
     this version is superseded: none of its chunks are written (a note goes to the task's history).
  3. ``chunk_delete_stale`` + ``chunk_upsert``: write the version's chunks by stable id (invariant 5),
     one statement per batch; a re-run rewrites nothing. A count check proves every row is there.
     (Measured on 2,000 rows, without the HNSW index: unnest of parallel arrays with vectors sent in
     binary ~20k rows/s, COPY into a temp table + INSERT SELECT ~15-30k, executemany ~16k; with the
     HNSW index every method runs at the index's ~500-800 rows/s. unnest keeps one named statement
     and no temp-table DDL in the transaction; the vectors MUST go binary (``%(embeddings)b``):
     text-formatted vector[] costs 30x.) Each row also records ``embed_digest`` (sha256 of the chunk's
     ``embed_text``) so a later version can reuse its vector (resources/embedding_reuse.py).
     The lexical (BM25) rows of the same chunks go in right after each batch (``lexical_chunk_upsert``,
     resources/lexical.py; stale ones went with their chunks, by cascade), and ``lexical_stats_reconcile``
     then makes the tenant's BM25 statistics count the version now pointed (issue #13).
  4. ``queue.complete(..., session=tx)``: RUNNING -> SUCCEEDED with its event.
Readers never see the pointer without all its chunks and lexical rows: all become visible at commit
(invariant 4), to dense and lexical search at the same instant.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pipelines.domain.chunking import VersionIdentity, chunk_id, content_digest
from pipelines.domain.errors import EmbeddingInvalidResponse, IndexWriteFailed, InternalError, InvalidRequest
from resources.database import Database, Session
from resources.embedding_reuse import embed_digest
from resources.lexical import tokenizer_for as lexical_tokenizer_for
from resources.lexical import write_lexical
from resources.task_queue import Lease, TaskQueue

WRITE_BATCH = 500


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


class IndexSink:
    """Writes one embedded version to the index in the fenced publish transaction."""

    def __init__(self, db: Database, queue: TaskQueue, *, write_batch: int = WRITE_BATCH) -> None:
        if write_batch < 1:
            raise ValueError("write_batch must be >= 1")
        self.db = db
        self.queue = queue
        self.write_batch = write_batch

    def publish(
        self, lease: Lease, chunks: Sequence[ChunkLike], vectors: np.ndarray, *, work: Any | None = None
    ) -> PublishOutcome:
        """Commit ``chunks`` with their ``vectors`` for the leased task, move the pointer, mark SUCCEEDED.

        The task's tenant, document, version and profile come from the locked task row, never from the
        caller; ``work`` (anything with those attributes plus ``model`` and ``dimension``, e.g. the run's
        VersionWork) is cross-checked against that row and the profile. Raises LeaseLost / TaskCancelled
        (nothing written), EmbeddingInvalidResponse if the vectors do not fit the profile, IndexWriteFailed
        on database trouble (nothing written).
        """
        _check_batch(chunks, vectors)
        with self.db.transaction() as tx:
            task = self.queue.lock_fenced(tx, lease)
            key = {
                "tenant_id": task["tenant_id"],
                "document_id": task["document_id"],
                "profile": task["profile"],
                "version_number": task["version_number"],
            }
            profile = tx.fetch_one("index_profile_get", {"name": key["profile"]})
            if profile is None:
                raise InvalidRequest(f"index profile {key['profile']!r} does not exist")
            if work is not None:
                _check_work(work, key, profile)
            _check_chunk_ids(chunks, key)
            if len(chunks) and vectors.shape[1] != profile["dimension"]:
                raise EmbeddingInvalidResponse(
                    f"embedding dimension {vectors.shape[1]}, profile {key['profile']} uses {profile['dimension']}"
                )
            advanced = tx.fetch_one(
                "search_pointer_advance", {**key, "task_id": lease.task_id, "chunk_count": len(chunks)}
            )
            if advanced is None:
                return self._superseded(tx, lease, key)
            chunk_ids = [c.chunk_id for c in chunks]
            tx.execute("chunk_delete_stale", {**key, "chunk_ids": chunk_ids})  # cascades to lexical_chunk
            tokenizer = lexical_tokenizer_for(profile["model"])
            for start in range(0, len(chunks), self.write_batch):
                batch = chunks[start : start + self.write_batch]
                self._write(tx, key, batch, vectors[start : start + self.write_batch])
                write_lexical(tx, key, batch, tokenizer)
            for counter in ("chunk_count_version", "lexical_count_version"):
                stored = tx.fetch_one(counter, key)
                if stored is None or stored["n"] != len(chunks):
                    # A chunk id already used by another version or profile: refuse rather than publish a gap.
                    raise IndexWriteFailed(
                        f"version has {stored['n'] if stored else 0} rows ({counter}) after writing {len(chunks)}: "
                        "chunk id clash",
                        task_id=lease.task_id,
                    )
            tx.fetch_one("lexical_stats_reconcile", key)
            self.queue.complete(lease, chunk_count=len(chunks), session=tx)
            return PublishOutcome(
                task_id=lease.task_id,
                chunk_count=len(chunks),
                superseded=False,
                pointer_version=key["version_number"],
                **key,
            )

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
        self.queue.complete(lease, chunk_count=0, session=tx)
        return PublishOutcome(
            task_id=lease.task_id, chunk_count=0, superseded=True, pointer_version=newer, **key
        )

    @staticmethod
    def _write(tx: Session, key: dict[str, Any], chunks: Sequence[ChunkLike], vectors: np.ndarray) -> None:
        tx.execute(
            "chunk_upsert",
            {
                **key,
                "chunk_ids": [c.chunk_id for c in chunks],
                "ordinals": [c.ordinal for c in chunks],
                "heading_paths": [json.dumps(list(c.heading_path), ensure_ascii=False) for c in chunks],
                "pages": [c.page for c in chunks],
                "texts": [c.text for c in chunks],
                "token_counts": [c.token_count for c in chunks],
                "content_digests": [c.content_digest for c in chunks],
                "embed_digests": [_embed_digest_of(c) for c in chunks],
                "embeddings": list(np.ascontiguousarray(vectors, dtype=np.float32)),
            },
        )


def _embed_digest_of(chunk: ChunkLike) -> str | None:
    """sha256 of the text the chunk's vector was computed from, if the chunk says (``embed_text``); else NULL.

    Only a known embed text makes a stored vector reusable by a later version (resources.embedding_reuse).
    """
    text = getattr(chunk, "embed_text", None)
    return embed_digest(text) if isinstance(text, str) else None


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
