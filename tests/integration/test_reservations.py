"""The claim-to-run handover under load (issue #28): each defect it names, failing on the code before it.

1. A queued run's leases are reservations: they outlive a lease with no heartbeat from the sensor, the run
   adopts them when it starts, and a queued run whose reservations were all taken over is cancelled before
   the tick plans, so the tasks taken over share big runs instead of one run each.
2. A run that dies before starting a task does not mark it RUN_CRASHED or cap its next run; only the run's
   own leases are touched.
3. A run whose publish transaction holds its rows is never judged hung, even if its leases ran out meanwhile.
4. A claiming tick costs the same statements with 8 runs in flight as with 1.
6. Give-backs of never-started reservations are bounded: then DEAD RUN_NEVER_STARTED.
Plus: reservations whose run never appeared (the tick died) are ended after a grace period.
"""

from __future__ import annotations

import threading
import types
import uuid
from collections import Counter
from datetime import timedelta

import dagster as dg
import psycopg
from dagster import DagsterRunStatus

import pipelines.sensors as sensors
from pipelines.jobs import index_versions_job
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.dagster_resources import (
    OWNER_TAG,
    TENANT_TAG,
    BlobStoreResource,
    DatabaseResource,
    IndexingRunResource,
    lease_tags,
    leases_of,
    run_owner,
)
from resources.database import Session
from resources.task_queue import RunLeases


def tick(instance, db_url) -> dg.SensorResult | dg.SkipReason:
    """One claiming-sensor tick, with what the daemon does with its partition requests and run requests."""
    with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
        result = sensors.claim_index_tasks(ctx)
    if isinstance(result, dg.SkipReason):
        return result
    for request in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, list(request.partition_keys))
    return result


def store_run(instance, request: dg.RunRequest, status=DagsterRunStatus.NOT_STARTED) -> dg.DagsterRun:
    """The run the daemon creates for a request (NOT_STARTED: queued, waiting for a slot)."""
    tags = dict(request.tags)
    if request.partition_key:
        tags["dagster/partition"] = request.partition_key
    return instance.add_run(dg.DagsterRun(job_name=index_versions_job.name, run_id=str(uuid.uuid4()),
                                          status=status, tags=tags))


def task(db, task_id: int) -> dict:
    return db.fetch_one("task_get", {"task_id": task_id})


def expire(db_url: str, task_ids: list[int]) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET lease_until = now() - interval '1 second' WHERE task_id = ANY(%s)",
                     [task_ids])


# -- 1. reservations ------------------------------------------------------------------------------------


def test_a_reservation_outlives_a_lease_and_is_adopted_late_while_nobody_took_it(publish_task, make_queue, clock):
    queue = make_queue(lease_seconds=30.0, reservation_seconds=600.0)
    r = publish_task()
    (claimed,) = queue.claim("batch-a", limit=1, for_run=True)
    assert claimed.lease.lease_until == clock.now + timedelta(seconds=600)
    clock.advance(61)  # two leases' worth with no heartbeat: nothing to take over yet
    assert queue.claim("batch-b", limit=1, for_run=True) == []

    clock.advance(600)  # past the reservation too, but no claim ran since: the run still gets it
    (adopted,) = queue.adopt([claimed.lease], "run-late")
    assert (adopted.owner, adopted.attempt, adopted.lease_until) == ("run-late", 1, clock.now + timedelta(seconds=30))
    assert [e["kind"] for e in queue.events(r.task_id)][-1] == "run"


def test_a_reservation_taken_over_cannot_be_adopted(publish_task, make_queue, clock):
    queue = make_queue(lease_seconds=30.0, reservation_seconds=60.0)
    publish_task()
    (claimed,) = queue.claim("batch-a", limit=1, for_run=True)
    clock.advance(61)
    (again,) = queue.claim("batch-b", limit=1, for_run=True)
    assert again.lease.attempt == 2
    assert queue.adopt([claimed.lease], "run-late") == []


def test_a_queued_run_whose_reservations_were_taken_over_is_cancelled_and_its_tasks_share_one_run(
        db, db_url, publish_task, instance):
    tasks = [publish_task() for _ in range(6)]
    (request,) = tick(instance, db_url).run_requests
    queued = store_run(instance, request)  # waits behind the tenant's run limit
    assert sorted(t for t, _ in leases_of(request.tags)) == [t.task_id for t in tasks]
    expire(db_url, [t.task_id for t in tasks])  # it waited longer than its reservations

    result = tick(instance, db_url)  # the run queue is full: takeovers only

    assert instance.get_run_by_id(queued.run_id).status is DagsterRunStatus.CANCELED
    assert [len(leases_of(r.tags)) for r in result.run_requests] == [6]  # not six one-version runs
    for t in tasks:
        row = task(db, t.task_id)
        assert (row["attempts"], row["max_attempts"], row["reservation_givebacks"]) == (2, 6, 1)


def test_the_sensor_no_longer_heartbeats_queued_runs(db, db_url, publish_task, instance, monkeypatch):
    publish_task()
    (request,) = tick(instance, db_url).run_requests
    store_run(instance, request)
    statements = count_statements(monkeypatch)
    tick(instance, db_url)
    assert "task_heartbeat_many" not in statements and "task_fence_state" not in statements


def test_a_run_adopts_its_reservations_when_its_resources_are_set_up(db, db_url, publish_task, tmp_path):
    tasks = [publish_task() for _ in range(3)]
    queue = sensors.task_queue(DatabaseResource(url=db_url))
    claimed = queue.claim("batch-a", limit=3, for_run=True)
    run_id = str(uuid.uuid4())
    tags = {**lease_tags([(c.lease.task_id, c.lease.attempt) for c in claimed]), OWNER_TAG: "batch-a"}
    resource = IndexingRunResource(database=DatabaseResource(url=db_url), blobs=BlobStoreResource(url=str(tmp_path)),
                                   artifacts=str(tmp_path / "artifacts"))
    context = types.SimpleNamespace(dagster_run=types.SimpleNamespace(run_id=run_id, tags=tags), log=None)
    resource.setup_for_execution(context)  # no step has run yet
    try:
        assert {task(db, t.task_id)["lease_owner"] for t in tasks} == {run_owner(run_id)}
    finally:
        resource.teardown_after_execution(context)


# -- 2. crashed runs: only what the run started ----------------------------------------------------------


def test_a_run_that_died_before_starting_marks_nothing_run_crashed_and_caps_nothing(db, publish_task, make_queue):
    queue = make_queue()
    tasks = [publish_task() for _ in range(4)]
    claimed = queue.claim("batch-a", limit=4, for_run=True)

    outcomes = queue.fail_crashed_run([(c.lease.task_id, c.lease.attempt) for c in claimed], owner="batch-a",
                                      run_owner="run-x")

    assert all(o.given_back and o.status == "RETRY_WAIT" for o in outcomes) and len(outcomes) == 4
    for t in tasks:
        row = task(db, t.task_id)
        assert (row["error_code"], row["run_size_cap"], row["max_attempts"]) == (None, None, 6)
        assert "RUN_CRASHED" not in {e["error_code"] for e in queue.events(t.task_id)}


def test_only_the_tasks_a_run_started_are_suspects_of_its_crash(db, publish_task, make_queue):
    queue = make_queue()
    for _ in range(4):
        publish_task()
    claimed = queue.claim("batch-a", limit=4, for_run=True)
    started = queue.adopt([c.lease for c in claimed[:2]], "run-x")  # the run died after starting two

    outcomes = {o.task_id: o for o in queue.fail_crashed_run(
        [(c.lease.task_id, c.lease.attempt) for c in claimed], "RUN_CRASHED", "died", owner="batch-a",
        run_owner="run-x")}

    for lease in started:  # two suspects: bisected between them, attempt given back
        o = outcomes[lease.task_id]
        assert (o.given_back, o.run_size_cap) == (False, 1)
        assert task(db, lease.task_id)["error_code"] == "RUN_CRASHED"
    for c in claimed[2:]:
        assert outcomes[c.lease.task_id].given_back
        assert task(db, c.lease.task_id)["run_size_cap"] is None


def test_a_crash_report_leaves_a_task_another_run_took_over(db, publish_task, make_queue, clock):
    queue = make_queue(lease_seconds=30.0)
    publish_task()
    (claimed,) = queue.claim("batch-a", limit=1, for_run=True)
    (held,) = queue.adopt([claimed.lease], "run-x")
    with psycopg.connect(db.url, autocommit=True) as conn:  # another run holds the same attempt now
        conn.execute("UPDATE index_task SET lease_owner = 'run-y' WHERE task_id = %s", [held.task_id])
    assert queue.fail_crashed_run([(held.task_id, held.attempt)], owner="batch-a", run_owner="run-x") == []
    assert task(db, held.task_id)["status"] == "RUNNING"


# -- 3. a run in its publish is not hung -------------------------------------------------------------------


def test_a_run_whose_publish_holds_its_rows_is_not_released_even_past_its_leases(db, db_url, instance, publish_task,
                                                                                make_queue):
    # ``instance`` first: the pinned clock (under make_queue) is "a second ahead" of when it is made, and a Dagster
    # test instance can take longer than that to set up on a loaded machine (the task was then not yet due).
    queue = make_queue(lease_seconds=30.0)
    publish_task()
    (claimed,) = queue.claim("batch-a", limit=1, for_run=True)
    run_id = str(uuid.uuid4())
    (held,) = queue.adopt([claimed.lease], run_owner(run_id))
    runs = [RunLeases("batch-a", run_owner(run_id), [(held.task_id, held.attempt)], waiting=False)]
    expire(db_url, [held.task_id])  # the heartbeat skipped the row while the publish held it
    publish = psycopg.connect(db_url)
    try:
        publish.execute("SELECT 1 FROM index_task WHERE task_id = %s FOR UPDATE", [held.task_id])
        judged: list[list[int]] = []
        thread = threading.Thread(target=lambda: judged.append(queue.runs_to_release(runs)))
        thread.start()
        thread.join(10)
        assert judged == [[]], "judging a run must neither wait on its publish nor release it"
    finally:
        publish.rollback()
        publish.close()
    assert queue.runs_to_release(runs) == [0]  # the publish is over and the lease ran out: now it is lost


def test_a_run_whose_failed_task_was_retried_elsewhere_is_not_released_as_it_finishes(db, publish_task, make_queue,
                                                                                     clock):
    """Seen in a 200-version burst over a slow link: a run of 104 had 6 tasks fail (retryable) and be claimed
    again by later runs before it ended; with the rest SUCCEEDED it held none of its leases and "lost" six, and
    the claiming tick canceled it as it finished (shown CANCELED after succeeding). An attempt that ended with
    a transition of its own is finished, not lost. A lease taken over from the run is still lost."""
    queue = make_queue(lease_seconds=30.0)
    for _ in range(3):
        publish_task()
    claimed = queue.claim("batch-a", limit=3, for_run=True)
    done, failed, hung = queue.adopt([c.lease for c in claimed], "run-x")
    queue.complete(done, chunk_count=1)
    queue.fail(failed, "EMBEDDING_TIMEOUT", "the embedding request timed out")
    clock.advance(3600)  # past the retry's backoff and the hung lease
    again = {c.lease.task_id: c.lease.attempt for c in queue.claim("batch-b", limit=3, for_run=True)}
    assert again == {failed.task_id: failed.attempt + 1, hung.task_id: hung.attempt + 1}
    finishing = RunLeases("batch-a", "run-x", [(done.task_id, done.attempt), (failed.task_id, failed.attempt)],
                          waiting=False)
    hung_run = RunLeases("batch-a", "run-x", [(done.task_id, done.attempt), (hung.task_id, hung.attempt)],
                         waiting=False)
    assert queue.runs_to_release([finishing, hung_run]) == [1]


# -- 4. a tick's cost does not grow with the runs in flight -----------------------------------------------


def count_statements(monkeypatch) -> Counter:
    seen: Counter = Counter()
    original = Session._run

    def counting(self, name, params):
        seen[name] += 1
        return original(self, name, params)

    monkeypatch.setattr(Session, "_run", counting)
    return seen


def launched_runs(db, instance, n: int, leases_each: int, publish_task) -> None:
    """``n`` started runs, each holding ``leases_each`` leases it adopted (renewed by its own heartbeats)."""
    queue = sensors.task_queue(DatabaseResource(url=db.url))
    for _ in range(n):
        for _ in range(leases_each):
            publish_task()
        claimed = queue.claim(f"batch-{uuid.uuid4().hex[:6]}", limit=leases_each, for_run=True)
        run_id = str(uuid.uuid4())
        queue.adopt([c.lease for c in claimed], run_owner(run_id))
        tags = {**lease_tags([(c.lease.task_id, c.lease.attempt) for c in claimed]),
                OWNER_TAG: claimed[0].lease.owner, TENANT_TAG: "acme"}
        instance.add_run(dg.DagsterRun(job_name=index_versions_job.name, run_id=run_id,
                                       status=DagsterRunStatus.STARTED, tags=tags))


def tick_statements(instance, db_url, monkeypatch) -> Counter:
    with monkeypatch.context() as m:
        statements = count_statements(m)
        result = tick(instance, db_url)
    assert len(result.run_requests) == 1
    return statements


def test_a_tick_costs_the_same_statements_with_eight_runs_in_flight_as_with_one(db, db_url, publish_task, instance,
                                                                               monkeypatch, capsys):
    launched_runs(db, instance, 1, 40, publish_task)
    publish_task()  # something due, so the tick claims and plans
    one = tick_statements(instance, db_url, monkeypatch)
    launched_runs(db, instance, 7, 40, publish_task)
    publish_task()
    eight = tick_statements(instance, db_url, monkeypatch)

    with capsys.disabled():  # reported: what a tick costs kbindex's database
        print(f"\nclaiming tick, statements: 1 run x 40 leases in flight {sum(one.values())}, "
              f"8 runs x 40 leases {sum(eight.values())} ({dict(eight)})")
    assert eight == one
    assert "task_fence_state" not in eight and eight["lease_runs_to_release"] == 1


# -- 6. give-backs are bounded ---------------------------------------------------------------------------


def test_reservations_that_never_start_end_dead_after_the_giveback_limit(db, publish_task, make_queue, clock):
    queue = make_queue(lease_seconds=30.0, reservation_seconds=30.0, giveback_limit=3)
    r = publish_task()
    for tick_no in range(4):  # the first claim, then three takeovers that each give the attempt back
        (claimed,) = queue.claim(f"batch-{tick_no}", limit=1, for_run=True)
        assert claimed.lease.attempt == tick_no + 1
        clock.advance(31)  # its run never started
    assert queue.claim("batch-last", limit=1, for_run=True) == []
    row = task(db, r.task_id)
    assert (row["status"], row["error_code"], row["reservation_givebacks"]) == ("DEAD", "RUN_NEVER_STARTED", 3)
    assert "RUN_NEVER_STARTED" in queue.stats()["dead_by_code"]
    assert "retry the task" in row["error_message"]


def test_runs_that_keep_dying_before_starting_end_dead_after_the_giveback_limit(db, publish_task, make_queue):
    queue = make_queue(giveback_limit=2)
    r = publish_task()
    statuses = []
    for n in range(3):
        (claimed,) = queue.claim(f"batch-{n}", limit=1, for_run=True)
        (o,) = queue.fail_crashed_run([(claimed.lease.task_id, claimed.lease.attempt)], owner=f"batch-{n}",
                                      run_owner=f"run-{n}")
        statuses.append(o.status)
    assert statuses == ["RETRY_WAIT", "RETRY_WAIT", "DEAD"]
    assert task(db, r.task_id)["error_code"] == "RUN_NEVER_STARTED"


# -- orphaned reservations --------------------------------------------------------------------------------


def test_reservations_no_run_names_are_ended_after_the_grace_period(db, publish_task, make_queue, clock):
    queue = make_queue(lease_seconds=30.0, reservation_seconds=900.0)
    r = publish_task()
    (claimed,) = queue.claim("batch-died", limit=1, for_run=True)  # the tick died before storing its run
    clock.advance(30)
    assert queue.expire_orphaned_reservations(["batch-other"], grace_seconds=120) == 0  # too young
    clock.advance(100)
    assert queue.expire_orphaned_reservations(["batch-died"], grace_seconds=120) == 0  # its run exists
    assert queue.expire_orphaned_reservations(["batch-other"], grace_seconds=120) == 1

    (again,) = queue.claim("batch-next", limit=1, for_run=True)
    row = task(db, r.task_id)
    assert (again.lease.attempt, row["max_attempts"], row["reservation_givebacks"]) == (2, 6, 1)
