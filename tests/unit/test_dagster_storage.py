"""dagster.yaml's storage: DAGSTER_PG_URL when set, else the local databases, exported to Dagster's children."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from resources import dagster_storage
from resources.local_databases import LocalDatabases, psycopg2_url

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_a_configured_url_is_used_as_is_and_nothing_is_started(monkeypatch):
    monkeypatch.setenv("DAGSTER_PG_URL", "postgresql+psycopg2://u@h/dg")
    monkeypatch.setattr(dagster_storage, "prepare_local_databases", lambda: pytest.fail("started PostgreSQL"))
    assert dagster_storage.resolve_dagster_url() == "postgresql+psycopg2://u@h/dg"


def test_without_one_the_local_databases_are_prepared_and_exported_to_child_processes(monkeypatch, tmp_path):
    for name in ("DAGSTER_PG_URL", "KBINDEX_DATABASE_URL"):
        # setenv first: delenv of an unset name records nothing, and the URLs this test makes the code
        # export would leak into later tests (bench rounds then used host=/s as their external server).
        monkeypatch.setenv(name, "unset-by-this-test")
        monkeypatch.delenv(name)
    monkeypatch.setenv("KBINDEX_HOME", str(tmp_path))
    local = LocalDatabases(kbindex_url="postgresql://pg@/kbindex?host=/s", dagster_url="postgresql+psycopg2://pg@/dagster?host=/s")
    monkeypatch.setattr(dagster_storage, "prepare_local_databases", lambda: local)

    assert dagster_storage.resolve_dagster_url() == local.dagster_url
    assert os.environ["DAGSTER_PG_URL"] == local.dagster_url
    assert os.environ["KBINDEX_DATABASE_URL"] == local.kbindex_url


def test_the_project_dagster_yaml_names_this_storage():
    config = yaml.safe_load((PROJECT_ROOT / "dagster.yaml").read_text())
    custom = config["storage"]["custom"]
    assert (custom["module"], custom["class"]) == ("resources.dagster_storage", "KbindexDagsterStorage")


def test_psycopg2_url_names_the_driver_and_drops_an_empty_password():
    assert psycopg2_url("postgresql://pg:@/kbindex?host=/s") == "postgresql+psycopg2://pg@/kbindex?host=/s"


@pytest.mark.parametrize("argv,expected", [
    (["/v/dagster/_daemon/__main__.py", "run", "--log-level", "info"], "daemon"),
    (["/v/dagster/__main__.py", "api", "grpc", "--lazy-load-user-code"], "code-server"),
    (["/v/dagster/__main__.py", "api", "execute_run", "{}"], "run"),
    (["/v/dagster_webserver/__main__.py", "--port", "3000"], "webserver"),
    (["/w/pipelines/warm_launcher.py", "/tmp/fork.sock"], "fork-server"),
    (["pytest"], "other"),
    # a test file named after the launcher is no fork server: that one never creates Dagster's tables
    (["/v/pytest/__main__.py", "-q", "tests/acceptance/test_warm_launcher.py"], "other"),
])
def test_storage_connections_say_which_dagster_process_opened_them(monkeypatch, argv, expected):
    from resources import dagster_storage

    monkeypatch.delenv(dagster_storage.PROCESS_NAME_ENV, raising=False)
    monkeypatch.setattr("sys.argv", argv)
    assert dagster_storage.process_name() == f"kbindex-dagster-{expected}"
    monkeypatch.setenv(dagster_storage.PROCESS_NAME_ENV, "run")  # the warm launcher's run children
    assert dagster_storage.process_name() == "kbindex-dagster-run"
