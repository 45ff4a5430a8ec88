"""A thin database client that only executes named queries (sql/queries/*.sql).

Every psycopg error is translated here, once, into ``DatabaseError`` (code INDEX_WRITE_FAILED,
retryable), raised ``from`` the original so the cause stays in logs but not in messages.

Every connection is bounded (``connection_params``, values in ``resources.settings.ConnectionBounds``):
libpq ``connect_timeout``, TCP keepalives and ``tcp_user_timeout`` on the client; the same TCP settings and
``idle_in_transaction_session_timeout`` on the server for the session; and per role of the connection:

* ``run`` (Dagster runs, sensors and jobs): ``statement_timeout`` 300 s, ``lock_timeout`` 60 s;
* ``api`` (API requests): ``statement_timeout`` 30 s, ``lock_timeout`` 10 s, and shorter network bounds
  (keepalives from 2 s, every 1 s, ``tcp_user_timeout`` 4 s: a silent PostgreSQL fails a request within
  about 5 s) and a 4 s wait for a pooled connection (``Database(role="api")``), so requests get their 503
  quickly rather than hang while PostgreSQL is away;
* ``tool`` (the CLI, benches, tests; the default): no statement or lock limit (an operator's verify,
  retention or 1M-row seeding may legitimately run long), the network and idle-in-transaction bounds only;
* ``migration``: the network bounds only (a migration or index build runs as long as it takes, and the
  migrators' advisory lock is waited for on purpose).

A partition therefore ends a client's statement within ``ConnectionBounds.silent_bound_s(role)`` (about 35 s by
default, 5 s for ``api``) with ``DatabaseError``, and the server ends the abandoned backend, rolling its transaction back.
A setting already in the URL (``?keepalives_idle=...``, ``options=-c statement_timeout=...``) wins.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from pipelines.domain.errors import IndexWriteFailed
from resources.settings import ConnectionBounds
from sql import queries

Params = Mapping[str, Any] | None
ROLES = ("run", "api", "tool", "migration")


def connection_params(url: str | None = None, role: str = "tool",
                      bounds: ConnectionBounds | None = None) -> dict[str, Any]:
    """libpq keyword parameters bounding a connection of ``role`` (see the module docstring).

    Pass them to ``psycopg.connect(url, **params)`` (or psycopg2 / SQLAlchemy ``connect_args``). Keys the URL
    already sets are left out, and the URL's own ``options`` come after these, so the URL wins.
    """
    if role not in ROLES:
        raise ValueError(f"unknown connection role {role!r} (one of {', '.join(ROLES)})")
    b = bounds or ConnectionBounds.from_env()
    params: dict[str, Any] = {}
    if b.connect_timeout_s:
        params["connect_timeout"] = max(2, round(b.connect_timeout_s))  # libpq treats 1 as 2
    idle, interval, count, tcp_user_timeout = b.network(role)
    if idle:
        params.update(keepalives=1, keepalives_idle=max(1, round(idle)), keepalives_interval=max(1, round(interval)),
                      keepalives_count=max(1, count))
    if tcp_user_timeout:
        params["tcp_user_timeout"] = tcp_user_timeout
    server: dict[str, int] = {}
    if idle:  # the server's end of the same connection: its backend notices a silent client too
        server.update(tcp_keepalives_idle=max(1, round(idle)), tcp_keepalives_interval=max(1, round(interval)),
                      tcp_keepalives_count=max(1, count))
    if tcp_user_timeout:
        server["tcp_user_timeout"] = tcp_user_timeout
    if role != "migration" and b.idle_in_transaction_ms:
        server["idle_in_transaction_session_timeout"] = b.idle_in_transaction_ms
    statement, lock = {"run": (b.run_statement_timeout_ms, b.run_lock_timeout_ms),
                       "api": (b.api_statement_timeout_ms, b.api_lock_timeout_ms)}.get(role, (0, 0))
    if statement:
        server["statement_timeout"] = statement
    if lock:
        server["lock_timeout"] = lock
    if role in ("run", "api") and b.client_check_ms:
        server["client_connection_check_interval"] = b.client_check_ms
    try:
        given = conninfo_to_dict(url) if url else {}
    except psycopg.ProgrammingError:  # a SQLAlchemy URL (postgresql+psycopg2://): nothing of ours in it to keep
        given = {}
    ours = " ".join(f"-c {name}={value}" for name, value in server.items())
    if ours:
        params["options"] = f"{ours} {given['options']}" if given.get("options") else ours
    return {k: v for k, v in params.items() if k == "options" or k not in given}


class DatabaseError(IndexWriteFailed):
    """The database refused or lost the statement."""

    def __init__(self, message: str, *, sqlstate: str | None = None, query: str | None = None) -> None:
        super().__init__(message, sqlstate=sqlstate, query=query)
        self.sqlstate = sqlstate
        self.query = query


def raised_on_purpose(exc: DatabaseError, sqlstate: str) -> tuple[str, str] | None:
    """The message and detail of an error one of kbindex's own SQL functions raised to abort a transaction with
    SQLSTATE ``sqlstate`` (``kbindex_refuse``, ``kbindex_publish_abort``); None for any other error."""
    diag = getattr(exc.__cause__, "diag", None)
    if exc.sqlstate != sqlstate or diag is None:
        return None
    return diag.message_primary or "", diag.message_detail or ""


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

    def submit(self, name: str, params: Params = None) -> psycopg.Cursor:
        """Send a statement and return its cursor without reading its result: in a pipelined transaction
        (``Database.transaction(pipelined=True)``) it waits for nothing until a later fetch; elsewhere it is
        ``execute``. Read the cursor (``fetchone``) only after a fetch has waited for it."""
        return self._run(name, params)

    def fetch_all(self, name: str, params: Params = None) -> list[dict[str, Any]]:
        return self._run(name, params).fetchall()

    def fetch_one(self, name: str, params: Params = None) -> dict[str, Any] | None:
        return self._run(name, params).fetchone()

    def execute(self, name: str, params: Params = None) -> int:
        """Run a statement; returns the number of rows it changed."""
        return self._run(name, params).rowcount

    def execute_many(self, name: str, rows: list[Mapping[str, Any]]) -> None:
        """The statement once per row, pipelined by psycopg: one round trip for the lot, in order."""
        with translate_errors(name):
            with self.conn.cursor() as cur:
                cur.executemany(queries[name], rows)

    def fetch_many(self, name: str, rows: list[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
        """``execute_many`` that keeps each row's result: one list of result rows per input row, in order."""
        if not rows:
            return []
        with translate_errors(name):
            with self.conn.cursor(row_factory=dict_row) as cur:
                cur.executemany(queries[name], rows, returning=True)
                results = [cur.fetchall()]
                while cur.nextset():
                    results.append(cur.fetchall())
                return results


CHECK_AFTER_IDLE_S = 1.0
"""A pooled connection is checked (an empty query, one round trip) as it leaves the pool only if it sat there this
long; 0 checks every checkout. Dagster's storage follows it too (resources/dagster_storage.py,
PING_AFTER_IDLE_S): a connection a PostgreSQL restart or a partition closed sat unused at least as long as the
server was away, so it is still checked and replaced; one in steady use skips the round trip, which was one of
the ~13 a single publish made over a slow link (``python -m bench.publish --delay-ms``)."""


class IdleCheck:
    """The pool's ``check`` and ``reset`` callbacks: ``reset`` notes when a connection came back, ``check`` tests it
    as it leaves only if it sat in the pool ``after_s`` or more (or was never returned: a new connection)."""

    def __init__(self, after_s: float = CHECK_AFTER_IDLE_S) -> None:
        self.after_s = after_s
        self._returned: weakref.WeakKeyDictionary[psycopg.Connection, float] = weakref.WeakKeyDictionary()

    def reset(self, conn: psycopg.Connection) -> None:
        self._returned[conn] = time.monotonic()

    def check(self, conn: psycopg.Connection) -> None:
        returned = self._returned.get(conn)
        if returned is not None and time.monotonic() - returned < self.after_s:
            return
        ConnectionPool.check_connection(conn)


@contextmanager
def _pipelined_transaction(conn: psycopg.Connection) -> Iterator[Session]:
    """A transaction in pipeline mode on an autocommit connection: BEGIN and COMMIT are queued with the statements,
    so the block waits only where it fetches, plus once at the end. (psycopg's ``transaction()`` in pipeline mode
    syncs as it enters and twice as it leaves: four round trips more, measured through bench/relay.py.) On any
    error COMMIT is never sent: the pool's connection context (``Connection.__exit__``) rolls the transaction back
    as the error leaves ``Database.transaction``."""
    with conn.pipeline():
        conn.execute(queries["transaction_begin"], prepare=False)  # never a server-side prepared statement
        yield Session(conn)
        conn.execute(queries["transaction_commit"], prepare=False)


def _retry_while_waited_for(pool: ConnectionPool) -> None:
    """psycopg_pool's ``reconnect_failed``: it gave up a series of reconnection attempts. It tries again only
    when the next request arrives, so a request already waiting (a claiming tick's, for up to 30 s) waited out its
    whole timeout after the server came back (tests/network/test_claim_partition.py: no claim 15 s after a
    12-s partition healed). While a request waits, start the next series now: ``check`` grows an empty pool."""
    if pool.get_stats().get("requests_waiting", 0):
        pool.check()


class Database:
    """A connection pool plus named-query helpers. Autocommit unless inside ``transaction()``.

    ``role`` picks the connection bounds (``connection_params``); ``timeout`` bounds waiting for a pooled
    connection (each new one's connect is bounded by ``connect_timeout``); by default 30 s, for ``api``
    KBINDEX_PG_API_POOL_TIMEOUT_S (4 s). A connection that sat in the pool is checked as it leaves it
    (``IdleCheck``), so one that died with its server is replaced, not handed out; a lost one is retried for
    KBINDEX_PG_RECONNECT_S (10 s) at most, after which the next request connects afresh, and a request already
    waiting starts the next series (``_retry_while_waited_for``): after PostgreSQL restarts or a partition heals, the pool works again within
    about that long, however long it was away."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8, timeout: float | None = None,
                 role: str = "tool") -> None:
        self.url = url
        self.role = role
        bounds = ConnectionBounds.from_env()
        if timeout is None:
            timeout = (bounds.api_pool_timeout_s or 30.0) if role == "api" else 30.0  # 0: the bound off
        idle_check = IdleCheck()
        with translate_errors():
            self.pool = ConnectionPool(
                url,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout,
                kwargs={"autocommit": True, **connection_params(url, role, bounds)},
                configure=_configure,
                open=True,
                check=idle_check.check,
                reset=idle_check.reset,
                reconnect_timeout=bounds.reconnect_s or 300.0,
                reconnect_failed=_retry_while_waited_for,
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
    def transaction(self, *, pipelined: bool = False) -> Iterator[Session]:
        """One pooled connection inside a transaction: commits on success, rolls back on any error.

        ``pipelined``: in psycopg's pipeline mode, so BEGIN, the statements ``Session.submit`` sends and COMMIT
        wait for nothing; each fetch waits once for everything sent before it (a slow link pays one round trip
        per fetch, not per statement). An error surfaces at the next fetch or at the end."""
        with translate_errors(), self.pool.connection() as conn:
            if not pipelined:
                with conn.transaction():
                    yield Session(conn)
                return
            with _pipelined_transaction(conn) as session:
                yield session

    def fetch_all(self, name: str, params: Params = None) -> list[dict[str, Any]]:
        with self.session() as s:
            return s.fetch_all(name, params)

    def fetch_one(self, name: str, params: Params = None) -> dict[str, Any] | None:
        with self.session() as s:
            return s.fetch_one(name, params)

    def execute(self, name: str, params: Params = None) -> int:
        with self.session() as s:
            return s.execute(name, params)
