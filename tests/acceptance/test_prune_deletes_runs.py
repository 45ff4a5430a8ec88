"""Pruning a version's key also deletes the runs that indexed it (issue #33), with their events.

Dagster rebuilds the partitions tab's status cache from every materialization of the asset whenever a key is
added, so the events of pruned keys would grow that rebuild without bound. These runs are real: the
index_versions job run in process into Dagster's PostgreSQL storage, with the lease tags the sensor gives.
"""

from __future__ import annotations

import dagster as dg
import psycopg
import pytest

from pipelines.definitions import defs
from pipelines.jobs import index_versions_job
from pipelines.lineage_job import prune_lineage_keys_job
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.blob_store import BlobStore
from pipelines.sensors import run_tags
from resources.dagster_resources import DatabaseResource, default_resources
from resources.database import Database
from resources.partition_keys import record_added
from resources.publisher import Publisher
from resources.task_queue import TaskQueue

TEXT = b"# Refunds\n\nCustomers may ask for a refund within 30 days of purchase.\n\n## Exceptions\n\nGift cards are final."


@pytest.fixture
def kb(db_url, dagster_pg_url, kb_env, fake_profile):
    db = Database(db_url)
    overrides = {"storage": {"postgres": {"postgres_url": dagster_pg_url}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        yield db, Publisher(db, BlobStore(kb_env["KBINDEX_BLOB_URL"])), TaskQueue(db, lease_seconds=60), instance
    db.close()


def index(kb, documents: list[str]) -> tuple[str, list[str], list[int]]:
    """Publish ``documents``, claim them and index them in one run as the sensor would: (run id, keys, task ids)."""
    db, publisher, queue, instance = kb
    for name in documents:
        publisher.publish("acme", name, TEXT + name.encode(), name)
    claimed = queue.claim("prune-test", limit=10)
    tasks = [t.lease.task_id for t in claimed]
    keys = [r["partition_key"] for r in db.fetch_all("document_version_partition_keys", {"task_ids": tasks})]
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
    record_added(db, keys)
    tags = run_tags([(t.lease.task_id, t.lease.attempt) for t in claimed], keys, "prune-test", "acme")
    job = defs.resolve_job_def(index_versions_job.name)  # the job the claiming sensor starts, with its tags
    result = job.execute_in_process(instance=instance, tags=tags, partition_key=keys[0] if len(keys) == 1 else None,
                                    resources=default_resources())
    assert result.success
    return result.run_id, keys, tasks


def age(db_url, keys_oldest_first: list[str]) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for hours, key in enumerate(reversed(keys_oldest_first), start=1):
            conn.execute("UPDATE dagster_partition_key SET added_at = now() - make_interval(hours => %s)"
                         " WHERE partition_key = %s", (hours, key))


def prune(kb, db_url, **config) -> dict:
    instance = kb[3]
    result = prune_lineage_keys_job.execute_in_process(
        run_config={"ops": {"prune_partition_keys": {"config": {"window_seconds": 0, **config}}}},
        resources={"database": DatabaseResource(url=db_url)}, instance=instance)
    assert result.success
    (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    return {k: v.value for k, v in output.step_output_data.metadata.items()}


def materialized_keys(instance) -> set[str]:
    records = instance.fetch_materializations(dg.AssetKey("search_index"), limit=100).records
    return {r.partition_key for r in records}


def test_a_run_goes_with_the_last_of_its_keys_and_its_events_with_it(kb, db_url):
    db, _, queue, instance = kb
    run_a, (a1, a2), tasks_a = index(kb, ["one.md", "two.md"])
    run_b, (b1,), _ = index(kb, ["three.md"])
    age(db_url, [a1, a2, b1])
    assert materialized_keys(instance) == {a1, a2, b1}

    first = prune(kb, db_url, batch=1)  # a1 only: run A also indexed a2, still live, so it stays
    assert (first["partition_keys_deleted"], first["runs_deleted"], first["runs_kept"]) == (1, 0, 1)
    assert instance.get_run_by_id(run_a) is not None and materialized_keys(instance) == {a1, a2, b1}

    second = prune(kb, db_url, batch=1)  # a2: the last live key of run A
    assert (second["partition_keys_deleted"], second["runs_deleted"], second["runs_kept"]) == (1, 1, 0)
    assert instance.get_run_by_id(run_a) is None
    assert materialized_keys(instance) == {b1}  # its events went with it: only run B's are left
    assert not instance.get_records_for_run(run_a).records
    assert instance.get_run_by_id(run_b) is not None
    assert instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME) == [b1]
    # kbindex keeps the task's own history, the id of the run that indexed it included
    assert run_a in {r["run_id"] for r in queue.dagster_runs(tasks_a[0])}


def test_an_operator_can_keep_the_runs(kb, db_url):
    instance = kb[3]
    run, (key,), _ = index(kb, ["one.md"])
    kept = prune(kb, db_url, delete_runs=False)
    assert (kept["partition_keys_deleted"], kept["runs_deleted"]) == (1, 0)
    assert instance.get_run_by_id(run) is not None and materialized_keys(instance) == {key}
    assert instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME) == []


def ui_range_run(kb, documents: list[str]) -> tuple[str, list[str]]:
    """Publish ``documents`` and index them in one range run without lease tags, as a UI backfill starts it."""
    db, publisher, _, instance = kb
    for name in documents:
        publisher.publish("acme", name, TEXT + name.encode(), name)
    keys = [f"acme/{name}/v1" for name in documents]
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
    record_added(db, keys)
    job = defs.resolve_job_def(index_versions_job.name)
    result = job.execute_in_process(instance=instance, resources=default_resources(), tags={
        "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]})
    assert result.success
    return result.run_id, keys


def test_a_ui_range_run_goes_once_no_key_it_materialized_is_live(kb, db_url):
    """Its tags name only the range's ends: a live key in the middle keeps it, read from the run's own events."""
    instance = kb[3]
    run, (first, middle, last) = ui_range_run(kb, ["one.md", "two.md", "three.md"])
    assert materialized_keys(instance) == {first, middle, last}
    age(db_url, [first, last, middle])

    ends = prune(kb, db_url, batch=2)  # both ends go, the middle stays live: the run holds its only lineage
    assert (ends["partition_keys_deleted"], ends["runs_deleted"], ends["runs_kept"]) == (2, 0, 1)
    assert instance.get_run_by_id(run) is not None and middle in materialized_keys(instance)

    rest = prune(kb, db_url, batch=2)
    assert (rest["partition_keys_deleted"], rest["runs_deleted"], rest["runs_kept"]) == (1, 1, 0)
    assert instance.get_run_by_id(run) is None and materialized_keys(instance) == set()


def test_runs_left_by_keys_pruned_earlier_go_oldest_first(kb, db_url):
    """Keys pruned while runs were kept (before prune deleted runs, or with delete_runs off) left their runs:
    a later prune walks the oldest finished index runs created before the oldest live key was added."""
    instance = kb[3]
    run_a, (a,), _ = index(kb, ["one.md"])
    run_b, (b,), _ = index(kb, ["two.md"])
    run_c, (c,), _ = index(kb, ["three.md"])
    age(db_url, [a, b])
    with psycopg.connect(db_url, autocommit=True) as conn:  # c was added again since run C (a re-index)
        conn.execute("UPDATE dagster_partition_key SET added_at = now() + interval '1 hour' WHERE partition_key = %s",
                     (c,))
    legacy = prune(kb, db_url, batch=1, delete_runs=False)  # a goes, run A stays: the state before this change
    assert (legacy["partition_keys_deleted"], legacy["runs_deleted"]) == (1, 0)
    assert instance.get_run_by_id(run_a) is not None

    later = prune(kb, db_url, batch=1)  # b goes with run B; the walk finds run A
    assert (later["partition_keys_deleted"], later["runs_deleted"], later["older_runs_deleted"]) == (1, 1, 1)
    assert instance.get_run_by_id(run_a) is None and instance.get_run_by_id(run_b) is None
    # run C was created before c's last addition, so the walk looked at it: c is live, so it stays
    assert instance.get_run_by_id(run_c) is not None and materialized_keys(instance) == {c}


def _readd_later(db_url, key: str) -> None:
    """``key`` was added again after its run (a re-index): the run covers a live key and is kept."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE dagster_partition_key SET added_at = now() + interval '1 hour' WHERE partition_key = %s",
                     (key,))


def test_kept_runs_at_the_front_do_not_stall_the_walk(kb, db_url):
    """A walk that keeps every run it looks at (each covers a key added again since) used to start at the same
    oldest runs on every prune, so as many kept runs as the walk's limit hid every run behind them for good.
    Each walk now resumes where the last stopped; with a limit of 1, run K is the front it must get past."""
    instance = kb[3]
    run_k, (k,), _ = index(kb, ["one.md"])
    run_l, (l,), _ = index(kb, ["two.md"])
    run_m, (m,), _ = index(kb, ["three.md"])
    _readd_later(db_url, k)
    age(db_url, [l, m])
    legacy = prune(kb, db_url, batch=1, delete_runs=False)  # l goes, run L is left behind
    assert (legacy["partition_keys_deleted"], legacy["runs_deleted"]) == (1, 0)

    first = prune(kb, db_url, batch=1, catch_up_runs=1)  # m goes with run M; the walk looks at run K only
    assert (first["runs_deleted"], first["older_runs_deleted"], first["older_runs_kept"]) == (1, 0, 1)
    second = prune(kb, db_url, batch=1, catch_up_runs=1)  # no key is due; the walk goes on past K, to L
    assert (second["partition_keys_deleted"], second["older_runs_deleted"], second["older_runs_kept"]) == (0, 1, 0)
    assert instance.get_run_by_id(run_l) is None and instance.get_run_by_id(run_m) is None
    assert instance.get_run_by_id(run_k) is not None and materialized_keys(instance) == {k}


def test_a_walk_that_reaches_the_end_starts_again_from_the_oldest(kb, db_url):
    """A run the walk passed over while its key was live is behind the walk once that key goes with
    delete_runs off; after a walk reaches the end, the next starts from the oldest and finds it."""
    instance = kb[3]
    run_k, (k,), _ = index(kb, ["one.md"])
    run_z, (z,), _ = index(kb, ["two.md"])
    _readd_later(db_url, k)
    with psycopg.connect(db_url, autocommit=True) as conn:  # z later still: the live key left at the end
        conn.execute("UPDATE dagster_partition_key SET added_at = now() + interval '2 hours' WHERE partition_key = %s",
                     (z,))
    walks = [prune(kb, db_url, catch_up_runs=1)]  # nothing due; the walk passes over run K (k is live)
    age(db_url, [k])
    dropped = prune(kb, db_url, batch=1, delete_runs=False)  # k goes; run K is left behind, behind the walk
    assert (dropped["partition_keys_deleted"], dropped["runs_deleted"]) == (1, 0)
    walks += [prune(kb, db_url, catch_up_runs=1) for _ in range(3)]  # run Z (kept), the end, then from the oldest
    assert [(w["older_runs_deleted"], w["older_runs_kept"]) for w in walks] == [(0, 1), (0, 1), (0, 0), (1, 0)]
    assert instance.get_run_by_id(run_k) is None and instance.get_run_by_id(run_z) is not None


def test_finished_maintenance_runs_older_than_the_window_go_oldest_first(kb, db_url):
    """Retention and the artifact sweep run every hour and prune up to every 10 minutes: their finished runs go
    once older than the window, a bounded number per prune run; an unfinished one and other jobs' runs stay."""
    instance = kb[3]

    def add(job: str, status=dg.DagsterRunStatus.SUCCESS) -> str:
        return instance.add_run(dg.DagsterRun(job_name=job, status=status)).run_id

    retention = [add("apply_retention") for _ in range(3)]
    sweep = add("sweep_artifacts", dg.DagsterRunStatus.FAILURE)
    in_flight = add("apply_retention", dg.DagsterRunStatus.STARTED)
    operator = add("backfill_profile")
    inside = prune(kb, db_url, window_seconds=3600)  # all of them are younger than an hour
    assert inside["maintenance_runs_deleted"] == 0
    first = prune(kb, db_url, maintenance_runs=2)  # window 0: the two oldest retention runs
    assert first["maintenance_runs_deleted"] == 2
    assert [instance.get_run_by_id(r) is None for r in retention] == [True, True, False]
    second = prune(kb, db_url)  # the rest, with the finished prune runs before this one
    assert second["maintenance_runs_deleted"] == 1 + 1 + 2
    assert instance.get_run_by_id(retention[2]) is None and instance.get_run_by_id(sweep) is None
    assert instance.get_run_by_id(in_flight) is not None and instance.get_run_by_id(operator) is not None
