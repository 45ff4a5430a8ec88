"""Model migrations at any size (issue #14): the claiming sensor builds a requested profile's backlog in
bounded runs with the capacity live indexing leaves free; live work always goes first. And the Dagster
partition keys stay bounded: keys of finished versions past the lineage window are pruned, while the
versions' Dagster run ids stay reachable from their history."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import dagster as dg

from pipelines import sensors
from pipelines.lineage_job import backfill_profile_job, prune_lineage_keys_job, prune_lineage_keys_when_due
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.dagster_resources import DatabaseResource, leases_of
from resources.partition_keys import prunable
from resources.profiles import create_profile, request_backfill
from resources.task_queue import TaskQueue


def tick(instance, db_url) -> dg.SensorResult:
    with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
        result = sensors.claim_index_tasks(ctx)
    for request in getattr(result, "dynamic_partitions_requests", None) or []:
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, list(request.partition_keys))
    return result


def claimed_task_ids(result) -> list[int]:
    return [t for r in getattr(result, "run_requests", None) or [] for t, _ in leases_of(r.tags)]


def types(db, task_ids) -> list[str]:
    return [db.fetch_one("task_get", {"task_id": t})["task_type"] for t in task_ids]


def finish(db, task_ids) -> None:
    """Mark tasks SUCCEEDED as a run would have (the publish path itself is tested elsewhere)."""
    import psycopg

    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET status = 'SUCCEEDED', lease_owner = NULL, lease_until = NULL,"
                     " finished_at = now() WHERE task_id = ANY(%s)", [list(task_ids)])


def test_a_requested_backfill_fills_the_capacity_live_work_leaves(db, db_url, publish_task, instance, monkeypatch):
    monkeypatch.setattr(sensors, "BATCH_MAX", 4)
    monkeypatch.setattr(sensors, "RUN_SPREAD", 1)
    monkeypatch.setattr(sensors, "MAX_WAITING_RUNS", 100)
    old = [publish_task() for _ in range(6)]
    finish(db, [r.task_id for r in old])
    create_profile(db, "shadow-c64", model="fake-384", chunk_tokens=64, overlap=8)

    assert claimed_task_ids(tick(instance, db_url)) == []  # a backlog nobody asked to build stays put
    assert request_backfill(db, "shadow-c64")["backlog"] == 6
    live = [publish_task() for _ in range(2)]  # each: INDEX tasks under the active and the building profile
    live_ids = {t["task_id"] for t in TaskQueue(db).list(limit=1000) if t["task_type"] == "INDEX"
                and t["status"] == "PENDING"}
    assert len(live_ids) == 4 and {t.task_id for t in live} <= live_ids

    first = claimed_task_ids(tick(instance, db_url))
    assert set(first) == live_ids  # live work first: the tick's whole capacity
    second = claimed_task_ids(tick(instance, db_url))
    third = claimed_task_ids(tick(instance, db_url))
    assert (types(db, second), types(db, third)) == (["REINDEX"] * 4, ["REINDEX"] * 2)  # then the backlog
    assert claimed_task_ids(tick(instance, db_url)) == []
    reindex = {t["task_id"] for t in TaskQueue(db).list(limit=1000) if t["task_type"] == "REINDEX"}
    assert reindex == set(second) | set(third)


def test_a_backfill_tick_fills_every_run_slot_when_nothing_is_due(db, db_url, publish_task, instance, monkeypatch):
    """With no live work the tick's whole capacity (BATCH_MAX per slot) goes to the backlog, not just the room
    it keeps for lease takeovers of unknown size (bench.scale.migration ran at 0.53-0.70 of plain indexing
    while each tick claimed half of that)."""
    monkeypatch.setattr(sensors, "BATCH_MAX", 4)
    monkeypatch.setattr(sensors, "BATCH_UNSIZED", 2)
    monkeypatch.setattr(sensors, "RUN_SPREAD", 2)
    monkeypatch.setattr(sensors, "BATCH_MIN", 1)
    monkeypatch.setattr(sensors, "MAX_WAITING_RUNS", 100)
    finish(db, [publish_task().task_id for _ in range(10)])
    create_profile(db, "shadow-slots", model="fake-384", chunk_tokens=64, overlap=8)
    request_backfill(db, "shadow-slots")
    first = tick(instance, db_url)
    assert [len(leases_of(r.tags)) for r in first.run_requests] == [4, 4]  # two full runs (it was one run of 4)
    assert len(claimed_task_ids(tick(instance, db_url))) == 2  # the rest of the backlog


def test_the_ui_job_requests_the_backfill(db, db_url, publish_task, instance):
    finish(db, [publish_task().task_id])
    create_profile(db, "shadow-c64", model="fake-384", chunk_tokens=64, overlap=8)
    result = backfill_profile_job.execute_in_process(
        run_config={"ops": {"request_profile_backfill": {"config": {"profile": "shadow-c64"}}}},
        resources={"database": DatabaseResource(url=db_url)}, instance=instance)
    assert result.success
    (reindex,) = [t["task_id"] for t in TaskQueue(db).list() if t["task_type"] == "REINDEX"]
    assert claimed_task_ids(tick(instance, db_url)) == [reindex]  # the sensor now builds it
    bad = backfill_profile_job.execute_in_process(
        run_config={"ops": {"request_profile_backfill": {"config": {"profile": "minilm-v1"}}}},
        resources={"database": DatabaseResource(url=db_url)}, instance=instance, raise_on_error=False)
    assert not bad.success  # the active profile is not being built: a clear refusal


def test_finished_versions_lose_their_partition_key_after_the_window(db, db_url, publish_task, instance):
    done, busy = publish_task(), publish_task()
    result = tick(instance, db_url)
    assert sorted(claimed_task_ids(result)) == sorted([done.task_id, busy.task_id])
    finish(db, [done.task_id])
    assert prunable(db, window_seconds=3600) == []  # inside the lineage window
    keys = {r["task_id"]: r["partition_key"] for r in db.fetch_all(
        "document_version_partition_keys", {"task_ids": [done.task_id, busy.task_id]})}
    assert prunable(db, window_seconds=0) == [keys[done.task_id]]  # the busy version keeps its key
    out = prune_lineage_keys_job.execute_in_process(
        run_config={"ops": {"prune_partition_keys": {"config": {"window_seconds": 0}}}},
        resources={"database": DatabaseResource(url=db_url)}, instance=instance)
    assert out.success
    assert instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME) == [keys[busy.task_id]]
    assert prunable(db, window_seconds=0) == []


def test_the_prune_sensor_starts_a_run_only_when_a_key_is_due_and_no_prune_run_is_in_flight(db, db_url, publish_task,
                                                                                             instance):
    import psycopg

    def evaluate():
        with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
            return prune_lineage_keys_when_due(ctx)

    assert isinstance(evaluate(), dg.SkipReason)  # no key at all
    done = publish_task()
    assert claimed_task_ids(tick(instance, db_url)) == [done.task_id]
    assert isinstance(evaluate(), dg.SkipReason)  # in flight
    finish(db, [done.task_id])
    assert isinstance(evaluate(), dg.SkipReason)  # finished, inside the 7-day window
    with psycopg.connect(db_url, autocommit=True) as conn:  # eight days later
        conn.execute("UPDATE dagster_partition_key SET added_at = added_at - interval '8 days'")
    assert isinstance(evaluate(), dg.RunRequest)
    running = instance.add_run(dg.DagsterRun(job_name=prune_lineage_keys_job.name,
                                             status=dg.DagsterRunStatus.STARTED))
    skipped = evaluate()
    assert isinstance(skipped, dg.SkipReason) and "in flight" in skipped.skip_message  # one prune at a time
    instance.delete_run(running.run_id)
    assert prune_lineage_keys_job.execute_in_process(resources={"database": DatabaseResource(url=db_url)},
                                                     instance=instance).success  # the run it requests: defaults
    assert instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME) == []
    assert isinstance(evaluate(), dg.SkipReason)  # nothing left to prune
    week_ago = datetime.now(timezone.utc) - timedelta(days=8)
    instance.run_storage.add_historical_run(dg.DagsterRun(job_name="apply_retention",
                                                          status=dg.DagsterRunStatus.SUCCESS), week_ago)
    assert isinstance(evaluate(), dg.RunRequest)  # a maintenance run older than the window is due too


def test_a_tick_claims_by_bytes_and_leaves_the_rest_due(db, db_url, publish_task, instance, monkeypatch):
    """Runs are sized by their documents' bytes (issue #14, small documents): the tick claims the due
    versions that fill its run slots' byte budget, at least BATCH_MIN per slot, and the rest stay due."""
    monkeypatch.setattr(sensors, "RUN_SPREAD", 2)
    monkeypatch.setattr(sensors, "BATCH_MIN", 3)
    monkeypatch.setattr(sensors, "RUN_BYTES", 2_000)
    monkeypatch.setattr(sensors, "VERSION_BYTES", 0)  # bytes alone here; the fixed cost: the test below
    for i in range(40):
        publish_task(data=f"Document {i:03d} ".encode() * 20)  # 260 bytes each
    first = tick(instance, db_url)
    assert len(claimed_task_ids(first)) == 15  # 2 runs x 2,000 bytes fit 15 of them
    assert [len(leases_of(r.tags)) for r in first.run_requests] == [8, 7]
    monkeypatch.setattr(sensors, "RUN_BYTES", 10)  # each is bigger than a run's budget: the floor holds
    assert len(claimed_task_ids(tick(instance, db_url))) == 6
    monkeypatch.setattr(sensors, "RUN_BYTES", 1_000_000)  # everything left fits
    assert len(claimed_task_ids(tick(instance, db_url))) == 19


def test_a_tick_weighs_each_version_its_fixed_cost_besides_its_bytes(db, db_url, publish_task, instance,
                                                                     monkeypatch):
    """Issue #34: a version weighs its bytes plus VERSION_BYTES, in the claim and in the runs' sizes alike."""
    monkeypatch.setattr(sensors, "RUN_SPREAD", 2)
    monkeypatch.setattr(sensors, "BATCH_MIN", 3)
    monkeypatch.setattr(sensors, "RUN_BYTES", 2_000)
    monkeypatch.setattr(sensors, "VERSION_BYTES", 100)
    for i in range(40):
        publish_task(data=f"Document {i:03d} ".encode() * 20)  # 260 bytes each, 360 with the fixed cost
    first = tick(instance, db_url)
    assert len(claimed_task_ids(first)) == 11  # 2 runs x 2,000 fit 11 (15 by bytes alone)
    assert [len(leases_of(r.tags)) for r in first.run_requests] == [6, 5]


def test_a_backfill_claim_is_sized_by_bytes_too(db, db_url, publish_task, instance, monkeypatch):
    monkeypatch.setattr(sensors, "RUN_SPREAD", 1)
    monkeypatch.setattr(sensors, "BATCH_MIN", 2)
    monkeypatch.setattr(sensors, "MAX_WAITING_RUNS", 100)
    monkeypatch.setattr(sensors, "RUN_BYTES", 1_000)
    monkeypatch.setattr(sensors, "VERSION_BYTES", 0)
    finish(db, [publish_task(data=f"Document {i:03d} ".encode() * 20).task_id for i in range(12)])  # 260 B each
    create_profile(db, "shadow-bytes", model="fake-384", chunk_tokens=64, overlap=8)
    request_backfill(db, "shadow-bytes")
    assert [len(claimed_task_ids(tick(instance, db_url))) for _ in range(4)] == [3, 3, 3, 3]  # 1,000 B: 3 a tick
    assert claimed_task_ids(tick(instance, db_url)) == []  # the backlog is done


def test_keys_beyond_the_newest_max_keys_are_pruned_inside_the_window(db, db_url, publish_task):
    """Heavy churn cannot grow the live key set past the cap: the oldest finished keys go first, while a
    version in flight keeps its key whatever its age."""
    import psycopg

    from resources.partition_keys import record_added

    done = [publish_task() for _ in range(4)]
    busy = publish_task()
    finish(db, [r.task_id for r in done])
    keys = {r["task_id"]: r["partition_key"] for r in db.fetch_all(
        "document_version_partition_keys", {"task_ids": [r.task_id for r in [*done, busy]]})}
    order = [keys[busy.task_id]] + [keys[r.task_id] for r in done]  # the busy key is the oldest of all
    record_added(db, order)
    with psycopg.connect(db_url, autocommit=True) as conn:
        for age, key in enumerate(reversed(order)):
            conn.execute("UPDATE dagster_partition_key SET added_at = now() - make_interval(mins => %s)"
                         " WHERE partition_key = %s", (age + 1, key))
    assert prunable(db, window_seconds=3600) == []  # all inside the window, under the default cap
    assert prunable(db, window_seconds=3600, max_keys=3) == [keys[done[0].task_id]]
    assert prunable(db, window_seconds=3600, max_keys=1) == [keys[r.task_id] for r in done[:3]]
    assert prunable(db, window_seconds=3600, max_keys=0) == [keys[r.task_id] for r in done]
    assert prunable(db, window_seconds=0) == [keys[r.task_id] for r in done]  # and the window alone, as before
