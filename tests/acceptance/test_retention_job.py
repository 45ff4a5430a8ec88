"""The Dagster retention job removes superseded chunks and leaves partition keys to prune_lineage_keys, the one
job that deletes them (issue #28: two mechanisms with two ledgers pruned the same keys)."""

from __future__ import annotations

import dagster as dg
import psycopg
import pytest

from pipelines.definitions import defs
from pipelines.lineage_job import prune_lineage_keys_job
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from pipelines.retention_job import apply_retention_hourly, apply_retention_job
from resources.blob_store import BlobStore
from resources.dagster_resources import BlobStoreResource, DatabaseResource
from resources.database import Database
from resources.index_sink import IndexSink
from resources.partition_keys import record_added
from resources.publisher import Publisher
from resources.settings import RETENTION_MIN_WINDOW_ENV, retention_min_window_seconds
from resources.task_queue import TaskQueue
from tests.integration.test_index_sink import embed, make_chunks


def _index_two_versions_and_a_dead_one(db: Database, tmp_path) -> None:
    publisher = Publisher(db, BlobStore(str(tmp_path / "blobs")))
    queue = TaskQueue(db, lease_seconds=60)
    sink = IndexSink(db, queue)
    for version, body in ((1, b"first"), (2, b"second")):
        publisher.publish("acme", "policy", body, "policy.txt")
        (task,) = queue.claim("w1", limit=1)
        chunks = make_chunks("acme", "policy", version, [f"{body.decode()} part {i}" for i in range(5)])
        sink.publish(task.lease, chunks, embed(chunks))
    publisher.publish("acme", "broken", b"not a document", "broken.txt")
    (task,) = queue.claim("w1", limit=1)
    queue.fail(task.lease, "PARSE_ERROR", "not a document")
    publisher.publish("acme", "pending", b"not claimed yet", "pending.txt")  # in flight: PENDING


def _keys(instance: dg.DagsterInstance) -> set[str]:
    return set(instance.get_dynamic_partitions(VERSIONS_PARTITIONS_NAME))


def _resources(db_url, tmp_path) -> dict:
    return {"database": DatabaseResource(url=db_url), "blobs": BlobStoreResource(url=str(tmp_path / "blobs"))}


def _run(instance, db_url, window_seconds: float, tmp_path):
    return apply_retention_job.execute_in_process(
        instance=instance,
        resources=_resources(db_url, tmp_path),
        run_config={"ops": {"retention_pass": {"config": {"window_seconds": window_seconds}}}},
    )


def test_the_job_deletes_superseded_chunks_and_leaves_partition_keys_to_the_lineage_job(db_url, tmp_path, monkeypatch):
    monkeypatch.setenv(RETENTION_MIN_WINDOW_ENV, "0")  # the operator's environment allows a window of 0 here
    db = Database(db_url)
    keys = {"acme/policy/v1", "acme/policy/v2", "acme/broken/v1", "acme/pending/v1"}
    try:
        _index_two_versions_and_a_dead_one(db, tmp_path)
        record_added(db, sorted(keys))  # as the claiming sensor does when it adds them
    finally:
        db.close()
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, sorted(keys))

    # within the default 7-day window nothing goes
    kept = apply_retention_job.execute_in_process(instance=instance, resources=_resources(db_url, tmp_path))
    assert kept.success
    assert _keys(instance) == keys

    # a window of 0: v1's chunks go, and every key stays: retention never deletes one
    with psycopg.connect(db_url, autocommit=True) as conn:  # tasks changed in the last second: age them
        conn.execute("UPDATE index_task SET updated_at = updated_at - interval '1 minute'")
        conn.execute("UPDATE document_version SET published_at = published_at - interval '1 minute'")
    result = _run(instance, db_url, 0, tmp_path)
    assert result.success
    assert _keys(instance) == keys
    (materialized,) = [
        e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT" and e.step_key == "retention_pass"
    ]
    meta = {k: v.value for k, v in materialized.event_specific_data.metadata.items()}
    assert meta["versions_removed"] == 1 and meta["chunks_deleted"] == 5
    assert not any("partition_key" in name for name in meta)
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT version_number, count(*) FROM chunk GROUP BY 1").fetchall()
    assert rows == [(2, 5)]

    # the lineage job prunes the key of every version with nothing in flight past its window: the one retention
    # released (v1), the dead one, and the searchable v2 alike; the pending version keeps its key
    pruned = prune_lineage_keys_job.execute_in_process(
        instance=instance, resources={"database": DatabaseResource(url=db_url)},
        run_config={"ops": {"prune_partition_keys": {"config": {"window_seconds": 0}}}},
    )
    assert pruned.success
    assert _keys(instance) == {"acme/pending/v1"}
    again = _run(instance, db_url, 0, tmp_path)
    assert again.success and _keys(instance) == {"acme/pending/v1"}


def test_the_job_and_its_hourly_schedule_are_in_the_code_location():
    assert defs.resolve_job_def("apply_retention").name == "apply_retention"
    schedule = defs.resolve_schedule_def("apply_retention_hourly")
    assert schedule.cron_schedule == "0 * * * *" and schedule.job_name == "apply_retention"
    assert apply_retention_hourly.default_status == dg.DefaultScheduleStatus.RUNNING


def _chunks_by_version(db_url) -> list[tuple[int, int]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT version_number, count(*) FROM chunk GROUP BY 1 ORDER BY 1").fetchall()


def _age_by_30_days(db_url) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET updated_at = updated_at - interval '30 days'")
        conn.execute("UPDATE document_version SET published_at = published_at - interval '30 days'")
        conn.execute("UPDATE superseded_version SET superseded_at = superseded_at - interval '30 days'")


def _error_text(result) -> str:
    error = result.failure_data_for_node("retention_pass").error
    parts = []
    while error is not None:
        parts.append(error.message)
        error = error.cause
    return " ".join(parts)


@pytest.mark.parametrize("window_seconds", [0, 3600, 7 * 24 * 3600 - 1])
def test_a_window_under_the_floor_fails_the_run_and_deletes_no_rollback_data(db_url, tmp_path, monkeypatch, window_seconds):
    """Issue #31, finding 2: the launchpad has no authentication; ``window_seconds: 0`` wiped every tenant's
    rollback data. Without KBINDEX_RETENTION_MIN_WINDOW_SECONDS the floor is the 7-day window itself."""
    monkeypatch.delenv(RETENTION_MIN_WINDOW_ENV, raising=False)
    db = Database(db_url)
    try:
        _index_two_versions_and_a_dead_one(db, tmp_path)
    finally:
        db.close()
    _age_by_30_days(db_url)  # v1 superseded 30 days ago: past any window under 7 days
    before = _chunks_by_version(db_url)
    assert before == [(1, 5), (2, 5)]
    instance = dg.DagsterInstance.ephemeral()
    result = apply_retention_job.execute_in_process(
        instance=instance, resources=_resources(db_url, tmp_path), raise_on_error=False,
        run_config={"ops": {"retention_pass": {"config": {"window_seconds": window_seconds}}}},
    )
    assert not result.success
    assert "RETENTION_WINDOW_TOO_SHORT" in _error_text(result)
    assert _chunks_by_version(db_url) == before  # the rollback version is still there


def test_a_window_at_or_over_the_floor_runs_and_the_environment_sets_the_floor(db_url, tmp_path, monkeypatch):
    monkeypatch.setenv(RETENTION_MIN_WINDOW_ENV, "86400")
    db = Database(db_url)
    try:
        _index_two_versions_and_a_dead_one(db, tmp_path)
    finally:
        db.close()
    _age_by_30_days(db_url)
    instance = dg.DagsterInstance.ephemeral()
    under = apply_retention_job.execute_in_process(
        instance=instance, resources=_resources(db_url, tmp_path), raise_on_error=False,
        run_config={"ops": {"retention_pass": {"config": {"window_seconds": 3600}}}})
    assert not under.success and _chunks_by_version(db_url) == [(1, 5), (2, 5)]
    at = _run(instance, db_url, 86400, tmp_path)  # one day: the floor this environment set
    assert at.success
    assert _chunks_by_version(db_url) == [(2, 5)]  # v1, superseded 30 days ago, is past it


@pytest.mark.parametrize("raw, expected", [(None, 7 * 24 * 3600.0), ("", 7 * 24 * 3600.0), ("0", 0.0), ("90.5", 90.5)])
def test_the_floor_setting(raw, expected):
    env = {} if raw is None else {RETENTION_MIN_WINDOW_ENV: raw}
    assert retention_min_window_seconds(env) == expected


@pytest.mark.parametrize("raw", ["-1", "nan", "a week"])
def test_a_floor_that_is_not_a_non_negative_number_is_an_error(raw):
    with pytest.raises(ValueError, match=RETENTION_MIN_WINDOW_ENV):
        retention_min_window_seconds({RETENTION_MIN_WINDOW_ENV: raw})
