"""Benchmarks (not installed; run from the checkout with python -m bench.<name>)."""

from collections.abc import Iterator
from contextlib import contextmanager

from resources.local_postgres import temporary_server


@contextmanager
def server_url() -> Iterator[str]:
    """KBINDEX_DATABASE_URL (an admin URL), or a throwaway embedded PostgreSQL under a temporary folder."""
    with temporary_server("kbindex-bench-pg-", external_env="KBINDEX_DATABASE_URL") as url:
        yield url


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``sys.exit(143)`` in the main thread, so a bench stopped with ``kill`` still runs its
    ``finally`` blocks: it stops the ``dagster dev`` it started (its own session, so the signal does not reach
    it) and drops its scratch PostgreSQL. Killed without this, a bench left both running, idle but spending
    ~0.2 core-s a second, under every later measurement on the machine."""
    import signal
    import sys
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def share_built_models() -> None:
    """Build derived models (the default profile's int8) once, in your KBINDEX_HOME's models folder, for
    the bench's scratch homes, its embedding service and its bare-encode processes alike (unless
    KBINDEX_MODELS_DIR already names a folder): not once per bench, on the clock."""
    import os

    from resources.settings import Settings

    os.environ.setdefault("KBINDEX_MODELS_DIR", str(Settings.from_env().home / "models"))


def fresh_fake_model_databases(admin_url: str, kb: str, dagster: str, workdir, tag: str) -> tuple[str, str]:
    """(Re)create a kbindex database ``kb`` (migrated, its active profile on the fake model) and a Dagster
    database ``dagster`` on the server at ``admin_url``; point KBINDEX_* at the first and at folders under
    ``workdir`` named by ``tag``. Returns the kbindex URL and the Dagster storage's psycopg2 URL."""
    import os

    import psycopg
    from psycopg import sql as pgsql

    from pipelines.cli.dev_command import psycopg2_url
    from resources.local_postgres import with_database
    from resources.migrations import migrate
    from sql import queries

    with psycopg.connect(admin_url, autocommit=True) as conn:
        for name in (kb, dagster):
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    kb_url = with_database(admin_url, kb)
    migrate(kb_url)
    with psycopg.connect(kb_url, autocommit=True) as conn:
        conn.execute(queries["bench_set_active_model"], {"model": "fake-384"})
    os.environ.update(KBINDEX_DATABASE_URL=kb_url, KBINDEX_BLOB_URL=str(workdir / f"blobs-{tag}"),
                      KBINDEX_ARTIFACTS=str(workdir / f"artifacts-{tag}"), KBINDEX_HOME=str(workdir / "home"))
    return kb_url, psycopg2_url(with_database(admin_url, dagster))
