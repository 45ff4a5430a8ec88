"""Starting the embedded PostgreSQL from several processes at once (`kbindex dev` beside `kbindex api`).

Each process may find no data folder, no server and no database; exactly one must initialize,
start and create, the others must wait and then use what it made. Issue #11, point 3.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql

from resources import local_postgres
from resources.database import DatabaseError
from resources.migrations import pending
from sql import migration_files

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# Waits for the go file (so all processes race from the same instant), then does what `kbindex dev`
# does before Dagster: start, migrate, create the dagster database. Prints one JSON line.
STARTER = """
import json, sys, time
from pathlib import Path
from resources import local_postgres
from resources.migrations import migrate
home, go = Path(sys.argv[1]), Path(sys.argv[2])
while not go.exists():
    time.sleep(0.002)
url = local_postgres.start(home)
applied = migrate(url)
local_postgres.ensure_database(local_postgres.with_database(url, "postgres"), "dagster")
print(json.dumps({"url": url, "applied": applied}))
"""


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KBINDEX_DATABASE_URL", "DAGSTER_PG_URL")}
    env.update(KBINDEX_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def _databases_named(admin_url: str, name: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        (n,) = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return n


@pytest.fixture
def fresh_home() -> Iterator[Path]:
    """A new, short KBINDEX_HOME (the server's Unix socket lives under it), deleted afterwards.

    Not tmp_path: as root the server runs as its own user, and every pytest session started on the
    machine chmods /tmp/pytest-of-root back to 0700, locking that user out of its data folder.
    """
    home = Path(tempfile.mkdtemp(prefix="kbc-"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_three_processes_start_a_fresh_home_at_once(fresh_home):
    home = fresh_home / "home"  # does not exist yet, like a first `kbindex dev`
    go = fresh_home / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STARTER, str(home), str(go)],
            cwd=PROJECT_ROOT, env=_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(3)
    ]
    try:
        time.sleep(3.0)  # let every interpreter finish its imports and wait on the go file
        go.touch()
        outputs = [p.communicate(timeout=180) for p in procs]
        for proc, (out, err) in zip(procs, outputs):
            assert proc.returncode == 0, err[-2000:]
        results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
        assert len({r["url"] for r in results}) == 1
        applied = sorted((r["applied"] for r in results), key=len)
        assert applied == [[], [], [v for v, _ in migration_files()]]
        admin = local_postgres.with_database(results[0]["url"], "postgres")
        assert _databases_named(admin, "kbindex") == 1
        assert _databases_named(admin, "dagster") == 1
        assert local_postgres.running_url(home) == results[0]["url"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        local_postgres.stop(home)


def _at_once(n: int, work) -> list[BaseException]:
    """Run ``work`` in ``n`` threads released together; the errors they raised."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def run() -> None:
        barrier.wait()
        try:
            work()
        except BaseException as exc:  # collected and asserted on by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_ensure_database_tolerates_concurrent_creators(pg_server_url):
    """DuplicateDatabase and UniqueViolation (pg_database_datname_index) both mean 'someone else made it'."""
    for round_ in range(3):
        name = f"race_db_{os.getpid()}_{round_}"
        try:
            assert _at_once(8, lambda: local_postgres.ensure_database(pg_server_url, name)) == []
            assert _databases_named(pg_server_url, name) == 1
        finally:
            with psycopg.connect(pg_server_url, autocommit=True) as conn:
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def test_pending_from_many_connections_on_a_fresh_database(pg_server_url):
    """`pending` creates the migration table; unlocked, concurrent callers collide on pg_type."""
    everything = [v for v, _ in migration_files()]
    for round_ in range(3):
        name = f"race_pending_{os.getpid()}_{round_}"
        local_postgres.ensure_database(pg_server_url, name)
        url = local_postgres.with_database(pg_server_url, name)
        try:
            results: list[list[str]] = []
            assert _at_once(6, lambda: results.append(pending(url))) == []
            assert results == [everything] * 6
        finally:
            with psycopg.connect(pg_server_url, autocommit=True) as conn:
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def test_start_gives_up_while_another_process_holds_the_lock(tmp_path):
    home = tmp_path / "kb"
    lock = local_postgres.pgdata_dir(home).parent / local_postgres.START_LOCK
    with local_postgres.exclusive_file_lock(lock, timeout=1):
        began = time.monotonic()
        with pytest.raises(DatabaseError, match="another process"):
            local_postgres.start(home, lock_timeout=0.3)
        assert time.monotonic() - began < 5
    assert not local_postgres.pgdata_dir(home).exists()  # nothing was started


@pytest.mark.parametrize("command", [["db", "start"], ["migrate"]])
def test_cli_start_failure_is_an_error_line_not_a_traceback(tmp_path, command):
    home = tmp_path / "kb"
    home.mkdir()
    (home / "postgres").write_text("not a folder")  # the server cannot be set up here
    done = subprocess.run(
        [sys.executable, "-c", "from pipelines.cli import main; main()", *command],
        cwd=PROJECT_ROOT, env=_env(home), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr + done.stdout
    assert "could not start the embedded PostgreSQL" in done.stderr
