"""Fixtures for Dagster tests: a Dagster instance on the same PostgreSQL, and the fake-model profile."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def with_database(url: str, database: str) -> str:
    base, _, query = url.partition("?")
    return base.rpartition("/")[0] + f"/{database}" + (f"?{query}" if query else "")


@pytest.fixture
def fake_profile(db_url):
    """Make the active profile use the deterministic fake embedder (fast; real tokenizer still chunks)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    return "minilm-v1"


@pytest.fixture
def dagster_pg_url(pg_server_url, db_url):
    """A fresh database for Dagster's run/event storage (psycopg2 URL, as dagster-postgres needs)."""
    name = "dg_" + db_url.partition("?")[0].rpartition("/")[2]
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    from pipelines.cli.dev_command import psycopg2_url

    yield psycopg2_url(with_database(pg_server_url, name))
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


@pytest.fixture
def kb_env(tmp_path, db_url, monkeypatch):
    """Environment that points kbindex resources at this test's database and folders."""
    env = {
        "KBINDEX_DATABASE_URL": db_url,
        "KBINDEX_HOME": str(tmp_path / "home"),
        "KBINDEX_BLOB_URL": str(tmp_path / "blobs"),
        "KBINDEX_ARTIFACTS": str(tmp_path / "artifacts"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env
