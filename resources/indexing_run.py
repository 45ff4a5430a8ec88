"""One indexing run, without Dagster: its leases, each task's work, the per-task verbs, the shared embedding pass.

A run covers partition keys (document versions); each version may carry several index tasks, one
per profile (the active one, and a profile being built during a model migration). Everything here
is keyed by task, never by partition key alone:

- leases: every task the claiming sensor tagged the run with is adopted (not only the first per
  version), or, for a UI backfill / manual materialization, the task of the run's profile is
  created-or-claimed; the LeaseKeeper heartbeats each by task id;
- run state (``RunState``): outputs stored per task with the fingerprint of what produced them;
- the shared embedding pass: its cache is keyed by (model, dimension, text), so two profiles with
  different models never exchange vectors;
- the publish: ``IndexSink`` re-derives every chunk id from the locked task row's own identity.
- a tombstone (a delete, DESIGN.md) goes through the same leases and steps, but reads no bytes, loads
  no model and has zero chunks: its publish moves the search pointer onto it and writes nothing else.
- a change of metadata or allow list only (same bytes as an earlier version with chunks under the task's
  profile: ``TaskWork.copy_from``) reads no bytes and loads no model either: its chunks and vectors are
  copied from that version (resources/chunk_copy.py) and published like any. If they vanished meanwhile
  (retention), the task is parsed and embedded as usual.

Every step is a failure boundary per task: a lost lease stops that task without writing; any other
error is classified to a stable code and recorded by a fenced ``fail`` from inside the run. Its
batch-mates carry on. The Dagster assets (pipelines/assets.py) are thin adapters over the four
step methods; tests drive this class directly.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from pipelines.domain.chunking import CHUNKER_VERSION, VersionIdentity
from pipelines.domain.errors import EmbeddingInvalidResponse, FenceRejected, InternalError, KbindexError, classify
from pipelines.domain.task_states import Stage
from resources.blob_store import BlobStore
from resources.chunk_copy import CopiedVersion, copy_sources, load_copy
from resources.database import Database
from resources.embed_outage import EmbedOutage
from resources.lease_keeper import LeaseKeeper
from resources.run_ahead import RunAhead
from resources.run_state import RunState
from resources.task_queue import Lease, TaskQueue

log = logging.getLogger("kbindex.run")

PARSE_FIGURES = ("pdf_engine", "ocr_pages", "ocr_seconds", "ocr_failed_pages", "ocr_skipped_pages",
                 "sheets", "attachments_failed")
"""What the parse step reports of a document's parse (its cost, OCR included) as metadata."""

# A parse or chunk output goes to the artifact store (for re-execution from a later step) only if making it took
# this long: storing one costs a few file operations (~0.5 ms: folder, temporary file, pickle, rename, and the
# delete when the task ends), as much as parsing and chunking a one-paragraph document (bench.scale.small_docs:
# 0.47 ms a version, both), and a run of 480 such versions spent ~9% of its CPU storing them. A re-execution
# recomputes a missing output (the chunker is deterministic; the fingerprint still guards what is read back).
# Vectors are always stored: embedding costs far more than the write.
KEEP_ARTIFACT_SECONDS = float(os.environ.get("KBINDEX_KEEP_ARTIFACT_SECONDS", "0.005"))
PASS_PROGRESS_SECONDS = 30.0
"""How often the shared pass reports each live task's embedded chunks (one fenced write per task)."""


@dataclass(frozen=True)
class TaskWork:
    """Everything the steps need about one leased task: which version, under which profile."""

    key: str
    lease: Lease
    tenant_id: str
    document_id: str
    version_number: int
    profile: str
    model: str
    dimension: int
    chunk_tokens: int
    chunk_overlap: int
    content_hash: str | None
    filename: str
    media_type: str
    ocr: bool = True
    """OCR scanned pages (a profile setting: OCR costs seconds and ~600 MB per worker)."""
    tombstone: bool = False
    """The version is a delete (DESIGN.md "tombstone"): no bytes, nothing to parse, chunk or embed; its
    publish writes zero chunks and moves the search pointer onto it."""
    copy_from: int | None = None
    """An earlier version with the same bytes whose chunks and vectors this task copies (a metadata-only change)."""
    embed_context: bool = False
    """The profile embeds each chunk with its document's title and heading path (migration 0046; chunking.py)."""

    @property
    def task_id(self) -> int:
        return self.lease.task_id

    @property
    def identity(self) -> VersionIdentity:
        return VersionIdentity(self.tenant_id, self.document_id, self.version_number, self.profile)

    def fingerprint(self, stage: str) -> tuple[Any, ...]:
        """What a stage's output depends on: a stored output is reused only for the same inputs."""
        source = (self.content_hash, self.filename, self.media_type, self.ocr)
        if stage == "parsed_document":
            return source
        chunked = (*source, self.task_id, self.profile, self.model, self.chunk_tokens, self.chunk_overlap,
                   CHUNKER_VERSION, self.embed_context)
        return chunked if stage == "document_chunks" else (*chunked, self.dimension)


@dataclass(frozen=True)
class StepResult:
    """What one step did for one task: ``ok``, ``failed`` (recorded), ``lease_lost`` or ``skipped``."""

    task_id: int
    profile: str
    outcome: str
    seconds: float = 0.0
    reason: str = ""
    error_code: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"task_id": self.task_id, "profile": self.profile, "outcome": self.outcome,
                                "seconds": round(self.seconds, 3), **self.details}
        if self.reason:
            meta["reason"] = self.reason
        if self.error_code:
            meta["error_code"] = self.error_code
        return meta


class _Stopped(Exception):
    """A task has no usable upstream output (it failed or was skipped earlier in this run)."""


class IndexingRun:
    """The run's hold on its tasks and the work of each step; see the module docstring."""

    def __init__(
        self,
        *,
        db: Database,
        queue: TaskQueue,
        keeper: LeaseKeeper,
        owner: str,
        blobs: BlobStore,
        embedder_for: Callable[[str], Any],
        state: RunState | None = None,
        tagged: Iterable[tuple[int, int]] = (),
        granted_by: str | None = None,
        profile: str | None = None,
        batch_size: int = 64,
        tokenizer_for: Callable[[str], Any] | None = None,
    ) -> None:
        self.db, self.queue, self.keeper, self.owner = db, queue, keeper, owner
        self.blobs = blobs
        self.embedder_for = embedder_for
        self.state = state or RunState()
        self.tagged = [(int(t), int(a)) for t, a in tagged]
        self.granted_by = granted_by or owner  # the claiming sensor's owner, whose leases this run adopts
        self.profile = profile
        self.batch_size = batch_size
        self.tokenizer_for = tokenizer_for or _default_tokenizer
        self._works: dict[str, list[TaskWork]] = {}
        self._why: dict[str, str] = {}
        self._tagged_index: dict[tuple[str, str, int], list[tuple[int, int]]] | None = None
        self._stopped: dict[int, StepResult] = {}  # tasks that failed or lost their lease in this run
        self._parsed: dict[tuple[str, str, str], Any] = {}  # one parse per document bytes, for every profile
        self._tasks: dict[int, dict[str, Any]] = {}  # task rows read in one statement per batch of leases
        self._profiles: dict[str, dict[str, Any]] = {}  # profile rows, read once per run
        self._ahead: RunAhead | None = None  # parse, chunk and embed done ahead of the steps
        self._copies: dict[int, CopiedVersion | None] = {}  # metadata-only changes: chunks copied, per task
        self.outage = EmbedOutage()  # an embedder silent twice in a row is not called again by this run

    # -- leases ---------------------------------------------------------------------------------
    def acquire(self, keys: Iterable[str]) -> dict[str, list[TaskWork]]:
        """The leased tasks of each partition key (empty where this run may touch none). Idempotent.

        A constant number of statements for all the keys (their versions, the tagged leases and the
        task rows are each read in one), not a few per key: per-version round trips were most of a
        small document's cost (issue #14).
        """
        keys = list(keys)
        new = [key for key in dict.fromkeys(keys) if key not in self._works]
        if new:
            versions = {v["partition_key"]: v for v in
                        self.db.fetch_all("document_versions_by_partition_keys", {"partition_keys": new})}
            leases = {key: self._leases_for(key, versions.get(key)) for key in new}
            self._read_tasks([lease.task_id for ls in leases.values() for lease in ls])
            built = {key: [self._work(key, versions[key], lease) for lease in leases[key]] for key in new}
            sources = copy_sources(self.db, [{"task_id": w.task_id, **asdict(w.identity)}
                                             for ws in built.values() for w in ws if not w.tombstone])
            for key in new:
                works = [replace(w, copy_from=sources.get(w.task_id)) for w in built[key]]
                if not works and key not in self._why:
                    self._why[key] = "the claiming sensor's leases for this version were lost before the run adopted them"
                self._works[key] = works
        return {key: self._works[key] for key in keys}

    def works(self, keys: Iterable[str]) -> list[TaskWork]:
        return [w for ws in self.acquire(keys).values() for w in ws]

    def why_skipped(self, key: str) -> str:
        return self._why.get(key, "this run holds no lease for this version")

    def _leases_for(self, key: str, version: dict[str, Any] | None) -> list[Lease]:
        if version is None:
            self._why[key] = "no document version has this partition key"
            return []
        leases = self._adopt_tagged(version)
        if not leases and (not self.tagged or self.profile):
            claimed = self._claim_for(version)
            leases = [claimed] if claimed else []
        return leases

    def _read_tasks(self, task_ids: list[int]) -> None:
        missing = [t for t in task_ids if t not in self._tasks]
        self._tasks.update(self.queue.get_many(missing))

    def _tagged_by_version(self) -> dict[tuple[str, str, int], list[Lease]]:
        """Adopt every tagged lease in one fenced statement, once per run, and index them by version.

        Adoption hands each lease to this run (``task_adopt``): the run becomes its owner, so a
        re-execution that copied the tags cannot adopt the same attempt while this run still works,
        and a lease that no run ever adopted goes back without counting as an attempt.
        """
        if self._tagged_index is None:
            self._tagged_index = {}
            offered = [Lease(t, a, self.granted_by, None) for t, a in self.tagged]  # type: ignore[arg-type]
            adopted = self.queue.adopt(offered, self.owner) if offered else []
            self._read_tasks([lease.task_id for lease in adopted])
            for lease in adopted:
                self.keeper.hold(lease.task_id, lease)
                task = self._tasks[lease.task_id]
                version = (task["tenant_id"], task["document_id"], task["version_number"])
                self._tagged_index.setdefault(version, []).append(lease)
            lost = len(offered) - sum(len(v) for v in self._tagged_index.values())
            if lost:
                log.warning("%d of the run's %d tagged leases were lost before it started", lost, len(offered))
        return self._tagged_index

    def adopt_tagged(self) -> int:
        """Adopt the run's tagged reservations now (at run start, before any step); returns how many.

        Early, so that a run queued past its reservations' lease_until still gets them (an unchanged
        reservation stays adoptable until a claim takes it over), and so that a run that dies before its
        first step has not started any task: the crashed-run recorder gives their attempts back.
        """
        return sum(len(v) for v in self._tagged_by_version().values())

    def _adopt_tagged(self, version: dict[str, Any]) -> list[Lease]:
        """Every adopted lease of this version, one per profile (issue #12, defect 2)."""
        return list(self._tagged_by_version().get(
            (version["tenant_id"], version["document_id"], version["version_number"]), []))

    def _claim_for(self, version: dict[str, Any]) -> Lease | None:
        """Create-or-claim the task of this version under the run's profile (UI backfills, manual runs)."""
        key = version["partition_key"]
        profile = self.profile or self._default_profile()
        try:
            task_id = self.queue.ensure_task(
                version["tenant_id"], version["document_id"], version["version_number"], profile
            )
            claimed = self.queue.claim_task(task_id, self.owner)
        except KbindexError as exc:
            self._why[key] = f"{exc.code}: {exc.message}"
            return None
        if claimed is None:
            status = self.queue.get(task_id)["status"]
            self._why[key] = f"task {task_id} ({profile}) is {status} and not claimable now"
            return None
        self.keeper.hold(task_id, claimed.lease)
        return claimed.lease

    def _default_profile(self) -> str:
        building = self.db.fetch_all("index_profile_building")
        if len(building) == 1:
            return building[0]["name"]
        active = self.db.fetch_one("index_profile_active")
        return active["name"] if active else "minilm-v1"

    def _work(self, key: str, version: dict[str, Any], lease: Lease) -> TaskWork:
        task = self._tasks.get(lease.task_id) or self.queue.get(lease.task_id)
        if task["profile"] not in self._profiles:
            self._profiles[task["profile"]] = self.db.fetch_one("index_profile_get", {"name": task["profile"]})
        profile = self._profiles[task["profile"]]
        return TaskWork(
            key=key, lease=lease, tenant_id=version["tenant_id"], document_id=version["document_id"],
            version_number=version["version_number"], profile=profile["name"], model=profile["model"],
            dimension=profile["dimension"], chunk_tokens=profile["chunk_tokens"],
            chunk_overlap=profile["chunk_overlap"], content_hash=version["content_hash"],
            filename=version["filename"], media_type=version["media_type"], ocr=bool(profile.get("ocr", True)),
            tombstone=version.get("kind") == "tombstone",
            embed_context=bool(profile.get("embed_context", False)),
        )

    def models(self, keys: Iterable[str]) -> set[str]:
        """The models the run's content versions need (a run of tombstones and copies loads none)."""
        return {w.model for w in self.works(keys) if not w.tombstone and self._copy(w) is None}

    def _copy(self, work: TaskWork) -> CopiedVersion | None:
        """The task's chunks and vectors copied from ``work.copy_from`` (read once per run); None: none to copy."""
        if work.copy_from is None:
            return None
        if work.task_id not in self._copies:
            self._copies[work.task_id] = load_copy(self.db, asdict(work.identity), work.copy_from, work.dimension)
        return self._copies[work.task_id]

    # -- the four steps -------------------------------------------------------------------------
    def start_ahead(self, keys: list[str]) -> None:
        """Start parsing, chunking and embedding the live tasks of ``keys`` ahead of the steps
        (resources/run_ahead.py); the parse step calls it first. Idempotent."""
        if self._ahead is None:
            works = [w for w in self.works(keys)
                     if w.task_id not in self._stopped and not w.tombstone and self._copy(w) is None]
            self._ahead = RunAhead(self, works, SharedVectors()).start()

    def close(self) -> None:
        """The run is over: stop any work still going on ahead."""
        if self._ahead is not None:
            self._ahead.stop()

    def parse(self, keys: list[str]) -> dict[str, list[StepResult]]:
        def step(work: TaskWork) -> dict[str, Any]:
            if work.tombstone:  # a delete has no bytes: nothing is read
                return {"tombstone": True, "blocks": 0}
            if self._copy(work) is not None:  # a metadata-only change: nothing is read
                return {"copied_from": work.copy_from, "blocks": 0}
            if self._ahead is not None and self._ahead.covers(work):
                self._ahead.prepared(work, "parse")
                parsed = self._parsed_of(work)
            else:
                parsed = self.parse_ahead(work)
            return {"blocks": len(parsed.blocks), "pages": parsed.page_count or 0, "media_type": parsed.media_type,
                    **{k: v for k, v in (getattr(parsed, "metadata", None) or {}).items() if k in PARSE_FIGURES},
                    **({"warnings": "; ".join(parsed.warnings[:5])} if getattr(parsed, "warnings", ()) else {})}

        return self._each(keys, Stage.PARSE, step)

    def chunk(self, keys: list[str]) -> dict[str, list[StepResult]]:
        def step(work: TaskWork) -> dict[str, Any]:
            if self._ahead is not None and self._ahead.covers(work):
                self._ahead.prepared(work, "chunk")
                chunks = self._chunks(work)
            else:
                chunks = self._chunk(work)
            return {"chunks": len(chunks), "tokens": sum(c.token_count for c in chunks),
                    **({"tombstone": True} if work.tombstone else {}),
                    **({"embed_context": True} if work.embed_context else {}),
                    **({"copied_from": work.copy_from} if self._copy(work) is not None else {})}

        return self._each(keys, Stage.CHUNK, step)

    def embed(self, keys: list[str]) -> dict[str, list[StepResult]]:
        works = self.works(keys)
        totals = {}
        for work in works:
            try:
                totals[work.task_id] = len(self._chunks(work))
            except Exception:  # noqa: BLE001 - the per-task step classifies it
                continue
        lost = self._announce(works, Stage.EMBED, totals)
        ahead = None
        if self._ahead is not None:
            ahead = self._ahead.shared
            while not self._ahead.wait_embedded(PASS_PROGRESS_SECONDS):  # progress while it finishes
                live = [w for w in works if w.task_id in totals and self.alive(w)]
                self._report_pass_progress(live, {w.task_id: self._chunks(w) for w in live}, ahead)
        shared = self._embed_shared([w for w in works if w.task_id not in self._stopped and self._copy(w) is None],
                                    ahead)
        covered: list[TaskWork] = []  # tasks the shared pass embedded entirely: their "n/n" goes in one statement

        def step(work: TaskWork) -> dict[str, Any]:
            if work.tombstone:  # nothing to embed, no model called, nothing stored
                return {"vectors": 0, "tombstone": True}
            copied = self._copy(work)
            if copied is not None:  # the earlier version's vectors: nothing embedded
                n = int(copied.vectors.shape[0])
                return {"vectors": n, "embedded": 0, "reused": n, "copied_from": copied.copy_from}
            chunks = self._chunks(work)
            vectors, counts = shared.vectors_of(work, chunks)
            if vectors is None:
                vectors, counts = self._embed_one(work, chunks, shared)
            else:
                covered.append(work)
            self.state.put("chunk_embeddings", work.task_id, work.fingerprint("chunk_embeddings"), vectors)
            return {"vectors": int(vectors.shape[0]), "model": work.model, "dimension": work.dimension, **counts}

        results = {key: [lost.get(w.task_id) or self._guarded(w, Stage.EMBED, step) for w in ws]
                   for key, ws in self.acquire(keys).items()}
        self._progress_many(covered, Stage.EMBED, {w.task_id: totals.get(w.task_id, 0) for w in covered})
        return results

    def publish(self, keys: list[str]) -> dict[str, list[StepResult]]:
        """Every live task's version through ``IndexSink.publish_many``: batches of versions per fenced
        transaction, each version still all-or-nothing and failing alone (resources/index_sink.py)."""
        from resources.index_sink import IndexSink, PublishItem

        by_key = self.acquire(keys)
        works = [w for ws in by_key.values() for w in ws]
        lost = self._announce(works, Stage.PUBLISH)
        outcomes: dict[int, Any] = {}
        items: list[PublishItem] = []
        for work in works:
            if work.task_id in self._stopped:
                continue
            try:
                chunks = self._chunks(work)
                items.append(PublishItem(self.keeper.check(work.task_id), chunks, self._vectors(work, chunks), work))
            except Exception as exc:  # noqa: BLE001 - classified by the task's own step below
                outcomes[work.task_id] = exc
        started = time.perf_counter()
        results = IndexSink(self.db, self.queue).publish_many(items) if items else []
        seconds = round((time.perf_counter() - started) / max(1, len(items)), 4)
        for item, result in zip(items, results, strict=True):
            outcomes[item.lease.task_id] = result
            if not isinstance(result, Exception):  # SUCCEEDED: nothing left to heartbeat or re-execute
                self.keeper.release(item.lease.task_id)
                self.state.discard(item.lease.task_id)

        def step(work: TaskWork) -> dict[str, Any]:
            outcome = outcomes[work.task_id]
            if isinstance(outcome, Exception):
                raise outcome
            return {"chunk_count": outcome.chunk_count, "superseded": outcome.superseded,
                    "pointer_version": outcome.pointer_version, "publish_seconds": seconds}

        return {key: [lost.get(w.task_id) or self._guarded(w, Stage.PUBLISH, step,
                                                          check_lease=isinstance(outcomes.get(w.task_id), Exception))
                      for w in ws]
                for key, ws in by_key.items()}

    # -- outputs, computed on a miss (re-execution from a later step, or artifacts gone) ----------
    def parse_ahead(self, work: TaskWork) -> Any:
        """Parse the task's document and keep the result for the later steps."""
        started = time.perf_counter()
        parsed = self._parse(work)
        self.state.put("parsed_document", work.task_id, work.fingerprint("parsed_document"), parsed,
                       keep=time.perf_counter() - started >= KEEP_ARTIFACT_SECONDS)
        return parsed

    def chunk_ahead(self, work: TaskWork) -> list[Any]:
        """Chunk the task's parsed document and keep the chunks for the later steps."""
        return self._chunk(work)

    def _parse(self, work: TaskWork) -> Any:
        from pipelines.domain.parsing import parse_document

        if work.tombstone or work.content_hash is None:  # never reached: _chunk answers a tombstone first
            raise InternalError(f"version {work.version_number} is a tombstone: it has no bytes to parse")
        source = (work.content_hash, work.filename, work.media_type, work.ocr)
        if source not in self._parsed:
            data = self.blobs.get(work.content_hash)
            self._parsed[source] = parse_document(data, filename=work.filename, media_type=work.media_type,
                                                  ocr=work.ocr)
        return self._parsed[source]

    def _parsed_of(self, work: TaskWork) -> Any:
        try:
            return self.state.get("parsed_document", work.task_id, work.fingerprint("parsed_document"))
        except KeyError:
            return self._parse(work)

    def _chunk(self, work: TaskWork) -> list[Any]:
        from pipelines.domain.chunking import chunk_document, document_title

        if work.tombstone:  # zero chunks: its publish moves the pointer onto a version search finds nothing in
            return []
        copied = self._copy(work)
        if copied is not None:
            return list(copied.chunks)
        parsed = self._parsed_of(work)
        started = time.perf_counter()
        chunks = chunk_document(
            parsed, tokenizer=self.tokenizer_for(work.model), chunk_tokens=work.chunk_tokens,
            overlap=work.chunk_overlap, identity=work.identity,
            title=document_title(parsed, work.filename) if work.embed_context else None,
        )
        self.state.put("document_chunks", work.task_id, work.fingerprint("document_chunks"), chunks,
                       keep=time.perf_counter() - started >= KEEP_ARTIFACT_SECONDS)
        return chunks

    def _chunks(self, work: TaskWork) -> list[Any]:
        if work.tombstone:
            return []
        copied = self._copy(work)
        if copied is not None:
            return list(copied.chunks)
        try:
            return self.state.get("document_chunks", work.task_id, work.fingerprint("document_chunks"))
        except KeyError:
            return self._chunk(work)

    def chunks_of(self, work: TaskWork) -> list[Any]:
        """The task's chunks (from this run, the artifact store, or computed now)."""
        return self._chunks(work)

    def _vectors(self, work: TaskWork, chunks: list[Any]) -> np.ndarray:
        if work.tombstone:
            return np.zeros((0, work.dimension), dtype=np.float32)
        copied = self._copy(work)
        if copied is not None:
            return copied.vectors
        try:
            return self.state.get("chunk_embeddings", work.task_id, work.fingerprint("chunk_embeddings"))
        except KeyError:
            vectors, _ = self._embed_one(work, chunks, SharedVectors())
            return vectors

    # -- the failure boundary -------------------------------------------------------------------
    def _each(self, keys: list[str], stage: Stage, fn: Callable[[TaskWork], dict[str, Any]], *,
              announce: bool = True) -> dict[str, list[StepResult]]:
        """``fn`` for every task of ``keys`` under its own failure boundary, after announcing the step
        for all of them in one fenced statement (``announce=False``: the step already did)."""
        by_key = self.acquire(keys)
        lost = self._announce([w for ws in by_key.values() for w in ws], stage) if announce else {}
        return {key: [lost.get(work.task_id) or self._guarded(work, stage, fn) for work in works]
                for key, works in by_key.items()}

    def _announce(self, works: list[TaskWork], stage: Stage, totals: dict[int, int] | None = None) -> dict[int, StepResult]:
        """Fenced ``stage 0/total`` for every live task in one statement; a lease found lost stops its task
        (returned as its ``lease_lost`` result). Database trouble is left to the per-task steps."""
        out: dict[int, StepResult] = {}
        live, leases = [], []
        for work in works:
            if work.task_id in self._stopped:
                continue
            try:
                leases.append(self.keeper.check(work.task_id))
                live.append(work)
            except FenceRejected as exc:  # the keeper already saw it lost
                out[work.task_id] = self._lost(work, exc, stage)
        totals = totals or {}
        try:
            refused = self.queue.progress_many(leases, stage, [0] * len(leases),
                                               [totals.get(w.task_id, 1) for w in live])
        except KbindexError as exc:
            log.warning("could not announce %s for %d tasks (%s); each step checks its lease", stage.value,
                        len(live), exc.code)
            return out
        by_id = {w.task_id: w for w in live}
        for lease, exc in refused:
            self.keeper.mark_lost(lease.task_id, exc)
            out[lease.task_id] = self._lost(by_id[lease.task_id], exc, stage)
        return out

    def _lost(self, work: TaskWork, exc: FenceRejected, stage: Stage, seconds: float = 0.0) -> StepResult:
        log.warning("%s (task %s): %s during %s; writing nothing more for it", work.key, work.task_id, exc.code,
                    stage.value)
        return self._stop(StepResult(work.task_id, work.profile, "lease_lost", seconds,
                                     reason=f"{exc.code}: {exc.message}", error_code=exc.code))

    def _guarded(self, work: TaskWork, stage: Stage, fn: Callable[[TaskWork], dict[str, Any]], *,
                 check_lease: bool = True) -> StepResult:
        """Run one step for one task under its lease; never raises for that task's own failure.
        (``check_lease=False``: the task already completed and gave its lease back.)"""
        stopped = self._stopped.get(work.task_id)
        if stopped is not None:
            return StepResult(work.task_id, work.profile, "skipped", reason=stopped.reason,
                              error_code=stopped.error_code)
        started = time.perf_counter()
        try:
            if check_lease:
                self.keeper.check(work.task_id)
            details = fn(work)
            return StepResult(work.task_id, work.profile, "ok", time.perf_counter() - started, details=details)
        except FenceRejected as exc:
            self.keeper.mark_lost(work.task_id, exc)
            return self._lost(work, exc, stage, time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - every failure of one task is classified, never swallowed
            err: KbindexError = classify(exc)
            log.error("%s (task %s): %s during %s: %s", work.key, work.task_id, err.code, stage.value, err.message)
            details: dict[str, Any] = {}
            try:
                details["task_status"] = str(self.queue.fail(self.keeper.check(work.task_id), err.code, err.message))
            except FenceRejected as fence:  # lost the lease meanwhile: the failure is not ours to record
                self.keeper.mark_lost(work.task_id, fence)
            except KbindexError as db_error:  # database down: the lease expires and the task is retried
                log.error("task %s: could not record %s (%s); lease expiry will retry it", work.task_id, err.code,
                          db_error.code)
            self.keeper.release(work.task_id)
            return self._stop(StepResult(work.task_id, work.profile, "failed", time.perf_counter() - started,
                                         reason=f"{err.code}: {err.message}", error_code=err.code, details=details))

    def _stop(self, result: StepResult) -> StepResult:
        self._stopped[result.task_id] = result
        if "task_status" in result.details:  # its failure is recorded: the task is done here
            self.state.discard(result.task_id)
        else:  # lease lost, or the failure unrecorded: whoever runs the task next may reuse them
            self.state.forget(result.task_id)
        return result

    def alive(self, work: TaskWork) -> bool:
        if work.task_id in self._stopped:
            return False
        try:
            self.keeper.check(work.task_id)
            return True
        except FenceRejected:
            return False

    # -- embedding ------------------------------------------------------------------------------
    def _embed_one(self, work: TaskWork, chunks: list[Any], shared: SharedVectors) -> tuple[np.ndarray, dict[str, int]]:
        """One task on its own: texts the shared pass did not cover, stored vectors reused, its lease
        checked after every batch, so a failure here is this task's own."""
        from resources.embedding_reuse import embed_with_reuse

        texts = [c.embed_text for c in chunks]
        if not texts:
            return np.zeros((0, work.dimension), dtype=np.float32), {"embedded": 0, "reused": 0, "shared": 0}
        missing = [t for t in dict.fromkeys(texts) if shared.get(work, t) is None]
        last = [0.0]  # the last progress write
        answered = [time.monotonic()]  # the last answer (or the start): how long a failing call took

        def on_batch(done: int, total: int) -> None:
            answered[0] = time.monotonic()
            lease = self.keeper.check(work.task_id)  # stop promptly if the lease was lost or the task cancelled
            if done >= total or time.monotonic() - last[0] >= 1.0:
                last[0] = time.monotonic()
                self.queue.progress(lease, Stage.EMBED, done, total)

        own: dict[str, np.ndarray] = {}
        stats_embedded = stats_reused = 0
        if missing:
            self.outage.check(work.model)  # tripped: fail now (retried by a later run), not after another bound
            try:
                vectors, stats = embed_with_reuse(
                    self.db, self.embedder_for(work.model), tenant_id=work.tenant_id, profile=work.profile,
                    model=work.model, dimension=work.dimension, texts=missing, batch_size=self.batch_size,
                    on_batch=on_batch,
                )
            except Exception as exc:
                self.outage.failed(work.model, exc, time.monotonic() - answered[0])
                raise
            if stats.embedded:  # the embedder answered (vectors only reused from the store say nothing of it)
                self.outage.answered(work.model)
            own = dict(zip(missing, vectors, strict=True))
            stats_embedded, stats_reused = stats.embedded, stats.reused
        out = np.stack([own[t] if t in own else shared.get(work, t) for t in texts]).astype(np.float32)
        covered = shared.counts(work, set(texts) - set(missing))
        return out, {"embedded": stats_embedded + covered["embedded"], "reused": stats_reused + covered["reused"],
                     "shared": covered["shared"]}

    def _embed_shared(self, works: list[TaskWork], shared: SharedVectors | None = None) -> SharedVectors:
        """Embed the texts of all the run's live tasks in one pass per model, longest first, in validated batches.

        Why one pass: batches of similar length pad little, and sorting the whole run is what a bare
        ``model.encode`` over the same texts does. Texts shared by several tasks of one model, or
        already stored under the same tenant and profile, are embedded once or not at all. The cache
        is keyed by (model, dimension, text): profiles with different models never share vectors.
        ``shared``: what the run embedded ahead (``RunAhead``); only what it left is embedded here.

        An invalid batch is skipped (its tasks embed those texts on their own, so only a task whose
        own texts fail is failed); a transient error ends the pass. Between batches the pass drops
        texts that only lost or cancelled tasks still need; every PASS_PROGRESS_SECONDS it writes
        each live task's progress (fenced, so a lost lease shows).
        """
        shared = shared if shared is not None else SharedVectors()
        chunks_of: dict[int, list[Any]] = {}
        for work in works:
            try:
                chunks_of[work.task_id] = self._chunks(work)
            except Exception:  # noqa: BLE001 - the per-task step classifies it
                continue
        ready = [w for w in works if chunks_of.get(w.task_id)]
        by_model: dict[tuple[str, int], list[TaskWork]] = {}
        for work in ready:
            by_model.setdefault((work.model, work.dimension), []).append(work)
        for (model_name, dimension), members in by_model.items():
            if len(members) < 2:
                continue
            live = [w for w in members if self.alive(w)]  # announced (embed 0/total) by the step
            self.embed_group(model_name, dimension, live, chunks_of, shared, report=True)
        return shared

    def embed_group(self, model_name: str, dimension: int, live: list[TaskWork], chunks_of: dict[int, list[Any]],
                    shared: SharedVectors, *, report: bool = False) -> bool:
        """Embed into ``shared`` what ``live`` tasks (of one model) still need: stored vectors of their tenant
        and profile first (looked up once per task), then the rest longest first, in validated batches.
        False if transient trouble stopped it (the tasks then embed those texts on their own)."""
        from resources.embedder import checked_embed
        from resources.embedding_reuse import embed_digest, stored_vectors

        if self.outage.tripped(model_name):  # the tasks fail on their own at once (EmbedOutage)
            return False
        users: dict[str, set[int]] = {}
        for work in live:
            for chunk in chunks_of[work.task_id]:
                users.setdefault(chunk.embed_text, set()).add(work.task_id)
        asked = time.monotonic()
        try:
            fresh = [w for w in live if w.task_id not in shared.looked_up]
            for (tenant_id, profile), group in _by_tenant_profile(fresh).items():
                digests = {c.embed_text: embed_digest(c.embed_text) for w in group for c in chunks_of[w.task_id]}
                stored = stored_vectors(self.db, tenant_id=tenant_id, profile=profile, model=model_name,
                                        dimension=dimension, digests=sorted(set(digests.values())))
                for work in group:
                    for chunk in chunks_of[work.task_id]:
                        vector = stored.get(digests[chunk.embed_text])
                        if vector is not None:
                            shared.put_reused(work, chunk.embed_text, vector)
                    shared.looked_up.add(work.task_id)
            model = self.embedder_for(model_name)
        except Exception as exc:  # noqa: BLE001 - the tasks embed on their own and classify it
            log.warning("shared embedding of %d tasks could not start (%s)", len(live), type(exc).__name__)
            self.outage.failed(model_name, exc, time.monotonic() - asked)
            return False
        by_id = {w.task_id: w for w in live}
        pending = sorted((t for t in users if not shared.covers(model_name, dimension, t, users[t], by_id)
                          and (model_name, dimension, t) not in shared.invalid), key=len, reverse=True)
        start, reported = 0, time.monotonic()
        while start < len(pending):
            gone = {w.task_id for w in live if not self.alive(w)}
            if gone:
                live = [w for w in live if w.task_id not in gone]
                for text in pending[start:]:
                    users[text].difference_update(gone)
                pending = pending[:start] + [t for t in pending[start:] if users[t]]
                if start >= len(pending):
                    break
            batch = pending[start : start + self.batch_size]
            start += len(batch)
            asked = time.monotonic()
            try:
                vectors = checked_embed(model, batch, expected_model=model_name, expected_dim=dimension,
                                        batch_size=len(batch))
            except EmbeddingInvalidResponse as exc:
                log.warning("a shared embedding batch of %d texts was invalid (%s); its tasks embed those "
                            "texts on their own", len(batch), exc.code)
                shared.invalid.update((model_name, dimension, t) for t in batch)  # not again in a shared batch
                continue
            except Exception as exc:  # noqa: BLE001 - transient trouble: the tasks retry on their own
                log.warning("shared embedding stopped (%s); the tasks embed on their own", type(exc).__name__)
                self.outage.failed(model_name, exc, time.monotonic() - asked)
                return False
            self.outage.answered(model_name)
            for text, vector in zip(batch, vectors, strict=True):
                shared.put_embedded(model_name, dimension, text, vector, for_task=min(users[text]))
            if report and time.monotonic() - reported >= PASS_PROGRESS_SECONDS:
                reported = time.monotonic()
                self._report_pass_progress(live, chunks_of, shared)
        return True

    def _report_pass_progress(self, live: list[TaskWork], chunks_of: dict[int, list[Any]], shared: SharedVectors) -> None:
        done = {w.task_id: sum(1 for c in chunks_of[w.task_id] if shared.get(w, c.embed_text) is not None)
                for w in live}
        self._progress_many(live, Stage.EMBED, {w.task_id: len(chunks_of[w.task_id]) for w in live}, done)

    def _progress_many(self, works: list[TaskWork], stage: Stage, totals: dict[int, int],
                       done: dict[int, int] | None = None) -> None:
        """Advisory progress of many tasks in one fenced statement (``done`` defaults to the totals); a
        lease found lost is marked so, and the next step stops that task."""
        leases, sent = [], []
        for work in works:
            try:
                leases.append(self.keeper.check(work.task_id))
                sent.append(work)
            except FenceRejected:
                continue
        done = done if done is not None else totals
        try:
            refused = self.queue.progress_many(leases, stage, [done[w.task_id] for w in sent],
                                               [totals[w.task_id] for w in sent])
        except KbindexError:  # database trouble: progress is advisory, the publish is fenced
            return
        for lease, exc in refused:
            self.keeper.mark_lost(lease.task_id, exc)


def _by_tenant_profile(works: list[TaskWork]) -> dict[tuple[str, str], list[TaskWork]]:
    groups: dict[tuple[str, str], list[TaskWork]] = {}
    for work in works:
        groups.setdefault((work.tenant_id, work.profile), []).append(work)
    return groups


class SharedVectors:
    """The shared pass's vectors: embedded ones by (model, dimension, text), reused ones per task.

    Stored vectors are reused only within their own tenant and profile, so they are kept per task;
    freshly embedded ones depend only on the model and the text. Each embedded text is counted as
    ``embedded`` for one task (the lowest task id that needed it) and as ``shared`` for the others.
    """

    def __init__(self) -> None:
        self.embedded: dict[tuple[str, int, str], np.ndarray] = {}
        self.embedded_for: dict[tuple[str, int, str], int] = {}
        self.reused: dict[tuple[int, str], np.ndarray] = {}
        self.looked_up: set[int] = set()  # tasks whose stored vectors were looked up (once per task)
        self.invalid: set[tuple[str, int, str]] = set()  # texts of an invalid shared batch: each task embeds its own

    def put_embedded(self, model: str, dimension: int, text: str, vector: np.ndarray, *, for_task: int) -> None:
        self.embedded[(model, dimension, text)] = vector
        self.embedded_for[(model, dimension, text)] = for_task

    def put_reused(self, work: TaskWork, text: str, vector: np.ndarray) -> None:
        self.reused[(work.task_id, text)] = vector

    def get(self, work: TaskWork, text: str) -> np.ndarray | None:
        found = self.reused.get((work.task_id, text))
        return found if found is not None else self.embedded.get((work.model, work.dimension, text))

    def covers(self, model: str, dimension: int, text: str, task_ids: set[int], works: dict[int, TaskWork]) -> bool:
        """Whether every task needing ``text`` already has a vector for it (reused or embedded)."""
        if (model, dimension, text) in self.embedded:
            return True
        return all((task_id, text) in self.reused for task_id in task_ids if task_id in works)

    def vectors_of(self, work: TaskWork, chunks: list[Any]) -> tuple[np.ndarray | None, dict[str, int]]:
        """The task's vectors if the pass covered every one of its texts, else None; and the counts."""
        if not chunks:
            return None, {}
        found = [self.get(work, c.embed_text) for c in chunks]
        if any(v is None for v in found):
            return None, {}
        return np.stack(found).astype(np.float32), self.counts(work, {c.embed_text for c in chunks})

    def counts(self, work: TaskWork, texts: set[str]) -> dict[str, int]:
        """Of the task's distinct ``texts`` this pass covered: reused from storage, embedded for this
        task, and shared (embedded once in this run for another task that needed the same text)."""
        reused = {t for t in texts if (work.task_id, t) in self.reused}
        owners = [self.embedded_for.get((work.model, work.dimension, t)) for t in texts - reused]
        embedded = sum(1 for owner in owners if owner == work.task_id)
        shared = sum(1 for owner in owners if owner is not None and owner != work.task_id)
        return {"embedded": embedded, "reused": len(reused), "shared": shared}


def _default_tokenizer(model: str) -> Any:
    from resources.embedder import tokenizer_for_model

    return tokenizer_for_model(model)
