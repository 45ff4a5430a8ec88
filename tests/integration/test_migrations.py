"""Migrations: applied in order, recorded, idempotent, and safe from two processes at once."""

from __future__ import annotations

import multiprocessing

import psycopg
from psycopg import sql as pgsql

from resources.migrations import migrate, pending
from sql import migration_files


def _fresh(pg_server_url: str, name: str) -> str:
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    base, _, query = pg_server_url.partition("?")
    return base.rpartition("/")[0] + f"/{name}" + (f"?{query}" if query else "")


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
