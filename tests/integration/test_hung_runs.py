"""Issue #12, defect 8: a run that lost every lease gives its run slot back.

A run process that hangs (SIGSTOP) stops heartbeating; its leases expire and are taken over, but
Dagster still counts the run as STARTED, so due work waits behind the per-tenant run limit. The
claiming sensor's tick cancels such runs (and kills a stopped run process it can reach); a run that
still holds a lease, or finished its tasks itself, is left alone.
"""

from __future__ import annotations

import signal
import subprocess
import uuid

import dagster as dg
import psycopg
from dagster import DagsterRunStatus
from dagster._core.events import EngineEventData

import pipelines.sensors as sensors
from pipelines.jobs import index_versions_job
from resources.dagster_resources import LEASES_TAG, OWNER_TAG, TENANT_TAG, DatabaseResource, encode_leases, run_owner, leases_of
from resources.task_queue import TaskQueue

SLOT_STATUSES = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def started_run(instance, owner: str, claimed, job: str = index_versions_job.name) -> dg.DagsterRun:
    tags = {LEASES_TAG: encode_leases([(t.lease.task_id, t.lease.attempt) for t in claimed]),
            OWNER_TAG: owner, TENANT_TAG: "acme"}
    return instance.add_run(dg.DagsterRun(job_name=job, run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED,
                                          tags=tags))


def release(instance, queue) -> list[str]:
    """What the claiming tick does before planning: cancel the runs that can do nothing useful any more."""
    return sensors.release_runs(instance, queue, sensors.leased_runs(instance))


def expire(db_url: str, task_ids: list[int]) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET lease_until = now() - interval '1 second' WHERE task_id = ANY(%s)",
                     [task_ids])


def slots_taken(instance) -> int:
    """Runs of tenant acme the queued run coordinator counts against the tenant's run limit."""
    return len(instance.get_run_records(dg.RunsFilter(statuses=SLOT_STATUSES, tags={TENANT_TAG: "acme"})))


def status(instance, run) -> DagsterRunStatus:
    return instance.get_run_by_id(run.run_id).status


def test_a_run_whose_leases_were_taken_over_is_canceled_and_a_live_one_is_left_alone(db, db_url, publish_task, instance):
    for _ in range(3):
        publish_task()
    queue = TaskQueue(db, lease_seconds=60)
    hung_claim = queue.claim("batch-hung", limit=2)
    live_claim = queue.claim("batch-live", limit=1)
    hung, live = started_run(instance, "batch-hung", hung_claim), started_run(instance, "batch-live", live_claim)
    expire(db_url, [t.lease.task_id for t in hung_claim])
    queue.claim("batch-thief", limit=10)  # taken over
    assert slots_taken(instance) == 2

    released = release(instance, queue)

    assert released == [hung.run_id]
    assert status(instance, hung) is DagsterRunStatus.CANCELED
    assert status(instance, live) is DagsterRunStatus.STARTED
    assert slots_taken(instance) == 1  # the slot came back


def test_a_run_that_stopped_heartbeating_is_canceled_before_its_leases_are_even_taken_over(db, db_url, publish_task,
                                                                                          instance):
    publish_task()
    queue = TaskQueue(db, lease_seconds=60)
    claimed = queue.claim("batch-hung", limit=1)
    hung = started_run(instance, "batch-hung", claimed, job="__ASSET_JOB")
    expire(db_url, [claimed[0].lease.task_id])

    assert release(instance, queue) == [hung.run_id]
    assert status(instance, hung) is DagsterRunStatus.CANCELED


def test_a_run_that_finished_its_own_tasks_is_not_canceled(db, publish_task, instance):
    for _ in range(2):
        publish_task()
    queue = TaskQueue(db, lease_seconds=60)
    claimed = queue.claim("batch-done", limit=2)
    queue.complete_many([t.lease for t in claimed])
    done = started_run(instance, "batch-done", claimed)  # between its last publish and its exit

    assert release(instance, queue) == []
    assert status(instance, done) is DagsterRunStatus.STARTED


def test_a_stopped_run_process_of_this_process_is_killed(db, db_url, publish_task, instance):
    publish_task()
    queue = TaskQueue(db, lease_seconds=60)
    claimed = queue.claim("batch-hung", limit=1)
    hung = started_run(instance, "batch-hung", claimed)
    process = subprocess.Popen(["sleep", "300"])
    try:
        process.send_signal(signal.SIGSTOP)
        instance.report_engine_event(f"Started process for run (pid: {process.pid}).", hung,
                                     EngineEventData.in_process(process.pid))
        expire(db_url, [claimed[0].lease.task_id])

        release(instance, queue)

        assert process.wait(timeout=10) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_claiming_tick_frees_the_slot_and_claims_the_due_work(db, db_url, publish_task, instance):
    publish_task()
    claimed = TaskQueue(db, lease_seconds=60).claim("batch-hung", limit=1)
    hung = started_run(instance, "batch-hung", claimed)
    expire(db_url, [claimed[0].lease.task_id])
    fresh = publish_task()

    with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
        result = sensors.claim_index_tasks(ctx)

    assert status(instance, hung) is DagsterRunStatus.CANCELED
    assert slots_taken(instance) == 0
    held = {task_id for r in result.run_requests for task_id, _ in leases_of(r.tags)}
    assert held == {claimed[0].lease.task_id, fresh.task_id}  # taken over, and the due work started


def test_a_run_holding_leases_it_adopted_is_left_alone(db, db_url, publish_task, instance):
    """Once started, a run owns its leases under its own name (``run_owner``), not the claim's."""
    publish_task()
    queue = TaskQueue(db, lease_seconds=60)
    claimed = queue.claim("batch-a", limit=1)
    run = started_run(instance, "batch-a", claimed)
    with psycopg.connect(db_url, autocommit=True) as conn:  # the run adopted the lease
        conn.execute("UPDATE index_task SET lease_owner = %s WHERE task_id = %s",
                     [run_owner(run.run_id), claimed[0].lease.task_id])

    assert release(instance, queue) == []
    expire(db_url, [claimed[0].lease.task_id])  # then it stopped heartbeating
    assert release(instance, queue) == [run.run_id]
