"""A publish costs the database the same whether its tenant has a handful of chunks or 20,000 (issue #14).

The publish looks versions up by their keys. While a profile's statistics are stale (a migration's new
profile, a new tenant's bulk upload, a table that grew faster than autoanalyze), the planner took a
(profile, tenant) index for such a lookup and filtered every chunk of the tenant, once per version: in a
replay of 320-version runs the chunk count grew from 0.02 s to 1.04 s per publish until autoanalyze ran,
and the statistics reconcile read the tenant's whole ledger on every batch. Here autovacuum is off, the
statistics are taken while only another tenant has chunks, and the tenant then gets 20,000 chunks behind
the planner's back; each lookup of a real run's publish is then replayed under EXPLAIN (ANALYZE, BUFFERS)
and must touch about as many buffers as before.

Production does not run these statements with literal parameters for long: psycopg prepares a statement
after five executions on a connection, and PostgreSQL may then run one generic plan, made without the
parameters' values. So each lookup is also replayed as that generic plan (prepared by psycopg, as in
production, then ``EXPLAIN EXECUTE`` under ``plan_cache_mode = force_generic_plan``) and must not grow either,
nor scan a table of the publish sequentially (issue #33).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import psycopg
import pytest

from psycopg._queries import PostgresQuery  # how psycopg turns %(name)s into $n with types, as it prepares

from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.database import Session
from resources.embedder import FakeEmbedder
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.publisher import Publisher
from resources.run_state import RunState
from resources.task_queue import TaskQueue
from sql import queries

TENANT, PROFILE = "acme", "minilm-v1"
BULK = 20_000
VERSIONS = 8
# Statements of the publish step that find rows by version or document; each must stay O(versions written).
LOOKUPS = ("chunk_delete_stale", "index_rows_check", "lexical_stats_reconcile", "search_pointer_advance_fenced")


def publish_statements(db, db_url, tmp_path, first: int) -> list[tuple[str, dict]]:
    """Index VERSIONS fresh documents through a real IndexingRun; the publish step's LOOKUPS with their parameters."""
    blobs = BlobStore(str(tmp_path / "blobs"))
    publisher = Publisher(db, blobs)
    for i in range(first, first + VERSIONS):
        body = f"Policy {i}.\n\nRefunds of class {i} are paid within {i % 7 + 3} days.\n\nDesk {i} opens at nine."
        publisher.publish(TENANT, f"doc-{i}.txt", body.encode(), f"doc-{i}.txt")
    queue = TaskQueue(db, lease_seconds=60)
    claimed = queue.claim("sensor", limit=VERSIONS, for_run=True)
    keys = [r["partition_key"] for r in db.fetch_all("run_plan_inputs", {"task_ids": [c.lease.task_id for c in claimed]})]
    run = IndexingRun(db=db, queue=queue, keeper=LeaseKeeper(queue), owner=f"run-{first}", granted_by="sensor",
                      blobs=blobs, embedder_for=lambda model: FakeEmbedder(model_name=model),
                      state=RunState(ArtifactStore(tmp_path / f"artifacts-{first}")),
                      tagged=[(c.lease.task_id, c.lease.attempt) for c in claimed])
    for step in (run.parse, run.chunk, run.embed):
        step(keys)
    seen: list[tuple[str, dict]] = []
    original = Session._run

    def capturing(self, name, params):
        if name in LOOKUPS:
            seen.append((name, dict(params or {})))
        return original(self, name, params)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Session, "_run", capturing)
        results = run.publish(keys)
    assert all(r.outcome == "ok" for rs in results.values() for r in rs), results
    assert {name for name, _ in seen} == set(LOOKUPS)
    return seen


def buffers(db_url: str, statements: list[tuple[str, dict]]) -> dict[str, int]:
    """Shared buffers each statement touches, replayed under EXPLAIN ANALYZE and rolled back."""
    out: dict[str, int] = {}
    with psycopg.connect(db_url) as conn:
        for name, params in statements:
            (plan,) = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + queries[name], params).fetchone()
            conn.rollback()
            top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
            out[name] = out.get(name, 0) + top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    return out


PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# Tables whose size grows with the tenants' corpora: a publish must never read one of them whole.
BIG_TABLES = {"chunk", "lexical_chunk", "lexical_document", "lexical_posting", "lexical_term_stats",
              "search_pointer", "document_version"}


def generic_plan(conn: psycopg.Connection, name: str, params: dict) -> dict:
    """The generic plan of statement ``name`` (the one a psycopg-prepared statement may run: made once, without
    the parameters' values), run under EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) with ``params`` and rolled back.

    The statement is prepared with the text and parameter types psycopg sends when it prepares it (its sixth
    execution on a connection); the EXPLAIN EXECUTE passes the same values as literals of those types.
    ``conn`` must be in autocommit with ``plan_cache_mode = force_generic_plan``."""
    converted = PostgresQuery(psycopg.adapt.Transformer(conn))
    converted.convert(queries[name], params)
    order = list(dict.fromkeys(PLACEHOLDER.findall(queries[name])))  # psycopg numbers names by first use
    assert len(order) == len(converted.types), (name, order)
    prepared = conn.pgconn.prepare(b"kbindex_generic", converted.query, converted.types)
    assert prepared.status == psycopg.pq.ExecStatus.COMMAND_OK, prepared.get_error_message()
    try:
        with conn.transaction(force_rollback=True):
            cur = psycopg.ClientCursor(conn)
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE kbindex_generic ("
                        + ", ".join("%s" for _ in order) + ")", [params[key] for key in order])
            (plan,) = cur.fetchone()
        (generic, custom) = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                                         " WHERE name = 'kbindex_generic'").fetchone()
        assert (generic, custom) == (1, 0), f"{name}: EXPLAIN EXECUTE did not run the generic plan"
    finally:
        conn.execute("DEALLOCATE kbindex_generic")
    return (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]


def seq_scanned(plan: dict) -> set[str]:
    """Relations a plan (node tree from EXPLAIN FORMAT JSON) reads with a sequential scan."""
    found = {plan["Relation Name"]} if plan.get("Node Type") == "Seq Scan" else set()
    for child in plan.get("Plans", ()):
        found |= seq_scanned(child)
    return found


def generic_buffers(db_url: str, statements: list[tuple[str, dict]]) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Shared buffers each statement's generic plan touches, and the big tables each generic plan seq-scans."""
    out: dict[str, int] = {}
    scans: dict[str, set[str]] = {}
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for name, params in statements:
            top = generic_plan(conn, name, params)
            out[name] = out.get(name, 0) + top["Shared Hit Blocks"] + top["Shared Read Blocks"]
            if seq_scanned(top) & BIG_TABLES:
                scans.setdefault(name, set()).update(seq_scanned(top) & BIG_TABLES)
    return out, scans


@pytest.fixture
def stale_statistics(db_url) -> Iterator[None]:
    """No autovacuum on the publish's tables; statistics taken while only another tenant has chunks; no HNSW
    graph (the bulk rows would take minutes to insert into it, and no statement here reads it)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
        conn.execute("DROP INDEX chunk_embedding_hnsw_idx")
        for table in ("chunk", "lexical_chunk", "lexical_document", "search_pointer", "lexical_term_stats"):
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    add_bulk_chunks(db_url, "other", 2_000)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ANALYZE")
    yield


def add_bulk_chunks(db_url: str, tenant: str, n: int) -> None:
    """``n`` published documents of ``tenant`` under PROFILE: a version, a succeeded task and a search pointer
    each, one chunk each with its lexical rows and ledger."""
    params = {"t": tenant, "p": PROFILE, "n": n}
    with psycopg.connect(db_url) as conn:
        conn.execute("INSERT INTO document (tenant_id, document_id)"
                     " SELECT %(t)s, %(t)s || '-bulk-' || i FROM generate_series(1, %(n)s) AS i", params)
        conn.execute(
            "INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size, filename,"
            " media_type, partition_key) SELECT %(t)s, %(t)s || '-bulk-' || i, 1, md5(i::text), 10, 'bulk.txt',"
            " 'text/plain', %(t)s || '|bulk-' || i || '|1' FROM generate_series(1, %(n)s) AS i", params)
        conn.execute(
            "INSERT INTO index_task (tenant_id, document_id, version_number, profile, status)"
            " SELECT %(t)s, %(t)s || '-bulk-' || i, 1, %(p)s, 'SUCCEEDED' FROM generate_series(1, %(n)s) AS i", params)
        conn.execute(
            "INSERT INTO search_pointer (tenant_id, document_id, profile, version_number, task_id, chunk_count)"
            " SELECT tenant_id, document_id, profile, 1, task_id, 1 FROM index_task"
            " WHERE tenant_id = %(t)s AND document_id LIKE %(t)s || '-bulk-%%'", params)
        conn.execute(
            "INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, text, token_count,"
            " content_digest, embed_digest, embedding)"
            " SELECT %(t)s || '-bulk-' || i, %(t)s, %(t)s || '-bulk-' || i, 1, %(p)s, 0, 'bulk text ' || i, 3, md5(i::text),"
            " encode(sha256(convert_to(i::text, 'UTF8')), 'hex'),"
            " array_fill(0.05, ARRAY[384])::vector FROM generate_series(1, %(n)s) AS i", params)
        conn.execute(
            "INSERT INTO lexical_chunk (chunk_id, tenant_id, document_id, profile, version_number, content_digest,"
            " terms, tfs, length) SELECT %(t)s || '-bulk-' || i, %(t)s, %(t)s || '-bulk-' || i, %(p)s, 1, md5(i::text), '{7}', '{1}', 1"
            " FROM generate_series(1, %(n)s) AS i", params)
        conn.execute(
            "INSERT INTO lexical_document (tenant_id, document_id, profile, version_number, terms, dfs)"
            " SELECT %(t)s, %(t)s || '-bulk-' || i, %(p)s, 1, '{-2,-1,7}', '{1,1,1}' FROM generate_series(1, %(n)s) AS i", params)


@pytest.mark.timeout(300)
def test_publish_lookups_do_not_walk_the_tenants_chunks(db, db_url, tmp_path, stale_statistics):
    before = buffers(db_url, publish_statements(db, db_url, tmp_path, first=1))
    add_bulk_chunks(db_url, TENANT, BULK)
    after = buffers(db_url, publish_statements(db, db_url, tmp_path, first=1000))
    grown = {name: (before[name], after[name]) for name in LOOKUPS if after[name] > 3 * before[name] + 30}
    assert not grown, f"statements whose buffers grew with the tenant's {BULK:,} other chunks: {grown}"


@pytest.mark.timeout(300)
def test_publish_lookups_generic_plans_do_not_walk_the_tenants_chunks(db, db_url, tmp_path, stale_statistics):
    """The same replay as above, as the generic plans a connection runs once psycopg has prepared the lookups."""
    before, scans_before = generic_buffers(db_url, publish_statements(db, db_url, tmp_path, first=1))
    add_bulk_chunks(db_url, TENANT, BULK)
    after, scans_after = generic_buffers(db_url, publish_statements(db, db_url, tmp_path, first=1000))
    assert not scans_before and not scans_after, f"generic plans reading a big table whole: {scans_before} {scans_after}"
    grown = {name: (before[name], after[name]) for name in LOOKUPS if after[name] > 3 * before[name] + 30}
    assert not grown, f"generic plans whose buffers grew with the tenant's {BULK:,} other chunks: {grown}"
