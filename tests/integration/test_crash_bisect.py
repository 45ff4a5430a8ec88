"""Issue #12, defect 7: retried versions keep their batching, and a poison document is bisected out.

A crashed run's versions come back as retries whose partition keys already exist earlier in the key
order; they must share runs with fresh versions, not get one run (one process start) each. A crash
of a run holding several tasks is nobody's fault yet: it costs none of them an attempt and halves
their next run, so a poison document ends DEAD alone while its batch-mates succeed.
"""

from __future__ import annotations

import json

import dagster as dg
import psycopg
from dagster import DagsterRunStatus

import pipelines.sensors as sensors
from pipelines.jobs import index_versions_job
from pipelines.partitions import VERSIONS_PARTITIONS_NAME, document_versions
from resources.dagster_resources import LEASES_TAG, OWNER_TAG, DatabaseResource, claim_owner_of, leases_of, run_owner
from resources.task_queue import TaskQueue


def row(db, task_id: int) -> dict:
    return db.fetch_one("task_get", {"task_id": task_id})


BY_A = {"owner": "batch-a", "run_owner": "batch-a"}  # leases a worker claimed and holds itself


def pairs(claimed) -> list[tuple[int, int]]:
    return [(t.lease.task_id, t.lease.attempt) for t in claimed]


# -- the crash path -------------------------------------------------------------------------------


def test_a_crash_shared_by_several_tasks_grants_an_attempt_and_halves_their_next_run(db, queue, publish_task):
    tasks = [publish_task() for _ in range(5)]
    claimed = queue.claim("batch-a", limit=10)
    queue.complete_many([claimed[0].lease])  # finished before the crash: not a suspect

    outcomes = queue.fail_crashed_run(pairs(claimed), "RUN_CRASHED", "the run process died", **BY_A)

    assert [o.task_id for o in outcomes] == [t.lease.task_id for t in claimed[1:]]
    for o in outcomes:
        assert (o.status, o.run_size_cap) == ("RETRY_WAIT", 2)  # 4 suspects -> next runs of at most 2
        r = row(db, o.task_id)
        assert (r["attempts"], r["max_attempts"]) == (1, 6)  # the attempt was given back
        last = queue.events(o.task_id)[-1]
        assert (last["to_status"], last["error_code"]) == ("RETRY_WAIT", "RUN_CRASHED")
        assert "one of 4 tasks" in last["message"]
    assert row(db, tasks[0].task_id)["status"] == "SUCCEEDED"


def test_a_crash_of_a_run_of_one_task_counts_against_it(db, queue, publish_task):
    task = publish_task()
    (claimed,) = queue.claim("batch-a", limit=1)

    (outcome,) = queue.fail_crashed_run(pairs([claimed]), **BY_A)

    assert (outcome.status, outcome.run_size_cap) == ("RETRY_WAIT", None)
    r = row(db, task.task_id)
    assert (r["attempts"], r["max_attempts"], r["run_size_cap"]) == (1, 5, None)


def test_a_crash_that_cannot_lower_the_cap_counts(db, queue, publish_task):
    """Termination: an attempt is given back only when the cap shrinks, at most log2(n) + 1 times."""
    for _ in range(2):
        publish_task()
    claimed = queue.claim("batch-a", limit=2)
    assert {o.run_size_cap for o in queue.fail_crashed_run(pairs(claimed), **BY_A)} == {1}
    again = queue.claim("batch-b", limit=2)  # a planner that ignored the cap: two tasks, cap 1

    outcomes = queue.fail_crashed_run(pairs(again), owner="batch-b", run_owner="batch-b")

    assert all(row(db, o.task_id)["max_attempts"] == 6 for o in outcomes)  # the first grant only


def test_a_poison_document_ends_dead_alone_after_bisection(db, queue, publish_task):
    """Runs planned by the sensor's planner; any run holding the poison document crashes."""
    tasks = [publish_task() for _ in range(16)]
    poison = tasks[5].task_id
    rounds = 0
    while claimed := queue.claim(f"batch-{rounds}", limit=100):
        rounds += 1
        assert rounds <= 16, "bisection must end"
        rows = db.fetch_all("run_plan_inputs", {"task_ids": [t.lease.task_id for t in claimed]})
        keys = {r["task_id"]: r["partition_key"] for r in rows}
        caps = {r["task_id"]: r["run_size_cap"] for r in rows}
        plan = sensors.plan_runs(claimed, keys, set(), claimed[0].lease.owner, 160, spread=2, batch_min=1, caps=caps)
        leases = {t.lease.task_id: t.lease for t in claimed}
        for request in plan.requests:
            run = [leases[task_id] for task_id, _ in leases_of(request.tags)]
            if any(lease.task_id == poison for lease in run):
                queue.fail_crashed_run([(lease.task_id, lease.attempt) for lease in run], owner=run[0].owner,
                                       run_owner=run[0].owner)
            else:
                queue.complete_many(run)

    dead = row(db, poison)
    assert (dead["status"], dead["error_code"], dead["attempts"]) == ("DEAD", "RUN_CRASHED", dead["max_attempts"])
    assert dead["max_attempts"] - 5 <= 4  # 16 -> 8 -> 4 -> 2 -> 1: at most four attempts given back
    others = [row(db, t.task_id) for t in tasks if t.task_id != poison]
    assert all(r["status"] == "SUCCEEDED" for r in others)
    assert all(r["attempts"] <= 5 for r in others)


def test_the_run_failure_sensor_bisects(db, db_url, publish_task):
    for _ in range(3):
        publish_task()
    queue = TaskQueue(db)
    claimed = queue.claim("batch-a", limit=3, for_run=True)
    queue.adopt([t.lease for t in claimed], run_owner("r" * 32))  # the run started them, then died
    with dg.instance_for_test() as instance:
        run = instance.add_run(dg.DagsterRun(
            job_name=index_versions_job.name, run_id="r" * 32, status=DagsterRunStatus.STARTED,
            tags={LEASES_TAG: json.dumps(pairs(claimed)), OWNER_TAG: "batch-a"}))
        event = instance.report_run_failed(run)
        with dg.build_run_status_sensor_context(
            sensor_name="record_crashed_runs", dagster_instance=instance, dagster_run=run, dagster_event=event,
            resources={"database": DatabaseResource(url=db_url)},
        ) as context:
            sensors.record_crashed_runs(context.for_run_failure())

    for t in claimed:
        r = row(db, t.lease.task_id)
        assert (r["status"], r["max_attempts"], r["run_size_cap"]) == ("RETRY_WAIT", 6, 1)


# -- the claiming sensor: a crashed batch comes back as a batch ----------------------------------------


def tick(instance, db_url) -> dg.SensorResult:
    """One claiming-sensor tick, with what the daemon does with its partition requests."""
    with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
        result = sensors.claim_index_tasks(ctx)
    for request in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, list(request.partition_keys))
    return result


def run_keys(instance, request: dg.RunRequest) -> list[str]:
    """The partition keys Dagster resolves the request to (as a step does, from the key order)."""
    if request.partition_key:
        return [request.partition_key]
    rng = dg.PartitionKeyRange(request.tags["dagster/asset_partition_range_start"],
                               request.tags["dagster/asset_partition_range_end"])
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        return list(document_versions.get_partition_keys_in_range(rng))


def test_after_a_30_version_run_loses_its_leases_the_next_tick_batches_them_again(db, db_url, publish_task, instance):
    first = [publish_task() for _ in range(30)]
    tick(instance, db_url)  # one or two runs of the 30; their process is then killed
    later = [publish_task() for _ in range(3)]
    tick(instance, db_url)  # keys of later versions now sit after the 30
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET lease_until = now() - interval '1 second'"
                     " WHERE task_id = ANY(%s)", [[t.task_id for t in first]])

    result = tick(instance, db_url)

    assert 1 <= len(result.run_requests) <= 2  # not 30 one-version runs
    held = set()
    for request in result.run_requests:
        leases = leases_of(request.tags)
        assert all(attempt == 2 for _, attempt in leases)
        rows = db.fetch_all("run_plan_inputs", {"task_ids": [t for t, _ in leases]})
        assert run_keys(instance, request) == [r["partition_key"] for r in rows]  # exactly its versions
        held |= {t for t, _ in leases}
    assert held == {t.task_id for t in first}
    assert len(instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME)) == len(first) + len(later)


def test_a_retried_key_that_a_live_run_covers_stays_put(db, db_url, publish_task, instance):
    tasks = [publish_task() for _ in range(3)]
    (request,) = tick(instance, db_url).run_requests
    instance.add_run(dg.DagsterRun(job_name=index_versions_job.name, run_id="l" * 32,
                                   status=DagsterRunStatus.STARTED, tags=dict(request.tags)))
    order = list(instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME))
    TaskQueue(db).fail_crashed_run([(tasks[0].task_id, 1)], owner=claim_owner_of(request.tags),
                                   run_owner=run_owner("l" * 32))  # one task of the live run is due again

    result = tick(instance, db_url)

    assert [r.partition_key for r in result.run_requests] == [order[0]]  # its own run, key not moved
    assert list(instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME)) == order


def test_no_key_moves_while_a_backfill_is_in_progress(db, db_url, publish_task, instance, monkeypatch):
    """A backfill's runs are key ranges resolved when each run executes: moving keys would bend them
    (bench.chaos --migration saw an inverted range skip 4 of 21 partitions)."""
    tasks = [publish_task() for _ in range(3)]
    tick(instance, db_url)
    publish_task()
    tick(instance, db_url)
    order = list(instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME))
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET lease_until = now() - interval '1 second' WHERE task_id = ANY(%s)",
                     [[t.task_id for t in tasks]])
    monkeypatch.setattr(sensors.dagster_private, "backfill_in_progress", lambda instance: True)

    result = tick(instance, db_url)

    assert len(result.run_requests) == 3  # each retried version in a run of its own, keys where they were
    assert list(instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME)) == order
