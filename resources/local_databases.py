"""The databases local use needs, ready: kbindex's (migrated) and Dagster's storage next to it.

``kbindex dev`` and the Dagster storage's no-set-up default (resources/dagster_storage.py) share this,
so both paths end up on the same server and databases. No Dagster import here: the CLI loads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

DAGSTER_DATABASE = "dagster"


def psycopg2_url(url: str) -> str:
    """Dagster's storage needs an explicit psycopg2 URL (SQLAlchemy 2.1 maps postgresql:// to psycopg 3)."""
    scheme, sep, rest = url.partition("://")
    return "postgresql+psycopg2://" + rest.replace(":@", "@", 1) if sep else url


@dataclass(frozen=True)
class LocalDatabases:
    kbindex_url: str
    """The kbindex database (migrated)."""
    dagster_url: str
    """Dagster's storage database on the same server, as a psycopg2 URL."""


def prepare_local_databases(*, on_apply: Callable[[str], None] | None = None) -> LocalDatabases:
    """The kbindex database (KBINDEX_DATABASE_URL, else the embedded server under KBINDEX_HOME, started
    on demand), migrated, and a ``dagster`` database next to it (DAGSTER_PG_URL wins if set)."""
    from resources import local_postgres
    from resources.migrations import migrate
    from resources.settings import resolve_database_url

    url = resolve_database_url()
    migrate(url, on_apply=on_apply)
    dagster_url = os.environ.get("DAGSTER_PG_URL")
    if not dagster_url:
        local_postgres.ensure_database(local_postgres.with_database(url, "postgres"), DAGSTER_DATABASE)
        dagster_url = psycopg2_url(local_postgres.with_database(url, DAGSTER_DATABASE))
    return LocalDatabases(kbindex_url=url, dagster_url=dagster_url)
