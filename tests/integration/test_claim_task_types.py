"""The sensor's claim takes live INDEX tasks only; REINDEX tasks wait for the operator's backfill."""

from resources.blob_store import BlobStore
from resources.publisher import Publisher
from resources.task_queue import TaskQueue


def test_claim_skips_reindex_tasks_which_claim_task_takes_by_id(db, tmp_path):
    publisher = Publisher(db, BlobStore(str(tmp_path)))
    queue = TaskQueue(db)
    r = publisher.publish("acme", "doc", b"text", "doc.txt")
    (live,) = queue.claim("sensor", limit=10)
    assert live.lease.task_id == r.task_id and live.task_type == "INDEX"
    reindex_id = queue.ensure_task("acme", "doc", 1, "minilm-v1")  # existing INDEX task is returned
    assert reindex_id == r.task_id
    import psycopg

    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, building)"
            " VALUES ('shadow', 'fake-384', 384, 128, 16, true)"
        )
    shadow_task = queue.ensure_task("acme", "doc", 1, "shadow")
    assert queue.get(shadow_task)["task_type"] == "REINDEX"
    assert queue.claim("sensor", limit=10) == []
    claimed = queue.claim_task(shadow_task, "backfill-run")
    assert claimed is not None and claimed.lease.attempt == 1 and claimed.profile == "shadow"
    assert queue.claim_task(shadow_task, "another-run") is None  # leased: not claimable twice


def test_ensure_task_builds_nothing_for_a_superseded_version(db, tmp_path):
    import psycopg
    import pytest

    from pipelines.domain.errors import TaskNotFound

    publisher = Publisher(db, BlobStore(str(tmp_path)))
    queue = TaskQueue(db)
    publisher.publish("acme", "doc", b"one", "doc.txt")
    publisher.publish("acme", "doc", b"two", "doc.txt")
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, building)"
            " VALUES ('shadow', 'fake-384', 384, 128, 16, true)"
        )
    with pytest.raises(TaskNotFound, match="superseded"):
        queue.ensure_task("acme", "doc", 1, "shadow")
    assert queue.get(queue.ensure_task("acme", "doc", 2, "shadow"))["task_type"] == "REINDEX"


def test_expired_only_claim_takes_over_abandoned_leases_but_starts_no_new_work(db, tmp_path):
    import psycopg

    publisher = Publisher(db, BlobStore(str(tmp_path)))
    queue = TaskQueue(db)
    stuck = publisher.publish("acme", "stuck", b"one", "a.txt")
    (first,) = queue.claim("run-a", limit=1)
    fresh = publisher.publish("acme", "fresh", b"two", "b.txt")
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET lease_until = now() - interval '1 second' WHERE task_id = %s", [stuck.task_id])
    (taken,) = queue.claim("sensor", limit=10, expired_only=True)
    assert taken.lease.task_id == stuck.task_id and taken.lease.attempt == first.lease.attempt + 1
    assert queue.get(fresh.task_id)["status"] == "PENDING"
    assert [t.lease.task_id for t in queue.claim("sensor", limit=10)] == [fresh.task_id]
