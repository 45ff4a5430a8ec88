"""The claiming sensor keeps the leases of runs that wait for a run slot, and only those.

A run queued behind the per-tenant run limit can wait longer than a lease; without the sensor's
heartbeat its leases would expire before it starts and every version would be taken over one
run each. The heartbeat must stay fenced: a lease already taken over is never taken back, a run
already launched keeps its own leases, and a run stuck in the queue too long is let go.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import dagster as dg
import psycopg
import pytest
from dagster import DagsterRunStatus

import pipelines.sensors as sensors
from pipelines.jobs import index_versions_job
from resources.dagster_resources import LEASES_TAG, OWNER_TAG, DatabaseResource, encode_leases
from resources.task_queue import TaskQueue


def lease_until(db, task_id: int) -> datetime:
    return db.fetch_one("task_get", {"task_id": task_id})["lease_until"]


def queued_run(instance: dg.DagsterInstance, owner: str, claimed, status=DagsterRunStatus.NOT_STARTED) -> dg.DagsterRun:
    """A run of the indexing job that holds these leases and waits for a slot (NOT_STARTED, as the sensor's
    requested runs are stored before the queue takes them; QUEUED needs a code origin to construct)."""
    pairs = [(t.lease.task_id, t.lease.attempt) for t in claimed]
    tags = {LEASES_TAG: encode_leases(pairs), OWNER_TAG: owner}
    return instance.add_run(dg.DagsterRun(job_name=index_versions_job.name, run_id=str(uuid.uuid4()), status=status, tags=tags))


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def test_a_queued_runs_leases_are_extended_and_counted(db, publish_task, instance):
    tasks = [publish_task() for _ in range(3)]
    claimed = TaskQueue(db, lease_seconds=5).claim("batch-a", limit=3)
    assert {t.lease.task_id for t in claimed} == {t.task_id for t in tasks}
    before = {t.lease.task_id: lease_until(db, t.lease.task_id) for t in claimed}
    queued_run(instance, "batch-a", claimed)

    waiting = sensors.keep_waiting_leases(instance, TaskQueue(db, lease_seconds=600))

    assert waiting == 1
    for task_id, until in before.items():
        assert (lease_until(db, task_id) - until).total_seconds() > 500  # 5 s lease -> 600 s lease


def test_a_taken_over_lease_stays_with_its_new_owner(db, publish_task, instance):
    task = publish_task()
    (first,) = TaskQueue(db, lease_seconds=5).claim("batch-a", limit=1)
    queued_run(instance, "batch-a", [first])
    with psycopg.connect(db.url, autocommit=True) as conn:  # the lease expired; another claimer takes the task over
        conn.execute("UPDATE index_task SET lease_until = now() - interval '1 second' WHERE task_id = %s", [task.task_id])
    (second,) = TaskQueue(db, lease_seconds=5).claim("batch-b", limit=1)
    assert second.lease.attempt == first.lease.attempt + 1
    owner_until = lease_until(db, task.task_id)

    sensors.keep_waiting_leases(instance, TaskQueue(db, lease_seconds=600))

    row = db.fetch_one("task_get", {"task_id": task.task_id})
    assert (row["lease_owner"], row["attempts"]) == ("batch-b", second.lease.attempt)
    assert row["lease_until"] == owner_until


@pytest.mark.parametrize("status", [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED])
def test_a_launched_run_that_has_not_adopted_yet_keeps_its_leases_alive(db, publish_task, instance, status):
    """A run process still starting (imports, model load) may outlast a short lease before it adopts:
    the sensor keeps its unadopted leases alive until it does (seen: runs canceled as hung under load)."""
    publish_task()
    (claimed,) = TaskQueue(db, lease_seconds=5).claim("batch-a", limit=1, for_run=True)
    queued_run(instance, "batch-a", [claimed], status=status)
    before = lease_until(db, claimed.lease.task_id)

    waiting = sensors.keep_waiting_leases(instance, TaskQueue(db, lease_seconds=600))

    assert (lease_until(db, claimed.lease.task_id) - before).total_seconds() > 500
    assert waiting == (1 if status is DagsterRunStatus.STARTING else 0)


def test_a_run_that_adopted_its_leases_heartbeats_them_itself(db, publish_task, instance):
    publish_task()
    queue = TaskQueue(db, lease_seconds=5)
    (claimed,) = queue.claim("batch-a", limit=1, for_run=True)
    queued_run(instance, "batch-a", [claimed], status=DagsterRunStatus.STARTED)
    (adopted,) = queue.adopt([claimed.lease], "run-x")

    sensors.keep_waiting_leases(instance, TaskQueue(db, lease_seconds=600))

    row = db.fetch_one("task_get", {"task_id": claimed.lease.task_id})
    assert (row["lease_owner"], row["lease_until"]) == ("run-x", adopted.lease_until)


def test_a_run_queued_too_long_is_let_go(db, publish_task, instance, monkeypatch):
    publish_task()
    (claimed,) = TaskQueue(db, lease_seconds=5).claim("batch-a", limit=1)
    queued_run(instance, "batch-a", [claimed])
    before = lease_until(db, claimed.lease.task_id)
    monkeypatch.setattr(sensors, "WAITING_LEASE_MAX_SECONDS", -1.0)

    sensors.keep_waiting_leases(instance, TaskQueue(db, lease_seconds=600))

    assert lease_until(db, claimed.lease.task_id) == before


def test_a_sensor_tick_with_the_run_queue_full_keeps_the_leases_and_starts_nothing_new(db, db_url, publish_task, instance):
    publish_task()
    (claimed,) = TaskQueue(db, lease_seconds=5).claim("batch-a", limit=1)
    queued_run(instance, "batch-a", [claimed])
    fresh = publish_task()
    before = lease_until(db, claimed.lease.task_id)

    with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
        result = sensors.claim_index_tasks(ctx)

    assert isinstance(result, dg.SkipReason) and "waiting" in (result.skip_message or "")
    assert lease_until(db, claimed.lease.task_id) > before
    assert db.fetch_one("task_get", {"task_id": fresh.task_id})["status"] == "PENDING"
