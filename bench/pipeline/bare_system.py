"""The bare system: the pipeline's work done by plain code, the floor a pipeline run is held to (issue #34, part 1).

``pipeline / bare encode`` says how close the pipeline comes to the model alone; the CPU account then says
the cores were busy, not whether the extra CPU is necessary. The bare system does everything a published
version needs and nothing else, with no Dagster, no queue, no leases and no events, into a fresh scratch
database of the same PostgreSQL (same migrations, same indexes, HNSW included):

1. **records**: each document, its version and its task row (already SUCCEEDED: there is no queue), one
   set-based statement (``bench_bare_records``, bench-only: the product writes these one publish at a
   time with the queue's events, and the pointers and chunks need them as foreign keys);
2. **parse + chunk**: the stored bytes through the project's own pure parsing and chunking
   (pipelines/domain), with the active profile's tokenizer and parameters: the same chunks, ids and
   ``embed_text`` strings the pipeline makes;
3. **encode**: the distinct ``embed_text`` strings once each (the pipeline reuses a vector for a repeated
   text), by the profile's model in the embedding service's layout (resources/embedding_service.py: one
   spawned process per usable core, ``cores // workers`` threads each, texts dealt round-robin), the
   processes loaded and warmed before the clock;
4. **write**: per transaction at most ``BATCH_VERSIONS`` versions and about ``WRITE_BATCH`` chunks, as the
   sink batches them: ``search_pointer_advance`` (the pointer flips: the sink's ``search_pointer_advance_fenced``
   without the fence, keys given), ``chunk_upsert`` (the rows and their
   HNSW insert, through ``IndexSink._write``: the very parameters the sink sends, vectors in binary),
   ``write_lexical`` (``lexical_posting_prune``, ``lexical_chunk_upsert``, ``lexical_posting_write``) and
   ``lexical_stats_reconcile``. Left out, as queue/lease context or checks of a re-run: ``send_lock_fenced``,
   ``chunk_delete_stale`` (deletes nothing on a first write), ``index_rows_check`` (the count check)
   and ``complete_published`` (the task rows went in SUCCEEDED).

It reports wall seconds per part and core-seconds: encode (the encoder processes' own CPU), PostgreSQL
(the server's process tree) and the client (this process: parsing, chunking, lexical terms, parameters).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg import sql as pgsql

from bench.cpu import own_seconds, postgres_pid, tree_seconds
from sql import queries

# --------------------------------------------------------------------------------------------------
# the encoder: the embedding service's layout without its socket


_ENCODER: dict[str, Any] = {}  # in an encoder process: its embedder


def _encoder_start(model: str, threads: int) -> None:
    """Load the model as a service worker does (its share of the cores) and warm it up."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from resources.embedding_service import embedder_on_threads

    embedder = embedder_on_threads(model, threads)
    embedder.embed(["warm-up text for the bare system's encoder"] * 8)
    _ENCODER["embedder"] = embedder


def _encoder_ready(seconds: float) -> int:
    time.sleep(seconds)  # held, so that each process of the pool takes one of these and starts
    return os.getpid()


def _encoder_embed(texts: list[str]) -> tuple[np.ndarray, float]:
    started = time.process_time()
    vectors = np.asarray(_ENCODER["embedder"].embed(texts), dtype=np.float32)
    return vectors, time.process_time() - started


class Encoder:
    """The profile's model in ``workers`` warm processes (the fake model: in this process, no pool)."""

    def __init__(self, model: str) -> None:
        from resources.embedding_service import default_workers, usable_cores

        self.model = model
        self.pool: Any = None
        self.local: Any = None
        if model.startswith("fake-"):
            from resources.embedder import FakeEmbedder

            self.local = FakeEmbedder(model_name=model)
            self.workers = 1
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.workers = default_workers()
        threads = max(1, usable_cores() // self.workers)
        self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_encoder_start, initargs=(model, threads))
        pids = set(self.pool.map(_encoder_ready, [1.0] * self.workers))
        if len(pids) != self.workers:
            pids |= set(self.pool.map(_encoder_ready, [3.0] * self.workers))

    def encode(self, texts: list[str]) -> tuple[np.ndarray, float]:
        """The vectors of ``texts`` in order, and the CPU seconds the encoding spent (all processes)."""
        from resources.embedding_service import deal, undeal

        if self.local is not None:
            started = time.process_time()
            return np.asarray(self.local.embed(texts), dtype=np.float32), time.process_time() - started
        if not texts:
            return np.zeros((0, 0), dtype=np.float32), 0.0
        parts = deal(texts, self.workers)
        answers = list(self.pool.map(_encoder_embed, parts))
        return undeal([a for a, _ in answers], parts), sum(cpu for _, cpu in answers)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


# --------------------------------------------------------------------------------------------------
# the scratch database and the timed work


class BareSystem:
    """A fresh migrated database beside the pipeline's and a warm encoder; ``run`` does one pass's work."""

    def __init__(self, admin_url: str, model: str, *, name: str | None = None) -> None:
        from resources.database import Database
        from resources.local_postgres import with_database
        from resources.migrations import migrate

        self.admin_url = admin_url
        self.name = name or f"kbindex_bench_bare_{os.getpid()}"
        self._drop()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(self.name)))
        self.url = with_database(admin_url, self.name)
        self.db: Any = None
        self.encoder: Encoder | None = None
        try:
            migrate(self.url)
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(queries["bench_bare_set_model"], {"model": model})
                row = conn.execute(queries["bench_bare_active_profile"]).fetchone()
            self.profile = dict(zip(("name", "model", "chunk_tokens", "chunk_overlap", "ocr", "lexical_analyzer"), row,
                                    strict=True))
            self.db = Database(self.url, max_size=1)
            self.pg_pid = postgres_pid(self.url)
            self.encoder = Encoder(model)
        except BaseException:
            self.close()
            raise

    def _drop(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(self.name)))

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.close()
        if self.db is not None:
            self.db.close()
        self._drop()

    def rows(self, tenant: str) -> dict[str, int]:
        """Chunk, lexical and posting rows and pointers the tenant has here (``bench_rows_of_tenant``)."""
        return rows_of_tenant(self.url, tenant)

    def run(self, tenant: str, documents: Sequence[tuple[str, bytes]]) -> dict[str, Any]:
        """Records, parse + chunk, encode and write ``documents`` (name, bytes) as first versions of ``tenant``;
        seconds per part and the core-seconds of encode, PostgreSQL and this process."""
        from pipelines.domain.chunking import VersionIdentity, chunk_document
        from pipelines.domain.parsing import parse_document
        from pipelines.domain.partition_keys import version_partition_key
        from resources.blob_store import content_hash
        from resources.embedder import tokenizer_for_model
        from resources.lexical import profile_analyzer
        from resources.publisher import media_type_for

        assert self.encoder is not None
        p = self.profile
        tokenizer = tokenizer_for_model(p["model"])  # loaded before the clock, as a run's is by then
        profile_analyzer(p)
        seconds: dict[str, float] = {}
        pg_before, own_before = tree_seconds(self.pg_pid) if self.pg_pid else 0.0, own_seconds()
        started = time.perf_counter()

        # parse + chunk (client)
        mark = time.perf_counter()
        versions: list[tuple[str, list[Any]]] = []
        for name, body in documents:
            parsed = parse_document(body, filename=name, media_type=media_type_for(name), ocr=p["ocr"])
            chunks = chunk_document(parsed, tokenizer=tokenizer, chunk_tokens=p["chunk_tokens"],
                                    overlap=p["chunk_overlap"], identity=VersionIdentity(tenant, name, 1, p["name"]))
            versions.append((name, chunks))
        seconds["parse_chunk"] = time.perf_counter() - mark

        # records: documents, versions, SUCCEEDED tasks
        mark = time.perf_counter()
        with self.db.transaction() as tx:
            tasks = {r["document_id"]: r["task_id"] for r in tx.fetch_all("bench_bare_records", {
                "tenant_id": tenant, "profile": p["name"],
                "document_ids": [name for name, _ in documents],
                "content_hashes": [content_hash(body) for _, body in documents],
                "byte_sizes": [len(body) for _, body in documents],
                "media_types": [media_type_for(name) for name, _ in documents],
                "partition_keys": [version_partition_key(tenant, name, 1) for name, _ in documents],
                "chunk_counts": [len(chunks) for _, chunks in versions],
            })}
        seconds["records"] = time.perf_counter() - mark

        # encode the distinct texts once each
        mark = time.perf_counter()
        distinct = list(dict.fromkeys(c.embed_text for _, chunks in versions for c in chunks))
        vectors, encode_cpu = self.encoder.encode(distinct)
        by_text = {text: vectors[i] for i, text in enumerate(distinct)}
        seconds["encode"] = time.perf_counter() - mark

        # write: pointers, chunk rows (HNSW), lexical rows and postings, BM25 statistics
        mark = time.perf_counter()
        for batch in _batches(versions):
            self._write(tenant, batch, tasks, by_text)
        seconds["write"] = time.perf_counter() - mark

        wall = time.perf_counter() - started
        pg = (tree_seconds(self.pg_pid) - pg_before) if self.pg_pid else 0.0
        client = own_seconds() - own_before
        if self.encoder.local is not None:  # the fake model encoded in this process: not the client's
            client -= encode_cpu
        chunk_count = sum(len(chunks) for _, chunks in versions)
        return {
            "docs": len(documents),
            "chunks": chunk_count,
            "distinct_texts": len(distinct),
            "encode_processes": self.encoder.workers,
            "seconds": round(wall, 3),
            "part_seconds": {k: round(v, 3) for k, v in seconds.items()},
            "chunks_per_second": round(chunk_count / wall, 2) if wall else 0.0,
            "core_seconds": {"encode": round(encode_cpu, 3), "PostgreSQL": round(pg, 3),
                             "client": round(max(0.0, client), 3)},
        }

    def _write(self, tenant: str, batch: list[tuple[str, list[Any]]], tasks: dict[str, int],
               by_text: dict[str, np.ndarray]) -> None:
        from resources.index_sink import IndexSink
        from resources.lexical import profile_analyzer, version_columns, write_lexical

        p = self.profile
        batch = sorted(batch, key=lambda v: v[0])  # key order, as the sink locks pointer rows
        keys = [{"tenant_id": tenant, "document_id": name, "profile": p["name"], "version_number": 1}
                for name, _ in batch]
        with self.db.transaction() as tx:
            moved = tx.fetch_all("search_pointer_advance", {
                **version_columns(keys), "task_ids": [tasks[name] for name, _ in batch],
                "chunk_counts": [len(chunks) for _, chunks in batch]})
            if len(moved) != len(batch):
                raise RuntimeError(f"{len(batch) - len(moved)} pointers did not move in a fresh tenant")
            rows = [(key, c, by_text[c.embed_text]) for key, (_, chunks) in zip(keys, batch) for c in chunks]
            if rows:
                IndexSink._write(tx, rows)  # noqa: SLF001 - the sink's own chunk_upsert parameters
                write_lexical(tx, [k for k, _, _ in rows], [c for _, c, _ in rows], profile_analyzer(p))
            tx.fetch_one("lexical_stats_reconcile", {"tenant_id": tenant, "profile": p["name"],
                                                     "document_ids": [name for name, _ in batch]})


def _batches(versions: list[tuple[str, list[Any]]]) -> Iterator[list[tuple[str, list[Any]]]]:
    """Versions per transaction as the sink batches a run's: at most BATCH_VERSIONS, about WRITE_BATCH chunks."""
    from resources.index_sink import BATCH_VERSIONS, WRITE_BATCH

    current: list[tuple[str, list[Any]]] = []
    rows = 0
    for version in versions:
        if current and (len(current) >= BATCH_VERSIONS or rows + len(version[1]) > WRITE_BATCH):
            yield current
            current, rows = [], 0
        current.append(version)
        rows += len(version[1])
    if current:
        yield current


def rows_of_tenant(url: str, tenant: str) -> dict[str, int]:
    from sql import queries

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(queries["bench_rows_of_tenant"], {"tenant_id": tenant})
        names = [d.name for d in cur.description]
        return dict(zip(names, cur.fetchone(), strict=True))
