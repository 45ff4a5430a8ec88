"""Migrations: applied in order, recorded, idempotent, and safe from two processes at once."""

from __future__ import annotations

import multiprocessing

import psycopg
from psycopg import sql as pgsql

from pipelines.domain.lexical import DEFAULT_ANALYZER
from resources.embedder import DEFAULT_MODEL_NAME, PACKAGED_MODEL_NAME
from resources.migrations import LEXICAL_BACKFILL, LEXICAL_MIGRATION, migrate, pending
from sql import migration_files, queries

DEFAULT_BACKEND_MIGRATION = "0024_default_backend"


def _fresh(pg_server_url: str, name: str) -> str:
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    base, _, query = pg_server_url.partition("?")
    return base.rpartition("/")[0] + f"/{name}" + (f"?{query}" if query else "")


def _migrate_before(url: str, stop: str) -> None:
    """Apply and record the migrations older than ``stop``: a database as an older release left it."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(queries["migration_table_create"])
        for version, body in migration_files():
            if version >= stop:
                break
            conn.execute(body.encode())
            conn.execute(queries["migration_record"], {"version": version})


def test_migrate_twice_applies_once(pg_server_url):
    url = _fresh(pg_server_url, "mig_twice")
    first = migrate(url)
    assert first == [v for v, _ in migration_files()]
    assert migrate(url) == []
    assert pending(url) == []


def _run_migrate(url, out):
    out.put(migrate(url))


def test_two_processes_migrate_at_once(pg_server_url):
    url = _fresh(pg_server_url, "mig_parallel")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_run_migrate, args=(url, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    applied = sorted(results, key=len)
    assert applied[0] == []
    assert applied[1] == [v for v, _ in migration_files()]
    with psycopg.connect(url) as conn:
        (count,) = conn.execute("SELECT count(*) FROM schema_migration").fetchone()
    assert count == len(migration_files())


def test_upgrade_past_0022_writes_lexical_rows_of_existing_chunks(pg_server_url):
    """A database with chunks from before the lexical index gets their lexical rows from `migrate` itself."""
    url = _fresh(pg_server_url, "mig_lexical_upgrade")
    _migrate_before(url, LEXICAL_MIGRATION)
    with psycopg.connect(url, autocommit=True) as conn:
        for i, text in enumerate(["Refunds take thirty days.", "退款将在十四天内退回。"]):
            conn.execute(
                "INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, text,"
                " token_count, content_digest, embedding) VALUES (%s, 'acme', 'refunds', 1, 'minilm-v1', %s, %s,"
                " 5, %s, %s::vector)",
                (f"c{i}", i, text, f"d{i}", "[" + ",".join(["0.05"] * 384) + "]"),
            )
    assert LEXICAL_BACKFILL not in pending(url)  # 0022 not applied yet: nothing to ask
    messages: list[str] = []
    applied = migrate(url, on_apply=messages.append)
    assert LEXICAL_MIGRATION in applied
    assert messages[-1] == f"{LEXICAL_BACKFILL}: 2 chunks, done"
    assert pending(url) == []
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM lexical_chunk").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM lexical_backfill").fetchone()[0] == 0
    assert migrate(url) == []


def test_fresh_database_has_no_lexical_backfill_to_do(pg_server_url):
    url = _fresh(pg_server_url, "mig_lexical_fresh")
    messages: list[str] = []
    migrate(url, on_apply=messages.append)
    assert not any(LEXICAL_BACKFILL in m for m in messages)


def _insert_one_chunk(conn) -> None:
    """Chunk c0 of acme/refunds v1 under minilm-v1, as an install that already indexed has it."""
    conn.execute(
        "INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, text,"
        " token_count, content_digest, embedding) VALUES ('c0', 'acme', 'refunds', 1, 'minilm-v1', 0,"
        " 'Refunds take thirty days.', 5, 'd0', %s::vector)", ("[" + ",".join(["0.05"] * 384) + "]",))


def _insert_one_lexical_chunk(conn) -> None:
    """Chunk c0 (``_insert_one_chunk``) with its lexical row and postings: terms 5 (tf 2) and 7 (tf 1), length 3."""
    _insert_one_chunk(conn)
    conn.execute("INSERT INTO lexical_chunk (chunk_id, tenant_id, document_id, profile, version_number,"
                 " content_digest, terms, tfs, length) VALUES ('c0', 'acme', 'refunds', 'minilm-v1', 1, 'd0',"
                 " '{5,7}', '{2,1}', 3)")
    conn.execute("INSERT INTO lexical_posting (chunk_id, term, tenant_id, profile, document_id, version_number,"
                 " tf, length) VALUES ('c0', 5, 'acme', 'minilm-v1', 'refunds', 1, 2, 3),"
                 " ('c0', 7, 'acme', 'minilm-v1', 'refunds', 1, 1, 3)")


def _profile_model(url: str) -> str:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT model FROM index_profile WHERE name = 'minilm-v1'").fetchone()[0]


def test_a_new_install_embeds_with_the_default_backend(pg_server_url):
    url = _fresh(pg_server_url, "mig_default_backend_fresh")
    migrate(url)
    assert _profile_model(url) == DEFAULT_MODEL_NAME == "all-MiniLM-L6-v2-int8"


def test_an_install_that_already_indexed_keeps_its_model_through_0024(pg_server_url):
    """0024 switches the default profile's backend only where nothing was embedded under it yet."""
    url = _fresh(pg_server_url, "mig_default_backend_kept")
    _migrate_before(url, DEFAULT_BACKEND_MIGRATION)
    with psycopg.connect(url, autocommit=True) as conn:
        _insert_one_chunk(conn)
    assert DEFAULT_BACKEND_MIGRATION in migrate(url)
    assert _profile_model(url) == PACKAGED_MODEL_NAME


DEFAULT_ANALYZER_MIGRATION = "0047_default_profile_english_analyzer"


def _profile_analyzer(url: str) -> str:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT lexical_analyzer FROM index_profile WHERE name = 'minilm-v1'").fetchone()[0]


def test_a_new_install_analyzes_with_the_default_analyzer(pg_server_url):
    url = _fresh(pg_server_url, "mig_default_analyzer_fresh")
    migrate(url)
    assert _profile_analyzer(url) == DEFAULT_ANALYZER == "english"


def test_an_install_that_already_indexed_keeps_its_analyzer_through_0047(pg_server_url):
    """0047 switches the default profile's analyzer only where no chunk (so no lexical row) exists under it yet."""
    url = _fresh(pg_server_url, "mig_default_analyzer_kept")
    _migrate_before(url, DEFAULT_ANALYZER_MIGRATION)
    with psycopg.connect(url, autocommit=True) as conn:
        _insert_one_chunk(conn)
    assert DEFAULT_ANALYZER_MIGRATION in migrate(url)
    assert _profile_analyzer(url) == "wordpiece"


def test_upgrade_past_0025_keeps_the_postings_under_one_unique_index(pg_server_url):
    """0025 swaps the posting keys and foreign key for one unique index and a delete trigger, rows intact."""
    url = _fresh(pg_server_url, "mig_lean_postings")
    _migrate_before(url, "0025_lexical_posting_lean")
    with psycopg.connect(url, autocommit=True) as conn:
        _insert_one_lexical_chunk(conn)
    assert migrate(url)[0] == "0025_lexical_posting_lean"
    with psycopg.connect(url, autocommit=True) as conn:
        indexes = conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'lexical_posting'").fetchall()
        assert [d for (d,) in indexes] == [
            "CREATE UNIQUE INDEX lexical_posting_term_idx ON public.lexical_posting USING btree "
            "(tenant_id, profile, term, chunk_id) INCLUDE (tf, length, document_id, version_number)"]
        assert conn.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = 'lexical_posting'::regclass"
                            " AND contype IN ('p', 'f')").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM lexical_posting").fetchone()[0] == 2
        assert conn.execute(queries["verify_lexical_index_mismatch"], {"limit": 5}).fetchall() == []
        conn.execute("DELETE FROM chunk")  # cascades to the lexical row, whose trigger takes the postings
        assert conn.execute("SELECT count(*) FROM lexical_posting").fetchone()[0] == 0


def test_upgrade_past_0026_drops_the_unused_chunk_digest_index_and_keeps_the_chunks(pg_server_url):
    """0026 drops chunk_digest_idx (no statement reads it; lookups by version must not be able to take it)."""
    url = _fresh(pg_server_url, "mig_drop_digest_idx")
    _migrate_before(url, "0026_drop_chunk_digest_idx")
    with psycopg.connect(url, autocommit=True) as conn:
        _insert_one_chunk(conn)
    assert migrate(url)[0] == "0026_drop_chunk_digest_idx"  # and whatever came after it
    with psycopg.connect(url, autocommit=True) as conn:
        names = {n for (n,) in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'chunk'")}
        assert "chunk_digest_idx" not in names and "chunk_embedding_hnsw_idx" in names
        assert conn.execute("SELECT count(*) FROM chunk").fetchone()[0] == 1


def test_migration_0028_hands_keys_from_before_0020_to_the_lineage_job(pg_server_url):
    """Keys added before dagster_partition_key existed were deleted by retention alone; 0028 records those of
    versions retention had not released, as added when published, and drops retention's key bookkeeping."""
    url = _fresh(pg_server_url, "mig_0028_keys")
    _migrate_before(url, "0028")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE schema_migration SET applied_at = now() - interval '10 days'"
                     " WHERE version = '0020_profile_backfill_and_lineage_keys'")
        conn.execute("INSERT INTO document (tenant_id, document_id, latest_version) VALUES ('acme', 'policy', 4)")
        for v, days in ((1, 20), (2, 15), (3, 1), (4, 20)):
            conn.execute(
                "INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size, "
                "filename, media_type, partition_key, published_at) VALUES ('acme', 'policy', %s, %s, 1, 'p.txt', "
                "'text/plain', %s, now() - make_interval(days => %s))",
                (v, f"h{v}", f"acme/policy/v{v}", days),
            )
        conn.execute("INSERT INTO partition_key_release (partition_key) VALUES ('acme/policy/v2')")  # deleted
        conn.execute("INSERT INTO dagster_partition_key (partition_key, added_at)"
                     " VALUES ('acme/policy/v4', now() - interval '1 hour')")  # re-added by the sensor since
    try:
        assert "0028_reuse_newest_copy_one_key_pruner" in migrate(url)
        with psycopg.connect(url) as conn:
            recorded = conn.execute(
                "SELECT k.partition_key, k.added_at = v.published_at FROM dagster_partition_key k"
                " JOIN document_version v USING (partition_key) ORDER BY 1").fetchall()
            (release_table,) = conn.execute("SELECT to_regclass('partition_key_release')").fetchone()
        # v1: from before 0020, never released; v2: released; v3: after 0020 (the sensor records its own)
        assert recorded == [("acme/policy/v1", True), ("acme/policy/v4", False)]
        assert release_table is None
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier("mig_0028_keys")))


def test_upgrade_past_0052_bounds_each_term_by_the_postings_it_has(pg_server_url):
    """0052 keeps each term's largest tf and smallest length / tf beside its df, filled from the postings there
    are; a term of no posting keeps none (NULL), nor do the reserved terms."""
    url = _fresh(pg_server_url, "mig_term_bounds")
    _migrate_before(url, "0052_lexical_term_bounds")
    with psycopg.connect(url, autocommit=True) as conn:
        _insert_one_lexical_chunk(conn)
        conn.execute("INSERT INTO lexical_term_stats (tenant_id, profile, term, df) VALUES ('acme', 'minilm-v1', 5, 1),"
                     " ('acme', 'minilm-v1', 7, 1), ('acme', 'minilm-v1', 9, 0), ('acme', 'minilm-v1', -1, 1)")
    assert migrate(url)[0] == "0052_lexical_term_bounds"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT term, df, max_tf, min_length_per_tf FROM lexical_term_stats ORDER BY term"
                            ).fetchall() == [(-1, 1, None, None), (5, 1, 2, 1.5), (7, 1, 1, 3.0), (9, 0, None, None)]
