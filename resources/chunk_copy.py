"""Versions that need no computing: a change of metadata or allow list only, and a tombstone.

A version whose bytes, filename and media type an earlier version of the same document already had (a
change of metadata or allow list only) is indexed by copying that version's chunks and vectors under the
same profile: no parse, no embedding (``copy_sources``, ``load_copy``). The copies get ids derived from
the new version (invariant 5) and go through the same fenced publish as any chunks, so the new metadata
and allow list reach the search pointer at the same instant as the chunks.

``FastPublish``: such versions, and tombstones, need no Dagster run at all. Right after a publish or a
delete commits, the publishing process (the CLI or the API server) runs the same fenced publish a run does
(``IndexSink``) itself, claiming each task inside it with the same claim a run's uses (sent just before the
fence, which holds on the attempt that claim grants: index_task_ensure's attempts + 1), so they are searchable,
or gone, within milliseconds instead of a sensor tick plus a run start, and the claim costs no round trip of its
own. Anything it does not finish is left to the pipeline: a task the sensor claimed first is the run's (which
copies just the same, resources/indexing_run.py); a failure that rolls the transaction back takes the claim with
it (the task waits for a run as it was); a version refused after the claim committed is recorded by the fenced
fail with its code, and a retry goes through a run.
``KBINDEX_FAST_PUBLISH=0`` turns the fast path off (everything then goes through runs).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipelines.domain.chunking import VersionIdentity, chunk_id
from pipelines.domain.errors import FenceRejected, IndexWriteFailed, KbindexError, classify
from resources.database import Database
from resources.lexical import version_columns

log = logging.getLogger("kbindex.fast_publish")

FAST_PUBLISH_ENV = "KBINDEX_FAST_PUBLISH"


@dataclass(frozen=True)
class CopiedChunk:
    """A chunk of an earlier version, re-identified for the new one (the fields IndexSink writes)."""

    chunk_id: str
    ordinal: int
    heading_path: tuple[str, ...]
    page: int | None
    text: str
    token_count: int
    content_digest: str
    embed_digest: str | None
    """sha256 of the text its vector came from (carried over: the copy stays reusable)."""
    context_title: str | None = None
    """The document title a context profile indexed it with (carried over: the copy's lexical rows read it)."""


@dataclass(frozen=True)
class CopiedVersion:
    copy_from: int
    chunks: list[CopiedChunk]
    vectors: np.ndarray


def copy_sources(db: Database, keys: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """task_id -> the earlier version whose chunks it can copy, for the tasks that have one. ``keys``: task_id,
    tenant_id, document_id, profile, version_number each. One statement, or none when every key is a first version
    (nothing earlier to copy: a burst of new documents publishes one at a time without this round trip)."""
    keys = [k for k in keys if k["version_number"] > 1]
    if not keys:
        return {}
    rows = db.fetch_all("chunk_copy_sources", {**version_columns(keys), "task_ids": [k["task_id"] for k in keys]})
    return {r["task_id"]: r["copy_from"] for r in rows}


def load_copy(db: Database, key: Mapping[str, Any], copy_from: int, dimension: int) -> CopiedVersion | None:
    """Version ``copy_from``'s chunks and vectors under ``key``'s profile, with ids for ``key``'s version; None
    when they are gone (retention or erase removed them since the plan: the caller parses instead)."""
    rows = db.fetch_all("chunk_copy_rows", {
        "tenant_id": key["tenant_id"], "document_id": key["document_id"], "profile": key["profile"],
        "version_number": copy_from,
    })
    if not rows:
        return None
    identity = VersionIdentity(key["tenant_id"], key["document_id"], key["version_number"], key["profile"])
    chunks = []
    for r in rows:
        heading = tuple(r["heading_path"] or ())
        chunks.append(CopiedChunk(
            chunk_id=chunk_id(identity, r["ordinal"], heading, r["content_digest"]), ordinal=r["ordinal"],
            heading_path=heading, page=r["page"], text=r["text"], token_count=r["token_count"],
            content_digest=r["content_digest"], embed_digest=r["embed_digest"], context_title=r["context_title"],
        ))
    vectors = np.vstack([np.asarray(r["embedding"].to_numpy() if hasattr(r["embedding"], "to_numpy")
                                    else r["embedding"], dtype=np.float32) for r in rows])
    if vectors.shape[1] != dimension:
        return None
    return CopiedVersion(copy_from, chunks, vectors)


def fast_publish_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return (environ.get(FAST_PUBLISH_ENV) or "1").strip().lower() not in ("0", "false", "no", "off")


def fast_publish_for(db: Database, environ: Mapping[str, str] = os.environ) -> FastPublish | None:
    """What a publishing process (CLI, API, source sync) hands its Publisher: the fast path unless turned off."""
    from resources.task_queue import TaskQueue

    return FastPublish(db, TaskQueue(db)) if fast_publish_enabled(environ) else None


@dataclass(frozen=True)
class FastOutcome:
    task_id: int
    outcome: str
    """published, superseded, left (to the pipeline: not claimable now, or nothing to copy), failed"""
    error_code: str | None = None


class FastPublish:
    """Claims and publishes, in this process, the tasks of a version that needs no computing (module docstring)."""

    def __init__(self, db: Database, queue: Any, *, owner: str | None = None) -> None:
        self.db = db
        self.queue = queue
        self.owner = owner or f"fast:{socket.gethostname()}:{os.getpid()}"

    def after_publish(self, tenant_id: str, document_id: str, version: int, tasks: Sequence[Mapping[str, Any]],
                      *, tombstone: bool) -> list[FastOutcome]:
        """Fast-publish what it can of one version's just-recorded ``tasks``: ``index_task_ensure``'s rows (task_id,
        profile, status, attempts, dimension)."""
        return self.after_publish_many(tenant_id, [(document_id, version, tasks)], tombstone=tombstone)

    def after_publish_many(self, tenant_id: str, versions: Sequence[tuple[str, int, Sequence[Mapping[str, Any]]]],
                           *, tombstone: bool) -> list[FastOutcome]:
        """``after_publish`` for a batch's versions (document id, version, tasks): one copy-source lookup for all."""
        keys = [{"task_id": t["task_id"], "tenant_id": tenant_id, "document_id": document_id,
                 "profile": t["profile"], "version_number": version, "dimension": t["dimension"],
                 "attempts": t["attempts"]}
                for document_id, version, tasks in versions for t in tasks if t.get("status") == "PENDING"]
        if not keys:
            return []
        sources = {} if tombstone else copy_sources(self.db, keys)
        out = []
        for key in keys:
            if not tombstone and key["task_id"] not in sources:
                out.append(FastOutcome(key["task_id"], "left"))
                continue
            out.append(self._publish_one(key, sources.get(key["task_id"])))
        return out

    def _publish_one(self, key: dict[str, Any], copy_from: int | None) -> FastOutcome:
        from resources.index_sink import ClaimMissed, IndexSink

        try:
            chunks, vectors = self._chunks_of(key, copy_from)
        except Exception as exc:  # noqa: BLE001 - before the claim: nothing to record, the task waits for a run
            failure = exc if isinstance(exc, KbindexError) else classify(exc)
            log.warning("fast publish of task %s left to the pipeline: %s", key["task_id"], failure)
            return FastOutcome(key["task_id"], "failed", failure.code)
        # Claimed in the publish transaction itself, fenced on the attempt the claim grants (its attempts + 1, as
        # index_task_ensure returned them): no round trip of its own.
        lease = self.queue.lease_to_claim(key["task_id"], key["attempts"], self.owner)
        try:
            result = IndexSink(self.db, self.queue).publish(lease, chunks, vectors, claim=True)
        except ClaimMissed:  # the sensor (or another publisher) has it, or had it: the run does the same
            return FastOutcome(key["task_id"], "left")
        except KbindexError as exc:
            return self._failed(lease, exc)
        except Exception as exc:  # noqa: BLE001 - classified and recorded like a run's failure
            return self._failed(lease, classify(exc))
        return FastOutcome(key["task_id"], "superseded" if result.superseded else "published")

    def _chunks_of(self, key: dict[str, Any], copy_from: int | None) -> tuple[list[CopiedChunk], np.ndarray]:
        """What the version publishes: nothing for a tombstone (no chunk, so no vector whose width anything reads),
        else the copies of ``copy_from``'s chunks and vectors (IndexWriteFailed if they are gone)."""
        if copy_from is None:
            return [], np.zeros((0, 0), dtype=np.float32)
        copied = load_copy(self.db, key, copy_from, int(key["dimension"]))  # index_task_ensure's: no lookup
        if copied is None:
            raise IndexWriteFailed(f"the chunks of version {copy_from} to copy are gone; a run will parse this version")
        return copied.chunks, copied.vectors

    def _failed(self, lease: Any, exc: KbindexError) -> FastOutcome:
        """Record the failure by the fenced fail (a lost lease records nothing, as in a run; neither does a claim
        rolled back with its transaction: the task is still PENDING, and the fenced fail refuses it)."""
        if not isinstance(exc, FenceRejected):
            try:
                self.queue.fail(lease, exc.code, exc.message)
            except KbindexError:
                pass  # the lease went meanwhile: its new holder decides
        log.warning("fast publish of task %s left to the pipeline: %s", lease.task_id, exc)
        return FastOutcome(lease.task_id, "failed", exc.code)
