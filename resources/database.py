"""A thin database client that only executes named queries (sql/queries/*.sql).

Every psycopg error is translated here, once, into ``DatabaseError`` (code INDEX_WRITE_FAILED,
retryable), raised ``from`` the original so the cause stays in logs but not in messages.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from pipelines.domain.errors import IndexWriteFailed
from sql import queries

Params = Mapping[str, Any] | None


class DatabaseError(IndexWriteFailed):
    """The database refused or lost the statement."""

    def __init__(self, message: str, *, sqlstate: str | None = None, query: str | None = None) -> None:
        super().__init__(message, sqlstate=sqlstate, query=query)
        self.sqlstate = sqlstate
        self.query = query


@contextmanager
def translate_errors(query: str | None = None) -> Iterator[None]:
    """The one place psycopg errors become kbindex errors."""
    try:
        yield
    except PoolTimeout as exc:
        raise DatabaseError("database connection pool exhausted", query=query) from exc
    except psycopg.Error as exc:
        sqlstate = getattr(exc, "sqlstate", None)
        kind = type(exc).__name__
        raise DatabaseError(f"database error {kind} ({sqlstate or 'no sqlstate'})", sqlstate=sqlstate, query=query) from exc


def _configure(conn: psycopg.Connection) -> None:
    try:
        from pgvector.psycopg import register_vector

        register_vector(conn)
    except psycopg.ProgrammingError:
        pass  # vector extension not created yet (before the first migration)


class Session:
    """Runs named queries on one connection (inside a transaction when opened by ``Database.transaction``)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def _run(self, name: str, params: Params) -> psycopg.Cursor:
        with translate_errors(name):
            cur = self.conn.cursor(row_factory=dict_row)
            cur.execute(queries[name], params)
            return cur

    def fetch_all(self, name: str, params: Params = None) -> list[dict[str, Any]]:
        return self._run(name, params).fetchall()

    def fetch_one(self, name: str, params: Params = None) -> dict[str, Any] | None:
        return self._run(name, params).fetchone()

    def execute(self, name: str, params: Params = None) -> int:
        """Run a statement; returns the number of rows it changed."""
        return self._run(name, params).rowcount

    def execute_many(self, name: str, rows: list[Mapping[str, Any]]) -> None:
        with translate_errors(name):
            with self.conn.cursor() as cur:
                cur.executemany(queries[name], rows)


class Database:
    """A connection pool plus named-query helpers. Autocommit unless inside ``transaction()``."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8, timeout: float = 30.0) -> None:
        self.url = url
        with translate_errors():
            self.pool = ConnectionPool(
                url,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout,
                kwargs={"autocommit": True},
                configure=_configure,
                open=True,
                check=ConnectionPool.check_connection,
            )

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One pooled connection in autocommit mode."""
        with translate_errors(), self.pool.connection() as conn:
            yield Session(conn)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One pooled connection inside a transaction: commits on success, rolls back on any error."""
        with translate_errors(), self.pool.connection() as conn, conn.transaction():
            yield Session(conn)

    def fetch_all(self, name: str, params: Params = None) -> list[dict[str, Any]]:
        with self.session() as s:
            return s.fetch_all(name, params)

    def fetch_one(self, name: str, params: Params = None) -> dict[str, Any] | None:
        with self.session() as s:
            return s.fetch_one(name, params)

    def execute(self, name: str, params: Params = None) -> int:
        with self.session() as s:
            return s.execute(name, params)
