"""Issue #17, disk: stored bytes are garbage-collected, orphans too, and a tenant has a quota."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pipelines.domain.errors import InvalidRequest, QuotaExceeded
from resources.blob_gc import collect_blobs
from resources.blob_store import BlobStore, content_hash
from resources.database import DatabaseError
from resources.publisher import Publisher
from resources.task_queue import TaskQueue
from tests.integration.test_retention import World


def _blob_files(root: Path) -> set[str]:
    return {p.name for p in (root / "sha256").rglob("*") if p.is_file()} if (root / "sha256").exists() else set()


def _age(root: Path, seconds: float) -> None:
    """Make every stored file look ``seconds`` old (the grace period counts from the file's mtime)."""
    past = time.time() - seconds
    for p in (root / "sha256").rglob("*"):
        if p.is_file():
            os.utime(p, (past, past))


def test_a_publish_that_fails_after_storing_its_bytes_leaves_no_file_for_long(db, tmp_path):
    root = tmp_path / "blobs"
    publisher = Publisher(db, BlobStore(str(root)))
    blobs = publisher.blobs

    # The database refuses the version after the bytes were stored (inside its transaction: nothing commits).
    def refuse(tx):
        raise DatabaseError("database error UndefinedColumn (54000)")

    with pytest.raises(DatabaseError):
        publisher.publish("acme", "doc.md", b"orphaned bytes", "doc.md", with_commit=refuse)
    assert db.fetch_one("document_version_latest", {"tenant_id": "acme", "document_id": "doc.md"}) is None
    orphan = content_hash(b"orphaned bytes")
    assert orphan in _blob_files(root)

    assert collect_blobs(db, blobs, window_seconds=0).blobs_deleted == 0  # younger than the grace period
    _age(root, 2 * 3600)
    report = collect_blobs(db, blobs, window_seconds=0)
    assert report.blobs_deleted == 1 and orphan not in _blob_files(root)


def test_a_document_id_over_the_byte_limit_is_refused_before_its_bytes_are_stored(db, tmp_path):
    root = tmp_path / "blobs"
    publisher = Publisher(db, BlobStore(str(root)))
    with pytest.raises(InvalidRequest, match="bytes"):
        publisher.publish("acme", "\U0001f600" * 1000, b"some bytes", "x.md")
    assert _blob_files(root) == set()


def test_bytes_of_versions_superseded_past_the_window_are_deleted_and_given_back(db, db_url, tmp_path):
    root = tmp_path / "blobs"
    publisher = Publisher(db, BlobStore(str(root)))
    world = World(db, db_url, TaskQueue(db, lease_seconds=60), publisher)
    v1 = world.publish("policy")
    world.index("policy", v1)
    v2 = world.publish("policy")
    world.index("policy", v2)
    hashes = dict(world.sql("SELECT version_number, content_hash FROM document_version WHERE document_id = 'policy'"))
    sizes = dict(world.sql("SELECT version_number, byte_size FROM document_version WHERE document_id = 'policy'"))
    stored_before = world.sql("SELECT stored_bytes FROM tenant_storage WHERE tenant_id = 'acme'")[0][0]
    assert stored_before == sizes[1] + sizes[2]
    _age(root, 2 * 3600)

    # Within the window both stay; past it (window 0) v1's bytes go, the latest version's never.
    assert collect_blobs(db, publisher.blobs, window_seconds=7 * 24 * 3600).blobs_deleted == 0
    report = collect_blobs(db, publisher.blobs, window_seconds=0)
    assert report.blobs_deleted == 1 and report.bytes_released == sizes[1]
    assert _blob_files(root) == {hashes[2]}
    assert world.sql("SELECT stored_bytes FROM tenant_storage WHERE tenant_id = 'acme'")[0][0] == sizes[2]
    released = world.sql("SELECT version_number FROM document_version WHERE bytes_released_at IS NOT NULL")
    assert released == [(1,)]
    assert collect_blobs(db, publisher.blobs, window_seconds=0).blobs_deleted == 0  # nothing twice


def test_republishing_old_bytes_renews_them_so_collection_spares_the_publish_in_flight(db, tmp_path):
    root = tmp_path / "blobs"
    blobs = BlobStore(str(root))
    digest = blobs.put(b"old bytes")
    _age(root, 2 * 3600)
    assert blobs.put(b"old bytes") == digest  # a publish of the same bytes, before its transaction commits
    assert collect_blobs(db, blobs, window_seconds=0).blobs_deleted == 0
    assert digest in _blob_files(root)


def test_a_tenant_over_its_quota_gets_quota_exceeded_and_stores_nothing(db, tmp_path):
    root = tmp_path / "blobs"
    publisher = Publisher(db, BlobStore(str(root)), quota_bytes=100)
    publisher.publish("acme", "a.md", b"x" * 60, "a.md")
    with pytest.raises(QuotaExceeded) as caught:
        publisher.publish("acme", "b.md", b"y" * 60, "b.md")
    assert caught.value.code == "QUOTA_EXCEEDED"
    assert content_hash(b"y" * 60) not in _blob_files(root)
    publisher.publish("globex", "b.md", b"y" * 60, "b.md")  # another tenant has its own quota
    publisher.publish("acme", "a.md", b"x" * 60, "a.md")  # the same bytes again cost nothing


def test_the_quota_holds_inside_the_publish_transaction(db, tmp_path):
    """Checked again after the version row is written: a stale pre-check cannot let a publish through."""
    publisher = Publisher(db, BlobStore(str(tmp_path / "blobs")), quota_bytes=100)
    publisher.publish("acme", "a.md", b"x" * 60, "a.md")
    real = db.fetch_one

    def stale(name, params=None):
        if name == "tenant_storage_get":
            return {"stored_bytes": 0, "live_versions": 0}  # the row tenant_storage_get always answers
        return real(name, params)

    db.fetch_one = stale
    try:
        with pytest.raises(QuotaExceeded):
            publisher.publish("acme", "b.md", b"y" * 60, "b.md")
    finally:
        db.fetch_one = real
    assert db.fetch_one("tenant_storage_get", {"tenant_id": "acme"})["stored_bytes"] == 60


def test_tiny_documents_meet_a_versions_quota_that_says_which_quota(db, tmp_path):
    """Issue #31 finding 8: 1-byte versions passed the byte quota for ever (unlimited rows, tasks, keys, runs)."""
    root = tmp_path / "blobs"
    publisher = Publisher(db, BlobStore(str(root)), quota_bytes=10**9, quota_versions=3)
    publisher.publish("acme", "a.md", b"a", "a.md")
    publisher.publish("acme", "a.md", b"b", "a.md")  # version 2 of the same document counts too
    publisher.publish("acme", "c.md", b"c", "c.md")
    with pytest.raises(QuotaExceeded, match="versions quota of 3") as caught:
        publisher.publish("acme", "d.md", b"d", "d.md")
    assert caught.value.code == "QUOTA_EXCEEDED" and "KBINDEX_TENANT_QUOTA_VERSIONS" in caught.value.message
    assert content_hash(b"d") not in _blob_files(root)  # refused before its bytes were stored
    publisher.publish("acme", "c.md", b"c", "c.md")  # the latest bytes again: no new version, no refusal
    publisher.publish("globex", "d.md", b"d", "d.md")  # another tenant counts its own
    assert publisher.delete("acme", "c.md").outcome == "deleted"  # a delete is never refused, and counts
    assert db.fetch_one("tenant_storage_get", {"tenant_id": "acme"})["live_versions"] == 4
    with pytest.raises(QuotaExceeded, match="stored-bytes quota"):  # the byte quota names itself
        Publisher(db, BlobStore(str(root)), quota_bytes=5, quota_versions=None).publish("acme", "e.md", b"e" * 10, "e.md")


def test_the_versions_quota_holds_inside_the_publish_transaction_and_released_versions_free_it(db, db_url, tmp_path):
    """Checked on the counter row the publish transaction updates (no count over the tenant); versions whose
    bytes retention released stop counting."""
    root = tmp_path / "blobs"
    publisher = Publisher(db, BlobStore(str(root)), quota_bytes=None, quota_versions=2)
    world = World(db, db_url, TaskQueue(db, lease_seconds=60), publisher)
    v1 = world.publish("policy")
    world.index("policy", v1)
    v2 = world.publish("policy")
    world.index("policy", v2)
    real = db.fetch_one

    def stale(name, params=None):
        return {"stored_bytes": 0, "live_versions": 0} if name == "tenant_storage_get" else real(name, params)

    db.fetch_one = stale
    try:
        with pytest.raises(QuotaExceeded, match="versions quota"):
            publisher.publish("acme", "other.md", b"x", "other.md")
    finally:
        db.fetch_one = real
    assert world.sql("SELECT count(*) FROM document_version WHERE document_id = 'other.md'") == [(0,)]
    _age(root, 2 * 3600)
    assert collect_blobs(db, publisher.blobs, window_seconds=0).blobs_deleted == 2  # v1's bytes; the refusal's orphan
    assert db.fetch_one("tenant_storage_get", {"tenant_id": "acme"})["live_versions"] == 1
    publisher.publish("acme", "other.md", b"x", "other.md")  # room again


@pytest.mark.parametrize("batch", [False, True], ids=["publish", "publish_many"])
def test_a_publish_of_the_same_bytes_between_the_gc_check_and_its_delete_keeps_its_blob(db, tmp_path, batch):
    """Issue #31 finding 9: collection found a blob dead, then a publish of the same bytes renewed it and
    committed, then collection deleted it: the new version had no bytes. Real threads: collection is paused
    inside its delete while the publish runs; the publish must end with its blob stored. A batch takes its
    holds in one pipelined round trip, then stores again what collection deleted before them."""
    import threading

    from resources.publisher import PublishRequest

    root = tmp_path / "blobs"
    publisher = Publisher(db, BlobStore(str(root)))
    data = b"bytes an orphan left behind"
    digest = publisher.blobs.put(data)  # an orphan: no version needs it
    _age(root, 2 * 3600)
    gc_blobs = BlobStore(str(root))
    paused, resume, published = threading.Event(), threading.Event(), threading.Event()
    real_delete = gc_blobs.delete

    def slow_delete(path):
        paused.set()
        assert resume.wait(30)
        real_delete(path)

    gc_blobs.delete = slow_delete
    results: dict[str, object] = {}

    def collect():
        results["gc"] = collect_blobs(db, gc_blobs, window_seconds=0)

    def publish():
        if batch:
            (results["publish"],) = publisher.publish_many("acme", [PublishRequest("doc.md", data, "doc.md")])
        else:
            results["publish"] = publisher.publish("acme", "doc.md", data, "doc.md")
        published.set()

    gc = threading.Thread(target=collect)
    gc.start()
    assert paused.wait(30)  # collection checked the blob (dead) and is about to delete it
    writer = threading.Thread(target=publish)
    writer.start()
    published.wait(1.0)  # give the publish the time to renew and commit, as it could before the fix
    resume.set()
    gc.join(30)
    writer.join(30)
    assert results["publish"].content_hash == digest
    assert publisher.blobs.get(digest) == data  # the committed version has its bytes
    assert collect_blobs(db, publisher.blobs, window_seconds=0).blobs_deleted == 0  # and a later pass keeps them


def test_collection_leaves_a_blob_whose_publish_is_in_flight_for_the_next_pass(db, tmp_path):
    """The lock is not waited for: a blob a publish holds (stored, not committed yet) is skipped, not deleted."""
    root = tmp_path / "blobs"
    blobs = BlobStore(str(root))
    digest = blobs.put(b"held bytes")
    _age(root, 2 * 3600)
    with db.transaction() as tx:
        tx.fetch_one("blob_hold", {"content_hash": digest})  # a publish between its put and its commit
        assert collect_blobs(db, blobs, window_seconds=0).blobs_deleted == 0
    assert digest in _blob_files(root)
    assert collect_blobs(db, blobs, window_seconds=0).blobs_deleted == 1  # the publish never committed: an orphan
