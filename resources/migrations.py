"""Apply sql/migrations/*.sql in order, each in its own transaction, recorded in schema_migration.

Safe to run twice (applied versions are skipped) and from two processes at once (an advisory
lock serializes them; the second one finds nothing left to do). A migration that needs data written by
code (0022's lexical rows of existing chunks) leaves a marker row; ``migrate`` then runs that backfill under
the same lock, resumably, and ``pending`` lists it until it is done. ``pending`` takes the same lock:
two concurrent ``CREATE TABLE IF NOT EXISTS`` can still collide (UniqueViolation on pg_type).
psycopg errors leave here as ``DatabaseError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from resources.database import connection_params, translate_errors
from sql import migration_files, queries


@contextmanager
def _locked(url: str) -> Iterator[psycopg.Connection]:
    """A connection holding the migrators' advisory lock, with the migration table in place."""
    with translate_errors(), psycopg.connect(url, autocommit=True, **connection_params(url, "migration")) as conn:
        conn.execute(queries["migration_lock"])
        try:
            conn.execute(queries["migration_table_create"])
            yield conn
        finally:
            conn.execute(queries["migration_unlock"])


def _applied(conn: psycopg.Connection) -> set[str]:
    return {row[0] for row in conn.execute(queries["migration_applied"]).fetchall()}


def migrate(url: str, *, on_apply: Callable[[str], None] | None = None) -> list[str]:
    """Apply pending migrations; returns the versions applied by this call."""
    applied_now: list[str] = []
    with _locked(url) as conn:
        done = _applied(conn)
        for version, body in migration_files():
            if version in done:
                continue
            with conn.transaction():
                conn.execute(body.encode())  # whole-file script; no parameters
                conn.execute(queries["migration_record"], {"version": version})
            applied_now.append(version)
            if on_apply:
                on_apply(version)
        if _lexical_backfill_pending(conn, done | set(applied_now)):
            _backfill_lexical(url, on_apply)
    return applied_now


LEXICAL_MIGRATION = "0022_lexical_index"
LEXICAL_BACKFILL = f"{LEXICAL_MIGRATION} (backfill of existing chunks)"


def _lexical_backfill_pending(conn: psycopg.Connection, applied: set[str]) -> bool:
    """Whether migration 0022 left chunks without lexical rows to fill (it is applied and its marker row exists)."""
    return LEXICAL_MIGRATION in applied and conn.execute(queries["lexical_backfill_exists"]).fetchone() is not None


def _backfill_lexical(url: str, on_apply: Callable[[str], None] | None) -> None:
    from resources.database import Database
    from resources.lexical import backfill_lexical_index

    db = Database(url, min_size=1, max_size=1, role="migration")
    try:
        written = backfill_lexical_index(
            db, on_batch=lambda n: on_apply(f"{LEXICAL_BACKFILL}: {n} chunks") if on_apply and n % 10_000 == 0 else None
        )
    finally:
        db.close()
    if on_apply:
        on_apply(f"{LEXICAL_BACKFILL}: {written} chunks, done")


def pending(url: str) -> list[str]:
    """Versions not applied yet (waits while another process migrates)."""
    with _locked(url) as conn:
        done = _applied(conn)
        backfill = _lexical_backfill_pending(conn, done)
    return [v for v, _ in migration_files() if v not in done] + ([LEXICAL_BACKFILL] if backfill else [])
