"""Shared fixtures: one real PostgreSQL + pgvector per test session, a fresh database per test.

The server is the embedded one (a temporary data folder) unless KBINDEX_TEST_DATABASE_URL
points at an existing server. A template database is migrated once; each test gets
``CREATE DATABASE ... TEMPLATE`` (milliseconds) and drops it afterwards.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql

from resources.local_postgres import temporary_server
from resources.local_postgres import with_database as _with_database

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # Started in the background (`cmd &` in a script, nohup): SIGINT came in ignored. Dagster, run in process by
    # many tests, sets SIGTERM to whatever SIGINT's handler is when it restores its own, so this process would end
    # up ignoring SIGTERM, and so would every process the later tests start (a stop test then sees nothing stop).
    # Restore Python's default, as in a foreground run.
    signal.signal(signal.SIGINT, signal.default_int_handler)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # xdist's workers inherit COLUMNS=80 / LINES from execnet; the CLI's consoles would freeze that width at
    # import, while every CLI test sets the width its assertions need (CliRunner env, subprocess env).
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)
# The default profile's model is built from the packaged one on first use (resources/derived_models.py):
# once per test session for every test's KBINDEX_HOME and the processes they start, not once per home.
if "KBINDEX_MODELS_DIR" not in os.environ:  # set here, in pytest's first process; its workers inherit it
    os.environ["KBINDEX_MODELS_DIR"] = tempfile.mkdtemp(prefix="kbindex-test-models-")
    atexit.register(shutil.rmtree, os.environ["KBINDEX_MODELS_DIR"], ignore_errors=True)

TEMPLATE = "kbindex_template"
_counter = itertools.count()
CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"


# The session server's own data folder is thrown away after the run, so it need not survive an operating-system
# crash: no fsync, no full-page images. A killed or restarted PostgreSQL still loses nothing (the data is in the
# page cache), so the crash and restart tests keep their meaning. synchronous_commit stays on: with it off, six
# of the status page's plan checks (tests/api/test_status_page_plans.py: index-only counts, page reads) failed
# every time, most likely because commit hint bits wait for the WAL flush and VACUUM then cannot mark the seeded
# pages all-visible (not checked further). Never for a server named by
# KBINDEX_TEST_DATABASE_URL, nor for the benches' and chaos rounds' own servers, whose figures include what
# durability costs. KBINDEX_TEST_DURABLE=1 keeps PostgreSQL's defaults.
THROWAWAY_SETTINGS = {"fsync": "off", "full_page_writes": "off"}


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """Admin URL of a running PostgreSQL with pgvector available."""
    with temporary_server("kbindex-test-pg-", external_env="KBINDEX_TEST_DATABASE_URL") as url:
        if not os.environ.get("KBINDEX_TEST_DATABASE_URL") and os.environ.get("KBINDEX_TEST_DURABLE") != "1":
            _apply_settings(url, THROWAWAY_SETTINGS)
        yield url


def _apply_settings(url: str, settings: dict[str, str]) -> None:
    """ALTER SYSTEM each setting on the server ``url`` names and reload its configuration."""
    with psycopg.connect(url, autocommit=True) as conn:
        for name, value in settings.items():
            conn.execute(pgsql.SQL("ALTER SYSTEM SET {} = {}").format(pgsql.Identifier(name), pgsql.Literal(value)))
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def template_url(pg_server_url: str) -> str:
    from resources.migrations import migrate

    suffix = f"{os.getpid()}"
    name = f"{TEMPLATE}_{suffix}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    url = _with_database(pg_server_url, name)
    migrate(url)
    return url


@pytest.fixture(scope="session")
def database_from(pg_server_url: str) -> Callable[[str], AbstractContextManager[str]]:
    """``with database_from(url) as copy:`` a new database copied from the one ``url`` names (which must have no
    open connection), dropped on exit. A module that only reads what it seeds copies it once, not per test."""

    @contextlib.contextmanager
    def copy(source_url: str) -> Iterator[str]:
        source = source_url.partition("?")[0].rpartition("/")[2]
        name = f"t_{os.getpid()}_{next(_counter)}"
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(
                pgsql.SQL("CREATE DATABASE {} TEMPLATE {}").format(pgsql.Identifier(name), pgsql.Identifier(source))
            )
        try:
            yield _with_database(pg_server_url, name)
        finally:
            with psycopg.connect(pg_server_url, autocommit=True) as conn:
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))

    return copy


@pytest.fixture
def db_url(template_url: str, database_from) -> Iterator[str]:
    """URL of a fresh, migrated database for this test only."""
    with database_from(template_url) as url:
        yield url


@pytest.fixture
def db(db_url: str):
    from resources.database import Database

    database = Database(db_url, max_size=12)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def corpus_dir() -> Path:
    if not CORPUS.is_dir():
        pytest.skip("../shared/corpus is not present")
    return CORPUS


@pytest.fixture(autouse=True)
def _claim_once_per_tick(monkeypatch):
    """Sensor ticks evaluated in the test process claim once, as Dagster's own sensors would: the daemon's wait
    for a publish (pipelines.sensors.CLAIM_WAIT_SECONDS) would make every idle tick last 4.5 s. Daemons the
    tests start keep the default; tests/integration/test_claim_wakeup.py turns it on in process."""
    monkeypatch.setattr("pipelines.sensors.CLAIM_WAIT_SECONDS", 0.0)
    from pipelines.claim_window import ClaimWindow

    monkeypatch.setattr("pipelines.sensors.CLAIM_WINDOW", ClaimWindow())  # no loop's window leaks between tests
