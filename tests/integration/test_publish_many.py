"""publish_many: a batch of one tenant's documents in one transaction, a refused document alone refused."""

from __future__ import annotations

import threading

import psycopg
import pytest

from pipelines.domain.errors import IndexWriteFailed, InvalidMetadata, InvalidRequest, QuotaExceeded
from resources.blob_store import BlobStore, content_hash
from resources.database import DatabaseError
from resources.publisher import PublishRequest, PublishResult, Publisher


@pytest.fixture
def blobs(tmp_path):
    return BlobStore(str(tmp_path / "blobs"))


@pytest.fixture
def publisher(db, blobs):
    return Publisher(db, blobs)


def _rows(db_url, sql, params=()):
    with psycopg.connect(db_url) as conn:
        return conn.execute(sql, params).fetchall()


def test_a_batch_records_what_one_publish_at_a_time_would(publisher, db_url):
    out = publisher.publish_many("acme", [PublishRequest(f"d{i}.md", f"# D{i}\nbody {i}".encode(), f"d{i}.md")
                                          for i in range(5)])
    assert [(r.document_id, r.version, r.status, r.created) for r in out] == [
        (f"d{i}.md", 1, "PENDING", True) for i in range(5)]
    one = publisher.publish("acme", "d9.md", b"# D9", "d9.md")
    kept = _rows(db_url, "SELECT document_id, media_type, filename, byte_size FROM document_version ORDER BY 1")
    assert kept[0] == ("d0.md", "text/markdown", "d0.md", len(b"# D0\nbody 0")) and len(kept) == 6
    events = _rows(db_url, "SELECT task_id, from_status, to_status FROM task_event ORDER BY task_id")
    assert events == [(r.task_id, None, "PENDING") for r in [*out, one]]
    assert _rows(db_url, "SELECT live_versions FROM tenant_storage WHERE tenant_id = 'acme'") == [(6,)]


def test_the_batch_commits_at_once(publisher, db, db_url):
    """Every version and task commits in one transaction: a reader never sees part of a batch."""
    seen: list[int] = []

    def look(tx):  # each document's hook runs inside the batch's transaction, after its version and tasks
        with psycopg.connect(db_url) as other:  # another session, mid-batch
            seen.append(other.execute("SELECT count(*) FROM index_task").fetchone()[0])

    publisher.publish_many("acme", [PublishRequest(f"d{i}", f"text {i}".encode(), "d.txt", with_commit=look)
                                    for i in range(3)])
    assert seen == [0, 0, 0]
    assert _rows(db_url, "SELECT count(*) FROM index_task") == [(3,)]


def test_a_refused_document_is_refused_alone(publisher, db_url, blobs):
    out = publisher.publish_many("acme", [
        PublishRequest("ok-1", b"first", "a.txt"),
        PublishRequest("", b"no id", "b.txt"),
        PublishRequest("bad-meta", b"meta", "c.txt", metadata={"": 1}),
        PublishRequest("ok-2", b"second", "d.txt"),
    ])
    assert isinstance(out[0], PublishResult) and isinstance(out[3], PublishResult)
    assert isinstance(out[1], InvalidRequest) and isinstance(out[2], InvalidMetadata)
    assert out[2].code == "INVALID_METADATA"
    assert [r[0] for r in _rows(db_url, "SELECT document_id FROM document_version ORDER BY 1")] == ["ok-1", "ok-2"]
    assert not blobs.exists(content_hash(b"meta"))  # refused before its bytes were stored


def test_a_document_over_quota_inside_the_transaction_rolls_back_alone(db, db_url, blobs):
    """The in-transaction check refuses one document (its savepoint) and keeps the rest of the batch."""
    publisher = Publisher(db, blobs, quota_bytes=100, quota_versions=None)
    publisher.publish("acme", "a", b"x" * 60, "a.txt")
    real = db.fetch_one

    def stale(name, params=None):  # a stale pre-check: only the transaction's own check can refuse
        if name == "tenant_storage_get":
            return {"stored_bytes": 0, "live_versions": 0}
        return real(name, params)

    db.fetch_one = stale
    try:
        out = publisher.publish_many("acme", [PublishRequest("b", b"y" * 60, "b.txt"),
                                              PublishRequest("c", b"z" * 30, "c.txt")])
    finally:
        db.fetch_one = real
    assert [type(o) for o in out] == [QuotaExceeded, PublishResult]
    assert out[0].code == "QUOTA_EXCEEDED"
    assert [r[0] for r in _rows(db_url, "SELECT document_id FROM document_version ORDER BY 1")] == ["a", "c"]
    assert _rows(db_url, "SELECT stored_bytes, live_versions FROM tenant_storage") == [(90, 2)]


def test_the_quota_pre_check_counts_the_batch_and_stores_nothing_refused(db, db_url, blobs):
    publisher = Publisher(db, blobs, quota_bytes=10**9, quota_versions=2)
    out = publisher.publish_many("acme", [PublishRequest(f"d{i}", f"text {i}".encode(), "d.txt") for i in range(3)])
    assert [type(o) for o in out] == [PublishResult, PublishResult, QuotaExceeded]
    assert "versions quota of 2" in out[2].message
    assert not blobs.exists(content_hash(b"text 2"))
    again = publisher.publish_many("acme", [PublishRequest("d1", b"text 1", "d.txt")])  # the latest bytes: no refusal
    assert isinstance(again[0], PublishResult) and not again[0].created


def test_the_same_document_twice_makes_consecutive_versions(publisher):
    out = publisher.publish_many("acme", [PublishRequest("doc", b"one", "a.txt"), PublishRequest("other", b"x", "b.txt"),
                                          PublishRequest("doc", b"two", "a.txt"), PublishRequest("doc", b"two", "a.txt")])
    assert [(o.document_id, o.version, o.created) for o in out] == [
        ("doc", 1, True), ("other", 1, True), ("doc", 2, True), ("doc", 2, False)]
    assert out[2].task_id == out[3].task_id


def test_a_repeat_with_the_same_metadata_and_allow_list_adds_nothing_in_a_batch_or_across_batches(publisher):
    """The repeat check reads the stored version once per batch, then the batch's own new versions from memory:
    both must compare metadata and allow lists as the database returns them."""
    meta, allow = {"title": "Refunds", "pages": 3, "score": 1.5, "tags": ["a", "b"]}, ["user:alice", "group:ops"]

    def request(data: bytes = b"body", **changed) -> PublishRequest:
        return PublishRequest("doc", data, "a.txt", metadata=changed.get("metadata", meta),
                              allow=changed.get("allow", allow))

    first = publisher.publish_many("acme", [request(), request()])
    assert [(o.version, o.created) for o in first] == [(1, True), (1, False)]
    again = publisher.publish_many("acme", [request(), request(metadata={**meta, "pages": 4}), request(allow=None),
                                            request(allow=None)])
    assert [(o.version, o.created) for o in again] == [(1, False), (2, True), (3, True), (3, False)]
    assert publisher.publish("acme", "doc", b"body", "a.txt", metadata={**meta, "pages": 4}).version == 4


def test_a_database_failure_fails_the_whole_batch(publisher, db_url):
    """A statement fails at the second document: the first, already recorded, is rolled back with it."""
    def failing(tx):
        raise DatabaseError("database error OperationalError (08006)", sqlstate="08006")  # as translate_errors raises

    with pytest.raises(IndexWriteFailed):
        publisher.publish_many("acme", [PublishRequest(f"d{i}", f"t{i}".encode(), "d.txt",
                                                       with_commit=failing if i == 1 else None) for i in range(3)])
    assert _rows(db_url, "SELECT count(*) FROM document_version") == [(0,)]
    assert _rows(db_url, "SELECT count(*) FROM index_task") == [(0,)]


def test_a_server_error_in_a_statement_never_waited_for_fails_the_whole_batch(publisher, db, db_url, caplog):
    """The batch's transaction is pipelined: a hook's statement is sent, not waited for, and its server error
    (bigint overflow) surfaces at the commit. Nothing commits, the transaction rolls itself back before its
    connection goes back to the pool, and the next batch publishes."""
    def overflowing(tx):
        tx.execute("tenant_storage_charge", {"tenant_id": "acme", "byte_size": 2**63 - 1})

    with pytest.raises(IndexWriteFailed) as failed:
        publisher.publish_many("acme", [PublishRequest(f"d{i}", f"t{i}".encode(), "d.txt",
                                                       with_commit=overflowing if i == 2 else None) for i in range(3)])
    assert failed.value.data.get("sqlstate") == "22003"
    assert _rows(db_url, "SELECT count(*) FROM document_version") == [(0,)]
    assert _rows(db_url, "SELECT count(*) FROM tenant_storage WHERE live_versions > 0") == [(0,)]
    assert [r.getMessage() for r in caplog.records if "rolling back" in r.getMessage()] == []
    for _ in range(3):  # every pooled connection serves again
        out = publisher.publish_many("acme", [PublishRequest(f"d{i}", f"t{i}".encode(), "d.txt") for i in range(3)])
        assert all(isinstance(o, PublishResult) for o in out), out
    assert _rows(db_url, "SELECT count(*) FROM document_version") == [(3,)]


def test_concurrent_batches_in_opposite_orders_do_not_deadlock(db, blobs, db_url):
    """Documents are locked in id order whatever the request order: two batches over the same documents,
    one reversed, both finish, and each document's versions are consecutive."""
    ids = [f"doc-{i:03d}" for i in range(40)]
    errors: list[BaseException] = []

    def batch(order: list[str], tag: str) -> None:
        try:
            Publisher(db, blobs).publish_many("acme", [PublishRequest(d, f"{d} {tag}".encode(), "d.txt") for d in order])
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    def one_at_a_time(order: list[str]) -> None:  # publish: a document, then the tenant's totals
        try:
            for d in order:
                Publisher(db, blobs).publish("acme", d, f"{d} c".encode(), "d.txt")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=batch, args=(ids, "a")), threading.Thread(target=batch, args=(ids[::-1], "b")),
               threading.Thread(target=one_at_a_time, args=(ids[::-1],))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    versions = _rows(db_url, "SELECT document_id, array_agg(version_number ORDER BY version_number) "
                             "FROM document_version GROUP BY 1")
    assert len(versions) == 40 and all(v == [1, 2, 3] for _, v in versions)
    assert _rows(db_url, "SELECT stored_bytes, live_versions FROM tenant_storage") == [
        (sum(len(f"{d} {tag}".encode()) for d in ids for tag in "abc"), 120)]


def test_with_no_active_profile_the_whole_batch_is_refused(publisher, db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET is_active = false, building = false")
    out = publisher.publish_many("acme", [PublishRequest("a", b"x", "a.txt"), PublishRequest("", b"y", "b.txt"),
                                          PublishRequest("c", b"z", "c.txt")])
    assert [o.code for o in out] == ["INVALID_REQUEST"] * 3
    assert "no active index profile" in out[0].message and "no active index profile" not in out[1].message
    assert _rows(db_url, "SELECT count(*) FROM document_version") == [(0,)]
    assert _rows(db_url, "SELECT count(*) FROM tenant_storage WHERE live_versions > 0") == [(0,)]


def test_an_invalid_tenant_refuses_every_document(publisher, db_url):
    out = publisher.publish_many("acme corp", [PublishRequest("a", b"x", "a.txt"), PublishRequest("b", b"y", "b.txt")])
    assert [o.code for o in out] == ["INVALID_REQUEST", "INVALID_REQUEST"]
    assert _rows(db_url, "SELECT count(*) FROM document_version") == [(0,)]


def test_the_batch_reads_latest_versions_by_key_whatever_the_table_holds(publisher, db_url):
    """document_version_latest_many reads one backward primary-key step per document of the batch, custom and
    generic plan alike: beside 3,000 versions of other documents, 3 pages a document (index root, leaf, heap),
    against 1 in a table of three rows, and far fewer than the table holds."""
    import json as _json

    statement = __import__("sql").queries["document_version_latest_many"]
    params = {"tenant_id": "acme", "document_ids": ["a", "b", "c"]}

    def buffers(generic: bool) -> int:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("ANALYZE document_version")
            conn.execute("SET plan_cache_mode = " + ("force_generic_plan" if generic else "force_custom_plan"))
            query = statement.replace("%(tenant_id)s", "$1").replace("%(document_ids)s", "$2")
            cur = psycopg.ClientCursor(conn)  # parameters bound client-side: the server sees only PREPARE's own $n
            cur.execute(f"PREPARE latest_many(text, text[]) AS {query}")
            (plan,) = cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE latest_many(%s, %s)",
                                  (params["tenant_id"], params["document_ids"])).fetchone()
            plan = plan if isinstance(plan, list) else _json.loads(plan)
            top = plan[0]["Plan"]
            return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)

    publisher.publish_many("acme", [PublishRequest(d, f"text {d}".encode(), "d.txt") for d in "abc"])
    alone = [buffers(False), buffers(True)]
    for start in range(0, 3000, 1000):
        publisher.publish_many("other", [PublishRequest(f"o{i}", f"other {i}".encode(), "o.txt")
                                         for i in range(start, start + 1000)])
    beside = [buffers(False), buffers(True)]
    with psycopg.connect(db_url) as conn:
        (pages,) = conn.execute("SELECT pg_relation_size('document_version') / 8192").fetchone()
    print("latest_many buffers, custom / generic, alone and beside 3,000:", alone, beside, "table pages:", pages)
    # Per document an index root and leaf and its heap page (a scan of the versions would read ~all pages)
    assert all(b <= 3 * len(params["document_ids"]) < pages for b in beside), (alone, beside, pages)
