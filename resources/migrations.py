"""Apply sql/migrations/*.sql in order, each in its own transaction, recorded in schema_migration.

Safe to run twice (applied versions are skipped) and from two processes at once (an advisory
lock serializes them; the second one finds nothing left to do).
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from sql import migration_files, queries


def migrate(url: str, *, on_apply: Callable[[str], None] | None = None) -> list[str]:
    """Apply pending migrations; returns the versions applied by this call."""
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(queries["migration_lock"])
        try:
            conn.execute(queries["migration_table_create"])
            done = {row[0] for row in conn.execute(queries["migration_applied"]).fetchall()}
            for version, body in migration_files():
                if version in done:
                    continue
                with conn.transaction():
                    conn.execute(body.encode())  # whole-file script; no parameters
                    conn.execute(queries["migration_record"], {"version": version})
                applied_now.append(version)
                if on_apply:
                    on_apply(version)
        finally:
            conn.execute(queries["migration_unlock"])
    return applied_now


def pending(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(queries["migration_table_create"])
        done = {row[0] for row in conn.execute(queries["migration_applied"]).fetchall()}
    return [v for v, _ in migration_files() if v not in done]
