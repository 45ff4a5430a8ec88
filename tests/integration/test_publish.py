"""Publish: version + PENDING task + event in one transaction; idempotent on the same bytes."""

from __future__ import annotations

import threading

import psycopg
import pytest

from pipelines.domain.errors import InvalidRequest
from resources.blob_store import BlobStore
from resources.publisher import Publisher


@pytest.fixture
def publisher(db, tmp_path):
    return Publisher(db, BlobStore(str(tmp_path / "blobs")))


def test_first_publish_creates_version_one_and_pending_task(publisher, db_url):
    r = publisher.publish("acme", "policies/refund.md", b"# Refunds\nWithin 30 days.", "refund.md")
    assert (r.version, r.status, r.created, r.profile) == (1, "PENDING", True, "minilm-v1")
    with psycopg.connect(db_url) as conn:
        events = conn.execute("SELECT from_status, to_status, attempt FROM task_event WHERE task_id = %s", [r.task_id]).fetchall()
        media = conn.execute("SELECT media_type, filename FROM document_version").fetchone()
    assert events == [(None, "PENDING", 0)]
    assert media == ("text/markdown", "refund.md")


def test_same_bytes_again_returns_the_existing_task(publisher):
    a = publisher.publish("acme", "doc", b"hello", "a.txt")
    b = publisher.publish("acme", "doc", b"hello", "a.txt")
    assert b.task_id == a.task_id and b.version == 1 and not b.created


def test_changed_bytes_make_the_next_version(publisher):
    a = publisher.publish("acme", "doc", b"hello", "a.txt")
    b = publisher.publish("acme", "doc", b"hello again", "a.txt")
    c = publisher.publish("acme", "doc", b"hello", "a.txt")  # a revert is a new version too
    assert (a.version, b.version, c.version) == (1, 2, 3)
    assert len({a.task_id, b.task_id, c.task_id}) == 3


def test_tenants_are_separate(publisher):
    a = publisher.publish("acme", "doc", b"x", "a.txt")
    b = publisher.publish("globex", "doc", b"x", "a.txt")
    assert a.task_id != b.task_id and b.version == 1 and b.created


def test_publish_notifies_listeners(publisher, db_url):
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN kbindex_task_event")
        publisher.publish("acme", "doc", b"notify me", "a.txt")
        got = next(listener.notifies(timeout=5, stop_after=1), None)
    assert got is not None and got.channel == "kbindex_task_event" and int(got.payload) > 0


@pytest.mark.parametrize(
    "tenant, document_id",
    [("", "doc"), ("acme corp", "doc"), ("acme'; DROP TABLE index_task;--", "doc"), ("acme", ""), ("acme", "a\x00b"), ("acme", "x" * 1001)],
)
def test_bad_identifiers_are_refused_and_change_nothing(publisher, db_url, tenant, document_id):
    with pytest.raises(InvalidRequest):
        publisher.publish(tenant, document_id, b"data", "a.txt")
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM document_version").fetchone() == (0,)


def test_hostile_filename_is_only_a_label(publisher, tmp_path):
    r = publisher.publish("acme", "doc", b"data", "../../etc/passwd")
    assert r.created
    assert not (tmp_path / "etc").exists()
    stored = list((tmp_path / "blobs").rglob("*"))
    assert all(str(p).startswith(str(tmp_path / "blobs")) for p in stored)


def test_concurrent_duplicate_publishes_make_one_version_and_one_task(db, tmp_path):
    publisher = Publisher(db, BlobStore(str(tmp_path / "blobs")))
    results, errors = [], []
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        try:
            results.append(publisher.publish("acme", "same-doc", b"identical bytes", "a.txt"))
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert {r.task_id for r in results} == {results[0].task_id}
    assert {r.version for r in results} == {1}
    assert sum(r.created for r in results) == 1


def test_a_publish_with_no_profile_to_index_it_is_refused_by_the_server_and_commits_nothing(publisher, db, db_url):
    """The refusal is raised by the transaction's last statement, sent with its COMMIT (``publish_refusals``):
    no version, task, event or charge commits, the pool's connection is usable, and the next publish works."""
    from resources.database import DatabaseError
    from resources.publisher import NO_ACTIVE_PROFILE, REFUSED

    publisher.publish("acme", "kept", b"kept", "kept.txt")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET is_active = false")
    with pytest.raises(InvalidRequest) as caught:
        publisher.publish("acme", "doc", b"hello", "a.txt")
    assert caught.value.message == NO_ACTIVE_PROFILE
    assert isinstance(caught.value.__cause__, DatabaseError) and caught.value.__cause__.sqlstate == REFUSED
    with psycopg.connect(db_url, autocommit=True) as conn:
        counts = conn.execute("SELECT (SELECT count(*) FROM document_version), (SELECT count(*) FROM index_task), "
                              "(SELECT count(*) FROM task_event), (SELECT live_versions FROM tenant_storage)").fetchone()
        assert counts == (1, 1, 1, 1)
        conn.execute("UPDATE index_profile SET is_active = true WHERE name = 'minilm-v1'")
    assert publisher.publish("acme", "doc", b"hello", "a.txt").version == 1


def test_a_server_error_that_is_not_a_refusal_stays_what_it_was(publisher, db, monkeypatch):
    """Only SQLSTATE KB001 becomes a typed refusal; any other failure of the transaction surfaces unchanged."""
    from resources.database import DatabaseError
    from sql import queries

    monkeypatch.setitem(queries, "publish_refusals", "SELECT 1 / 0")
    with pytest.raises(DatabaseError) as caught:
        publisher.publish("acme", "doc", b"hello", "a.txt")
    assert caught.value.sqlstate == "22012" and type(caught.value) is DatabaseError
    monkeypatch.undo()
    assert publisher.publish("acme", "doc", b"hello", "a.txt").version == 1
