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
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from dagster_postgres import DagsterPostgresStorage

from resources import dagster_private
from resources.database import connection_params
from resources.local_databases import prepare_local_databases

if TYPE_CHECKING:
    from dagster._serdes import ConfigurableClassData

POOL_SIZE = 2
"""Connections each storage (runs, events, schedules) keeps open per process: the daemon's threads and a
run's step and heartbeat threads rarely need more at once."""
POOL_MAX_OVERFLOW = 8
"""Extra connections a burst of concurrent calls may open (closed again when returned)."""
POOL_RECYCLE_S = 1800
"""A connection older than this is replaced at its next checkout."""


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


def pooled_engine(url: str) -> Any:
    """An AUTOCOMMIT engine on ``url`` that keeps ``POOL_SIZE`` connections for reuse.

    ``pool_pre_ping`` tests a connection at checkout, so one that a PostgreSQL restart (or
    ``DROP DATABASE ... WITH (FORCE)``) closed is replaced instead of failing the call that took it.
    Its connections carry kbindex's network bounds (``connection_params``, role ``tool``: keepalives,
    ``tcp_user_timeout``, ``connect_timeout``, idle-in-transaction; no statement limit on Dagster's own
    statements), so a daemon or run whose storage connection goes silent errors out instead of hanging.
    """
    return dagster_private.create_pg_engine(url, isolation_level="AUTOCOMMIT", pool_size=POOL_SIZE,
                                            max_overflow=POOL_MAX_OVERFLOW, pool_recycle=POOL_RECYCLE_S,
                                            pool_pre_ping=True, connect_args=connection_params(url))


class KbindexDagsterStorage(DagsterPostgresStorage):
    """``dagster_postgres`` storage on :func:`resolve_dagster_url` (no configuration of its own), pooled."""

    def __init__(self, inst_data: ConfigurableClassData | None = None) -> None:
        url = resolve_dagster_url()
        super().__init__(postgres_url=url, inst_data=inst_data)
        dagster_private.use_pooled_engines(
            [self.event_log_storage, self.run_storage, self.schedule_storage], lambda: pooled_engine(url))
        dagster_private.bound_dynamic_ranges()  # the daemon's and webserver's key ranges: O(range), not O(keys)

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> KbindexDagsterStorage:
        return cls(inst_data=inst_data)
