"""The four indexing assets, partitioned by document version: parse -> chunk -> embed -> publish.

Each asset covers every partition of its run (several versions share a run; ``single_run``
backfill policy) and returns ``{partition_key: value}``; a version whose work stopped carries a
``Skipped``. Intermediate outputs persist through the artifact IO manager, so re-execution from
failure does not redo finished steps. Only ``search_index`` writes to the index, through the
fenced publish transaction (invariant 3).
"""


import functools
import time
from typing import Any

import dagster as dg

from pipelines.domain.errors import FenceRejected
from pipelines.domain.task_states import Stage
from pipelines.partitions import document_versions
from pipelines.steps import ProgressThrottle, Skipped, StepReport, run_guarded
from resources.dagster_resources import BlobStoreResource, DatabaseResource, EmbedderResource, LeaseResource

COMMON = dict(
    partitions_def=document_versions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    group_name="indexing",
)


@functools.lru_cache(maxsize=8)
def tokenizer_for(model: str) -> Any:
    """The model's own tokenizer, so no chunk is truncated by the model (fake models chunk like MiniLM)."""
    from resources.embedder import PACKAGED_MODEL_NAME
    from resources.tokenizer import ModelTokenizer

    if model == PACKAGED_MODEL_NAME or model.startswith("fake-"):
        return ModelTokenizer()
    return ModelTokenizer(model)


def _report(context: dg.AssetExecutionContext, key: str, value: Any, report: StepReport, extra: dict[str, Any]) -> None:
    meta: dict[str, Any] = {"outcome": report.outcome, "seconds": round(report.seconds, 3), **extra}
    if isinstance(value, Skipped):
        meta["skipped_reason"] = value.reason
        if value.error_code:
            meta["error_code"] = value.error_code
    context.add_asset_metadata(meta, partition_key=key)


def _lease_meta(leases: LeaseResource, key: str) -> dict[str, Any]:
    work = leases.acquire([key]).get(key)
    if work is None:
        return {}
    return {"task_id": work.lease.task_id, "lease_attempt": work.lease.attempt, "profile": work.profile}


@dg.asset(**COMMON, kinds={"python"}, description="Document bytes parsed into text blocks with heading paths and pages.")
def parsed_document(
    context: dg.AssetExecutionContext, leases: LeaseResource, blobs: BlobStoreResource, embedder: EmbedderResource
) -> dict[str, Any]:
    from pipelines.domain.parsing import parse_document

    store = blobs.get_store()
    keys = list(context.partition_keys)
    works = leases.acquire(keys)
    embedder.preload({w.model for w in works.values() if w is not None})  # torch + model load overlap parse/chunk
    out: dict[str, Any] = {}
    for key in keys:

        def parse(work: Any, _: Any) -> Any:
            data = store.get(work.content_hash)
            return parse_document(data, filename=work.filename, media_type=work.media_type)

        value, report = run_guarded(key, None, leases, Stage.PARSE, parse, context.log)
        extra = _lease_meta(leases, key)
        if not isinstance(value, Skipped):
            extra.update(blocks=len(value.blocks), pages=value.page_count or 0, media_type=value.media_type)
        _report(context, key, value, report, extra)
        out[key] = value
    return out


@dg.asset(**COMMON, kinds={"python"}, description="Token-bounded, deterministic chunks with stable ids.")
def document_chunks(
    context: dg.AssetExecutionContext, leases: LeaseResource, parsed_document: dict[str, Any]
) -> dict[str, Any]:
    from pipelines.domain.chunking import VersionIdentity, chunk_document

    out: dict[str, Any] = {}
    for key in context.partition_keys:

        def chunk(work: Any, parsed: Any) -> Any:
            if parsed is None:
                raise KeyError("parsed_document was never materialized for this version")
            tokenizer = tokenizer_for(work.model)
            return chunk_document(
                parsed,
                tokenizer=tokenizer,
                chunk_tokens=work.chunk_tokens,
                overlap=work.chunk_overlap,
                identity=VersionIdentity(work.tenant_id, work.document_id, work.version_number, work.profile),
            )

        value, report = run_guarded(key, parsed_document.get(key), leases, Stage.CHUNK, chunk, context.log)
        extra = _lease_meta(leases, key)
        if not isinstance(value, Skipped):
            extra.update(chunks=len(value), tokens=sum(c.token_count for c in value))
        _report(context, key, value, report, extra)
        out[key] = value
    return out


class SharedVectors:
    """What the run's shared embedding pass produced: a vector per embed text, and who fell back."""

    def __init__(self) -> None:
        self.cache: dict[str, Any] = {}
        self.fallback: set[str] = set()

    def vectors_of(self, key: str, chunks: list[Any]) -> Any:
        """The version's vectors if the shared pass covered every one of its texts, else None."""
        import numpy as np

        if key in self.fallback or not chunks or any(c.embed_text not in self.cache for c in chunks):
            return None
        return np.stack([self.cache[c.embed_text] for c in chunks]).astype(np.float32)


@dg.asset(**COMMON, kinds={"python"}, description="One normalized vector per chunk, every batch validated.")
def chunk_embeddings(
    context: dg.AssetExecutionContext,
    leases: LeaseResource,
    embedder: EmbedderResource,
    document_chunks: dict[str, Any],
) -> dict[str, Any]:
    keys = list(context.partition_keys)
    works = leases.acquire(keys)
    shared = _embed_shared(keys, works, document_chunks, leases, embedder, context.log)
    throttle = ProgressThrottle()
    out: dict[str, Any] = {}
    for key in keys:
        batches = {"n": 0}

        def embed(work: Any, chunks: Any) -> Any:
            if chunks is None:
                raise KeyError("document_chunks was never materialized for this version")
            vectors = shared.vectors_of(key, chunks)
            if vectors is not None:
                leases.queue.progress(work.lease, Stage.EMBED, len(chunks), len(chunks))
                return vectors
            return _embed_one(key, work, chunks, leases, embedder, throttle, batches, shared)

        value, report = run_guarded(key, document_chunks.get(key), leases, Stage.EMBED, embed, context.log)
        extra = _lease_meta(leases, key)
        if not isinstance(value, Skipped):
            work = works[key]
            extra.update(
                vectors=int(value.shape[0]), batches=batches["n"], reused=batches.get("reused", 0),
                model=work.model, dimension=work.dimension,
                shared=key not in shared.fallback,
            )
        _report(context, key, value, report, extra)
        out[key] = value
    return out


def _embed_one(key: str, work: Any, chunks: Any, leases: LeaseResource, embedder: EmbedderResource,
               throttle: ProgressThrottle, batches: dict[str, int], shared: SharedVectors) -> Any:
    """One version on its own: its batches, its lease checked after each, its progress.

    Texts the run's shared pass already embedded are taken from it; chunks whose exact embed text is
    already stored under the same tenant and profile reuse their vectors (a small edit costs a small
    re-embed); only the rest go through ``checked_embed``, so a failure here is this version's own.
    """
    import numpy as np

    from resources.embedding_reuse import embed_with_reuse

    shared.fallback.add(key)
    model = embedder.for_model(work.model)
    texts = [c.embed_text for c in chunks]
    missing = [t for t in dict.fromkeys(texts) if t not in shared.cache]

    def on_batch(done: int, total: int) -> None:
        batches["n"] += 1
        lease = leases.check(key)  # stop promptly if the lease was lost or the task cancelled
        if throttle.due(lease.task_id, done, total):
            leases.queue.progress(lease, Stage.EMBED, done, total)

    vectors, stats = embed_with_reuse(
        leases.database.db,
        model,
        tenant_id=work.tenant_id,
        profile=work.profile,
        model=work.model,
        dimension=work.dimension,
        texts=missing,
        batch_size=embedder.batch_size,
        on_batch=on_batch,
    )
    batches["reused"] = stats.reused
    own = dict(zip(missing, vectors, strict=True))
    if not texts:
        return np.zeros((0, work.dimension), dtype=np.float32)
    return np.stack([own[t] if t in own else shared.cache[t] for t in texts]).astype(np.float32)


def _embed_shared(
    keys: list[str],
    works: dict[str, Any],
    document_chunks: dict[str, Any],
    leases: LeaseResource,
    embedder: EmbedderResource,
    log: Any,
) -> SharedVectors:
    """Embed the texts of all the run's versions in one pass, longest first, in validated batches.

    Why one pass: batches of similar length pad little, and sorting the whole run (not windows of
    it) is what a bare ``model.encode`` over the same texts does; windows of 512 texts cost ~10%
    more model time on the corpus. Texts shared by several versions, or already stored under the
    same tenant and profile, are embedded once or not at all.

    Every batch goes through ``checked_embed`` (count, order, model, dimension, finite, unit length).
    A batch that comes back invalid is skipped and the pass goes on; a transient provider error ends
    the pass. Either way the versions left with texts missing embed those on their own in the asset,
    so only a version whose own texts fail is failed, with its own code. Between batches the pass
    drops texts that only lost or cancelled versions still need, and stops when none is live; every
    PASS_PROGRESS_SECONDS it reports each live version's progress (fenced, so a lost lease shows).
    """
    from pipelines.domain.errors import EmbeddingInvalidResponse
    from resources.embedder import checked_embed
    from resources.embedding_reuse import embed_digest, stored_vectors

    shared = SharedVectors()
    ready = [
        k for k in keys
        if works.get(k) is not None and isinstance(document_chunks.get(k), list) and document_chunks[k]
    ]
    groups: dict[tuple[str, str, str, int], list[str]] = {}
    for key in ready:
        w = works[key]
        groups.setdefault((w.tenant_id, w.profile, w.model, w.dimension), []).append(key)
    for (tenant_id, profile, model_name, dimension), members in groups.items():
        if len(members) < 2:
            continue
        live = [k for k in members if _started(leases, k, len(document_chunks[k]))]
        users: dict[str, set[str]] = {}
        for key in live:
            for chunk in document_chunks[key]:
                users.setdefault(chunk.embed_text, set()).add(key)
        try:
            digests = {t: embed_digest(t) for t in users}
            stored = stored_vectors(leases.database.db, tenant_id=tenant_id, profile=profile, model=model_name,
                                    dimension=dimension, digests=list(digests.values()))
            shared.cache.update((t, stored[d]) for t, d in digests.items() if d in stored)
            model = embedder.for_model(model_name)
        except Exception as exc:  # noqa: BLE001 - the versions embed on their own and classify it
            log.warning(f"shared embedding of {len(live)} versions could not start ({type(exc).__name__})")
            continue
        pending = sorted((t for t in users if t not in shared.cache), key=len, reverse=True)
        batch_size = embedder.batch_size
        start, reported = 0, time.monotonic()
        while start < len(pending):
            gone = [k for k in live if not _alive(leases, k)]
            if gone:
                live = [k for k in live if k not in gone]
                for text in pending[start:]:
                    users[text].difference_update(gone)
                pending = pending[:start] + [t for t in pending[start:] if users[t]]
                if start >= len(pending):
                    break
            batch = pending[start : start + batch_size]
            start += len(batch)
            try:
                vectors = checked_embed(model, batch, expected_model=model_name, expected_dim=dimension,
                                        batch_size=len(batch))
            except EmbeddingInvalidResponse as exc:
                log.warning(f"a shared embedding batch of {len(batch)} texts was invalid ({exc.code}); "
                            "its versions embed those texts on their own")
                continue
            except Exception as exc:  # noqa: BLE001 - transient trouble: the versions retry on their own
                log.warning(f"shared embedding stopped ({type(exc).__name__}); the versions embed on their own")
                break
            shared.cache.update(zip(batch, vectors, strict=True))
            if time.monotonic() - reported >= PASS_PROGRESS_SECONDS:
                reported = time.monotonic()
                _report_pass_progress(leases, live, document_chunks, shared)
    return shared


PASS_PROGRESS_SECONDS = 30.0
"""How often the shared pass reports each live version's embedded chunks (one fenced write per version)."""


def _report_pass_progress(leases: LeaseResource, live: list[str], document_chunks: dict[str, Any],
                          shared: SharedVectors) -> None:
    """Fenced ``embed done/total`` for each live version; a rejected write marks its lease lost."""
    for key in live:
        chunks = document_chunks[key]
        done = sum(1 for c in chunks if c.embed_text in shared.cache)
        try:
            leases.queue.progress(leases.check(key), Stage.EMBED, done, len(chunks))
        except FenceRejected as exc:
            leases.lost(key, exc)
        except Exception:  # noqa: BLE001 - progress is advisory; the per-version step reports again
            pass


def _alive(leases: LeaseResource, key: str) -> bool:
    try:
        leases.check(key)
        return True
    except FenceRejected:
        return False


def _started(leases: LeaseResource, key: str, total: int) -> bool:
    """Fenced progress ``embed 0/total`` for a version entering the shared pass; False if its lease is gone."""
    try:
        leases.queue.progress(leases.check(key), Stage.EMBED, 0, total)
        return True
    except FenceRejected as exc:
        leases.lost(key, exc)
        return False
    except Exception:  # noqa: BLE001 - database trouble: the per-version step retries and classifies it
        return False


@dg.asset(
    **COMMON,
    kinds={"postgres"},
    description="The fenced publish: chunks written and the search pointer moved in one transaction.",
)
def search_index(
    context: dg.AssetExecutionContext,
    leases: LeaseResource,
    database: DatabaseResource,
    document_chunks: dict[str, Any],
    chunk_embeddings: dict[str, Any],
) -> dict[str, Any]:
    from resources.index_sink import IndexSink

    sink = IndexSink(database.db, leases.queue)
    out: dict[str, Any] = {}
    for key in context.partition_keys:
        chunks = document_chunks.get(key)
        upstream = chunk_embeddings.get(key)
        if isinstance(chunks, Skipped):
            upstream = chunks

        def publish(work: Any, vectors: Any) -> Any:
            if vectors is None or chunks is None:
                raise KeyError("upstream outputs are missing for this version")
            lease = leases.check(key)
            started = time.perf_counter()
            outcome = sink.publish(lease, work=work, chunks=chunks, vectors=vectors)
            leases.release(key)
            return {"outcome": outcome, "publish_seconds": round(time.perf_counter() - started, 3)}

        value, report = run_guarded(key, upstream, leases, Stage.PUBLISH, publish, context.log)
        extra = _lease_meta(leases, key)
        if not isinstance(value, Skipped):
            extra.update({k: v for k, v in value["outcome"].to_dict().items() if isinstance(v, (int, str, float, bool))})
        _report(context, key, value, report, extra)
        out[key] = value if isinstance(value, Skipped) else {"published": True}
    return out


indexing_assets = [parsed_document, document_chunks, chunk_embeddings, search_index]
