"""Integration fixtures: a publisher, a task factory, a pinnable clock, task-queue factories and a wait counter."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from resources.blob_store import BlobStore
from resources.publisher import Publisher, PublishResult
from resources.task_queue import TaskQueue


class PinnedClock:
    """A clock tests move by hand; the queue's statements use it instead of the database's now()."""

    def __init__(self, start: datetime | None = None) -> None:
        # A second ahead of the database so freshly published tasks are already due.
        self.now = start or datetime.now(UTC) + timedelta(seconds=1)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def pipeline_waits(monkeypatch) -> list[int]:
    """Counts the waits of pipelined transactions from the test's start: each time psycopg waits for results
    (``BasePipeline._fetch_gen``, its one fetch path in pipeline mode, COMMIT's wait at the end included). Over a
    link one round trip long each is a round trip, whatever the machine's load; ``count[0]`` is the total."""
    from psycopg import _pipeline

    count = [0]
    real = _pipeline.BasePipeline._fetch_gen

    def counted(self, *args, **kwargs):
        count[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(_pipeline.BasePipeline, "_fetch_gen", counted)
    return count


@pytest.fixture
def instance():
    """A throwaway Dagster instance, for sensor ticks and runs stored by hand."""
    import dagster as dg

    with dg.instance_for_test() as inst:
        yield inst


@pytest.fixture
def clock() -> PinnedClock:
    return PinnedClock()


@pytest.fixture
def publisher(db, tmp_path) -> Publisher:
    return Publisher(db, BlobStore(str(tmp_path / "blobs")))


@pytest.fixture
def publish_task(publisher: Publisher) -> Callable[..., PublishResult]:
    """Factory: publish a fresh document version (new bytes every call) and return its PublishResult."""
    counter = itertools.count(1)

    def make(tenant: str = "acme", document: str | None = None, data: bytes | None = None) -> PublishResult:
        n = next(counter)
        return publisher.publish(tenant, document or f"doc-{n}", data or f"body {n}".encode(), f"doc-{n}.txt")

    return make


@pytest.fixture
def make_queue(db, clock: PinnedClock) -> Callable[..., TaskQueue]:
    """Factory: a TaskQueue on the test database with the pinned clock (override any option)."""

    def make(**options) -> TaskQueue:
        options.setdefault("clock", clock)
        options.setdefault("lease_seconds", 30.0)
        return TaskQueue(db, **options)

    return make


@pytest.fixture
def queue(make_queue) -> TaskQueue:
    return make_queue()


@pytest.fixture
def cli(db_url, tmp_path):
    """Run ``kbindex ARGS...`` in process on the test database (a home and blob folder under tmp_path)."""
    from typer.testing import CliRunner

    from pipelines.cli import app

    runner = CliRunner()
    env = {"KBINDEX_DATABASE_URL": db_url, "KBINDEX_HOME": str(tmp_path / "home"),
           "KBINDEX_BLOB_URL": str(tmp_path / "blobs"), "COLUMNS": "200",
           "KBINDEX_FAST_PUBLISH": "0"}  # tests drive each task's publish; test_cli_metadata turns the fast path on

    def run(*args: str, **more_env: str):
        return runner.invoke(app, list(args), env={**env, **more_env})

    return run
