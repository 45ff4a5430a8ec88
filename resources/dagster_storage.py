"""Dagster's run/event/schedule storage on PostgreSQL, with the embedded server as the no-set-up default.

``dagster.yaml`` names :class:`KbindexDagsterStorage` (``storage: custom``). With ``DAGSTER_PG_URL`` set
(production, ``kbindex dev``, tests) it is plain ``dagster_postgres`` storage on that URL. Without it,
plain ``dagster dev`` in the project root still comes up: the storage prepares the same databases
``kbindex dev`` uses (:func:`prepare_local_databases`) and puts their URLs into this process's
environment, so the webserver, daemon, code server and runs that ``dagster dev`` starts afterwards
inherit them and neither start PostgreSQL again nor look elsewhere for kbindex data.

Building it also bounds this process's dynamic key ranges (``dagster_private.bound_dynamic_ranges``: the
daemon and webserver load this storage but never see ``VersionPartitions``).

Its engines keep a few connections open (:func:`pooled_engine`). ``dagster_postgres`` opens a new
connection for every storage call (SQLAlchemy's NullPool): every event a run writes, every daemon poll.
A new PostgreSQL connection costs the server a backend process, ~2.4 ms of its CPU before the first
query (and cold catalog caches after it); a 150-document burst opened ~3,900 of them, about a quarter
of PostgreSQL's CPU in a burst where that CPU competes with the model for the same cores
(``python -m bench.dagster_storage`` measures both side by side). The webserver replaces these engines
with its own pool (``optimize_for_webserver``), as before. The swap reaches into dagster_postgres's
private ``_engine`` (resources/dagster_private.py): should an upgrade change it, the storage stays plain
``dagster_postgres`` storage, with a warning.

Round trips that carry no work are cut too (issue #32: a daemon 500 ms from its database spent ~20 s of a
sensor tick on them): the three storages share one engine (one dialect set-up per process), the pool tests
a connection only after it sat unused (``PING_AFTER_IDLE_S``), and Dagster's schema checks (a catalog query
on many calls: "does the instigators table exist?") are asked once (``dagster_private.remember_schema_checks``).
A sensor tick's storage calls went from ~38 statements to ~8. Each connection names its process in
``application_name`` (:func:`process_name`).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

from dagster_postgres import DagsterPostgresStorage

from resources import dagster_private
from resources.database import CHECK_AFTER_IDLE_S, connection_params
from resources.local_databases import prepare_local_databases
from sql import queries

if TYPE_CHECKING:
    from dagster._serdes import ConfigurableClassData

POOL_SIZE = 3
"""Connections the storages (runs, events, schedules share one engine) keep open per process: the daemon's
threads and a run's step and heartbeat threads rarely need more at once."""
POOL_MAX_OVERFLOW = 8
"""Extra connections a burst of concurrent calls may open (closed again when returned)."""
POOL_RECYCLE_S = 1800
"""A connection older than this is replaced at its next checkout."""
PING_AFTER_IDLE_S = CHECK_AFTER_IDLE_S
"""A pooled connection is tested (``SELECT 1``) at checkout only if it sat unused this long; 0 tests every
checkout (SQLAlchemy's ``pool_pre_ping``). A connection a PostgreSQL restart closed sat unused at least as
long as PostgreSQL was down (a restart takes seconds), so it is still tested and replaced; one in steady use
skips the extra round trip, which was half of the daemon's statements (``python -m bench.dagster_storage``)."""


def resolve_dagster_url() -> str:
    """DAGSTER_PG_URL, or the local default prepared now and exported to this process's children."""
    url = os.environ.get("DAGSTER_PG_URL")
    if url:
        return url
    from resources.settings import Settings

    settings = Settings.from_env()
    local = prepare_local_databases()
    os.environ.setdefault("KBINDEX_HOME", str(settings.home))  # absolute: children may run elsewhere
    os.environ.setdefault("KBINDEX_DATABASE_URL", local.kbindex_url)
    os.environ["DAGSTER_PG_URL"] = local.dagster_url
    return local.dagster_url


def pooled_engine(url: str, ping_after_idle_s: float = PING_AFTER_IDLE_S) -> Any:
    """An AUTOCOMMIT engine on ``url`` that keeps ``POOL_SIZE`` connections for reuse, most recent first.

    A connection is tested at checkout once it has been idle ``ping_after_idle_s`` (:func:`ping_when_idle`;
    0: every checkout), so one that a PostgreSQL restart (or ``DROP DATABASE ... WITH (FORCE)``) closed is
    replaced instead of failing the call that took it. Last in, first out: the connection just returned is
    the one taken next, so a thread's back-to-back calls find it fresh and pay no test.
    Its connections carry kbindex's network bounds (``connection_params``, role ``tool``: keepalives,
    ``tcp_user_timeout``, ``connect_timeout``, idle-in-transaction; no statement limit on Dagster's own
    statements), so a daemon or run whose storage connection goes silent errors out instead of hanging.
    """
    engine = dagster_private.create_pg_engine(url, isolation_level="AUTOCOMMIT", pool_size=POOL_SIZE,
                                              max_overflow=POOL_MAX_OVERFLOW, pool_recycle=POOL_RECYCLE_S,
                                              pool_use_lifo=True, pool_pre_ping=ping_after_idle_s <= 0,
                                              connect_args={"application_name": process_name(),
                                                            **connection_params(url)})
    if ping_after_idle_s > 0:
        ping_when_idle(engine, ping_after_idle_s)
    return engine


PROCESS_NAME_ENV = "KBINDEX_DAGSTER_PROCESS"
"""Overrides :func:`process_name` (the warm launcher's run children set it to ``run``)."""


RUN_PROCESS_NAME = "kbindex-dagster-run"
"""``process_name()`` of a run process (forked by the warm launcher, or Dagster's ``execute_run``)."""
FORK_SERVER_PROCESS_NAME = "kbindex-dagster-fork-server"
"""``process_name()`` of the warm launcher's fork server (started by a run's launch; builds an instance per child
exit to record a crash)."""
NEVER_CREATE_TABLES = frozenset({RUN_PROCESS_NAME, FORK_SERVER_PROCESS_NAME})
"""Processes that only ever act on runs already created in Dagster's tables, so never ask whether they exist."""


def process_name() -> str:
    """``kbindex-dagster-<part>``: the ``application_name`` of this process's Dagster storage connections, so
    ``pg_stat_activity`` and the server log tell the daemon's from a run's (``python -m bench.idle`` counts by it)."""
    part = os.environ.get(PROCESS_NAME_ENV)
    if not part and sys.argv and sys.argv[0].endswith(os.path.join("pipelines", "warm_launcher.py")):
        part = "fork-server"  # its own file, not a mention: `pytest tests/.../test_warm_launcher.py` is no fork server
    if not part:
        argv = " ".join(sys.argv)
        part = next((name for needle, name in (("execute_run", "run"), ("dagster-daemon", "daemon"),
                                               ("_daemon", "daemon"), ("grpc", "code-server"),
                                               ("code-server", "code-server-proxy"), ("webserver", "webserver"),
                                               (" dev ", "dev"))
                     if needle in argv), "other")
    return f"kbindex-dagster-{part}"


def ping_when_idle(engine: Any, idle_s: float) -> None:
    """Test a pooled connection at checkout only if it was checked in ``idle_s`` ago or more.

    SQLAlchemy's own pessimistic disconnect handling, with a condition: a failed test raises
    ``DisconnectionError``, on which the pool discards the connection and checks out a new one.
    A connection just opened (nothing recorded yet) is not tested.
    """
    from sqlalchemy import event
    from sqlalchemy.exc import DisconnectionError

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info["kbindex_returned_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _test_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get("kbindex_returned_at")
        if returned is None or time.monotonic() - returned < idle_s:
            return
        try:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(queries["connection_test"])
            finally:
                cursor.close()
        except Exception as exc:  # noqa: BLE001 - any failure: a dead connection, replaced by the pool
            raise DisconnectionError(f"an idle Dagster storage connection failed its test: {exc}") from exc


class KbindexDagsterStorage(DagsterPostgresStorage):
    """``dagster_postgres`` storage on :func:`resolve_dagster_url`, on one pooled engine, its schema checks remembered.

    dagster.yaml may set ``ping_after_idle_seconds`` (default ``PING_AFTER_IDLE_S``; 0: test every
    checkout) and ``remember_schema_checks`` (default true; ``dagster_private.remember_schema_checks``).
    """

    def __init__(self, inst_data: ConfigurableClassData | None = None, ping_after_idle_seconds: float = PING_AFTER_IDLE_S,
                 remember_schema_checks: bool = True) -> None:
        url = resolve_dagster_url()
        # A run process never creates Dagster's tables: its run was created in them; nor does the fork server,
        # started by a run's launch, which builds an instance at every child's exit. Asking costs each storage a
        # connection of its own and a catalog reflection (3 connections, ~25 statements and ~0.15 s of CPU each
        # time; ~20 s per run over a 500-ms link). Every other process still creates them on a new database.
        super().__init__(postgres_url=url, should_autocreate_tables=process_name() not in NEVER_CREATE_TABLES,
                         inst_data=inst_data)
        parts = [self.event_log_storage, self.run_storage, self.schedule_storage]
        shared: list[Any] = []  # one engine for the three: one pool, one dialect set-up (a new process's first
        # connection runs ~7 driver queries per engine: 20 round trips saved per run over a slow link)

        def engine() -> Any:
            if not shared:
                shared.append(pooled_engine(url, ping_after_idle_seconds))
            return shared[0]

        dagster_private.use_pooled_engines(parts, engine)
        if remember_schema_checks:
            dagster_private.remember_schema_checks(parts)
        dagster_private.bound_dynamic_ranges()  # the daemon's and webserver's key ranges: O(range), not O(keys)

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        import dagster as dg

        return {
            "ping_after_idle_seconds": dg.Field(float, is_required=False, default_value=PING_AFTER_IDLE_S,
                                                description="Test a pooled connection only after this long idle "
                                                            "(0: at every checkout)."),
            "remember_schema_checks": dg.Field(bool, is_required=False, default_value=True,
                                               description="Ask PostgreSQL's catalog once whether an optional "
                                                           "Dagster table or column exists, not on every call."),
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> KbindexDagsterStorage:
        return cls(inst_data=inst_data, **(config_value or {}))
