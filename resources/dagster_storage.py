"""Dagster's run/event/schedule storage on PostgreSQL, with the embedded server as the no-set-up default.

``dagster.yaml`` names :class:`KbindexDagsterStorage` (``storage: custom``). With ``DAGSTER_PG_URL`` set
(production, ``kbindex dev``, tests) it is plain ``dagster_postgres`` storage on that URL. Without it,
plain ``dagster dev`` in the project root still comes up: the storage prepares the same databases
``kbindex dev`` uses (:func:`prepare_local_databases`) and puts their URLs into this process's
environment, so the webserver, daemon, code server and runs that ``dagster dev`` starts afterwards
inherit them and neither start PostgreSQL again nor look elsewhere for kbindex data.
"""

from __future__ import annotations

import os
from typing import Any

from dagster._core.storage.base_storage import DagsterStorage
from dagster._serdes import ConfigurableClass, ConfigurableClassData

from resources.local_databases import prepare_local_databases


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


class KbindexDagsterStorage(DagsterStorage, ConfigurableClass):
    """``dagster_postgres`` storage on :func:`resolve_dagster_url` (no configuration of its own)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None) -> None:
        from dagster_postgres import DagsterPostgresStorage

        self._inst_data = inst_data
        self._postgres = DagsterPostgresStorage(postgres_url=resolve_dagster_url())
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> KbindexDagsterStorage:
        return cls(inst_data=inst_data)

    @property
    def event_log_storage(self):  # noqa: ANN201 - Dagster's EventLogStorage
        return self._postgres.event_log_storage

    @property
    def run_storage(self):  # noqa: ANN201 - Dagster's RunStorage
        return self._postgres.run_storage

    @property
    def schedule_storage(self):  # noqa: ANN201 - Dagster's ScheduleStorage
        return self._postgres.schedule_storage
