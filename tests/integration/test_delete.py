"""Delete (issue 29, item 1): a tombstone is version n+1 without bytes, indexed through the same claim, run
and fenced publish as any version. Its publish takes the document out of dense, lexical and hybrid search at
one instant; until then the previous version is served; the pointer never moves back; a publish after it
brings the document back; deleting twice, or what was never published, is idempotent and says so."""

from __future__ import annotations

import statistics
import time

import psycopg
import pytest

from resources.blob_store import BlobStore
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.profiles import create_profile
from resources.publisher import Publisher
from resources.search import search
from resources.task_queue import TaskQueue
from resources.verifier import verify

MODES = ("dense", "lexical", "hybrid")
REFUNDS = "\n\n".join(
    f"Section {i}. Refunds of order class {i} are paid within {i % 9 + 3} days by the refund desk."
    for i in range(12)
).encode()
HANDBOOK = b"The employee handbook covers holidays, travel expenses and the refund desk opening hours."
QUERY = "refund desk days"


class CountingBlobs(BlobStore):
    """The real blob store, counting reads: a tombstone's run must read none."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def get(self, digest: str) -> bytes:
        self.reads.append(digest)
        return super().get(digest)


@pytest.fixture
def kb(db, tmp_path):
    blobs = CountingBlobs(str(tmp_path / "blobs"))
    return {"blobs": blobs, "publisher": Publisher(db, blobs), "queue": TaskQueue(db, lease_seconds=60),
            "fake": FakeEmbedder(model_name=DEFAULT_MODEL_NAME)}


def rows(db_url: str, sql: str, params: list | None = None) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(sql, params or []).fetchall()


def key_of(db_url: str, document: str, version: int) -> str:
    return rows(db_url, "SELECT partition_key FROM document_version WHERE document_id = %s AND version_number = %s",
                [document, version])[0][0]


def start_run(db, kb, task_id: int, owner: str) -> IndexingRun:
    claimed = kb["queue"].claim_task(task_id, owner)
    assert claimed is not None
    return IndexingRun(db=db, queue=kb["queue"], keeper=LeaseKeeper(kb["queue"]), owner=owner, blobs=kb["blobs"],
                       embedder_for=lambda model: kb["fake"],
                       tagged=[(claimed.lease.task_id, claimed.lease.attempt)], batch_size=16)


def index(db, db_url, kb, task_id: int, document: str, version: int, owner: str = "run") -> dict:
    run = start_run(db, kb, task_id, owner)
    key = key_of(db_url, document, version)
    out = {}
    for step in (run.parse, run.chunk, run.embed, run.publish):
        (out[step.__name__],) = step([key])[key]
    return out


def found(db, kb, mode: str, query: str = QUERY) -> set[tuple[str, int]]:
    return {(h.document_id, h.version_number) for h in search(db, kb["fake"], query, tenant_id="acme", k=50, mode=mode)}


def documents_in_every_mode(db, kb) -> dict[str, set[str]]:
    return {mode: {d for d, _ in found(db, kb, mode)} for mode in MODES}


def lexical_chunks_counted(db_url: str) -> int:
    """The BM25 statistics' chunk count (term -1) of the tenant under the active profile."""
    got = rows(db_url, "SELECT df FROM lexical_term_stats WHERE tenant_id = 'acme' AND term = -1")
    return got[0][0] if got else 0


def test_the_tombstones_publish_takes_the_document_out_of_every_mode_and_not_before(db, db_url, kb):
    v1 = kb["publisher"].publish("acme", "refunds", REFUNDS, "refunds.txt")
    other = kb["publisher"].publish("acme", "handbook", HANDBOOK, "handbook.txt")
    index(db, db_url, kb, v1.task_id, "refunds", 1)
    index(db, db_url, kb, other.task_id, "handbook", 1)
    assert documents_in_every_mode(db, kb) == {m: {"refunds", "handbook"} for m in MODES}
    handbook_chunks = rows(db_url, "SELECT count(*) FROM chunk WHERE document_id = 'handbook'")[0][0]
    refunds_chunks = rows(db_url, "SELECT count(*) FROM chunk WHERE document_id = 'refunds'")[0][0]
    assert lexical_chunks_counted(db_url) == handbook_chunks + refunds_chunks

    deleted = kb["publisher"].delete("acme", "refunds")
    assert (deleted.outcome, deleted.version, deleted.status, deleted.created) == ("deleted", 2, "PENDING", True)
    assert rows(db_url, "SELECT kind, content_hash, byte_size FROM document_version WHERE document_id = 'refunds'"
                        " ORDER BY version_number") == [("content", v1.content_hash, len(REFUNDS)), ("tombstone", None, 0)]
    # Until the tombstone's publish the previous version is served, in every mode.
    assert all(("refunds", 1) in found(db, kb, mode) for mode in MODES)

    kb["blobs"].reads.clear()
    run = start_run(db, kb, deleted.task_id, "run-delete")
    key = key_of(db_url, "refunds", 2)
    assert run.models([key]) == set()  # a run of tombstones loads no model
    for step in (run.parse, run.chunk, run.embed):
        (result,) = step([key])[key]
        assert result.outcome == "ok" and result.details.get("tombstone") is True
        assert all(("refunds", 1) in found(db, kb, mode) for mode in MODES), f"gone before publish ({step.__name__})"
    (published,) = run.publish([key])[key]
    assert kb["blobs"].reads == []  # no bytes read for a delete
    assert (published.outcome, published.details["chunk_count"], published.details["pointer_version"]) == ("ok", 0, 2)

    assert documents_in_every_mode(db, kb) == {m: {"handbook"} for m in MODES}
    assert {d for d, _ in found(db, kb, "lexical", "refunds order class section")} == {"handbook"}
    task = kb["queue"].get(deleted.task_id)
    assert (task["status"], task["chunk_count"]) == ("SUCCEEDED", 0)
    assert rows(db_url, "SELECT version_number, chunk_count FROM search_pointer WHERE document_id = 'refunds'") == [(2, 0)]
    # The BM25 statistics no longer count the deleted document; its old chunks stay for the rollback window.
    assert lexical_chunks_counted(db_url) == handbook_chunks
    assert rows(db_url, "SELECT count(*) FROM chunk WHERE document_id = 'refunds' AND version_number = 1")[0][0] == refunds_chunks
    report = verify(db)
    assert report.ok, report.to_dict()
    assert "search_pointer_tombstone_chunks" in report.checked


def test_a_version_that_finishes_after_a_later_tombstone_never_resurrects_the_document(db, db_url, kb):
    v1 = kb["publisher"].publish("acme", "refunds", REFUNDS, "refunds.txt")
    slow = start_run(db, kb, v1.task_id, "run-slow")
    key1 = key_of(db_url, "refunds", 1)
    for step in (slow.parse, slow.chunk, slow.embed):
        step([key1])
    deleted = kb["publisher"].delete("acme", "refunds")
    index(db, db_url, kb, deleted.task_id, "refunds", 2, owner="run-delete")
    (late,) = slow.publish([key1])[key1]
    assert late.details["superseded"] is True and late.details["pointer_version"] == 2
    assert documents_in_every_mode(db, kb) == {m: set() for m in MODES}
    assert rows(db_url, "SELECT version_number FROM search_pointer WHERE document_id = 'refunds'") == [(2,)]
    assert rows(db_url, "SELECT count(*) FROM chunk")[0][0] == 0  # the superseded version wrote nothing
    assert verify(db).ok


def test_a_publish_after_a_delete_is_the_next_version_and_brings_the_document_back(db, db_url, kb):
    v1 = kb["publisher"].publish("acme", "refunds", REFUNDS, "refunds.txt")
    index(db, db_url, kb, v1.task_id, "refunds", 1)
    deleted = kb["publisher"].delete("acme", "refunds")
    index(db, db_url, kb, deleted.task_id, "refunds", 2)
    assert documents_in_every_mode(db, kb) == {m: set() for m in MODES}
    again = kb["publisher"].publish("acme", "refunds", REFUNDS, "refunds.txt")  # the same bytes as v1
    assert (again.version, again.created) == (3, True)
    index(db, db_url, kb, again.task_id, "refunds", 3)
    assert all(found(db, kb, mode) == {("refunds", 3)} for mode in MODES)
    assert lexical_chunks_counted(db_url) == rows(
        db_url, "SELECT count(*) FROM chunk WHERE document_id = 'refunds' AND version_number = 3")[0][0]
    assert verify(db).ok


def test_deleting_what_was_never_published_or_is_already_deleted_is_idempotent_and_says_so(db, db_url, kb):
    missing = kb["publisher"].delete("acme", "never-published")
    assert (missing.outcome, missing.task_id, missing.version) == ("not_found", None, None)
    assert "nothing to delete" in missing.message
    assert rows(db_url, "SELECT count(*) FROM document")[0][0] == 0  # nothing created for it

    v1 = kb["publisher"].publish("acme", "refunds", REFUNDS, "refunds.txt")
    first = kb["publisher"].delete("acme", "refunds")
    second = kb["publisher"].delete("acme", "refunds")
    assert (first.outcome, second.outcome) == ("deleted", "already_deleted")
    assert (second.task_id, second.version, second.created) == (first.task_id, 2, False)
    assert "already deleted" in second.message
    index(db, db_url, kb, v1.task_id, "refunds", 1)  # v1 finishes first: served until the tombstone's publish
    assert all(found(db, kb, mode) == {("refunds", 1)} for mode in MODES)
    index(db, db_url, kb, first.task_id, "refunds", 2)
    third = kb["publisher"].delete("acme", "refunds")
    assert (third.outcome, third.task_id, third.status) == ("already_deleted", first.task_id, "SUCCEEDED")
    assert rows(db_url, "SELECT count(*) FROM document_version")[0][0] == 2
    assert rows(db_url, "SELECT count(*) FROM index_task")[0][0] == 2
    assert verify(db).ok


def test_a_delete_gets_a_task_under_every_target_profile(db, db_url, kb):
    kb["publisher"].publish("acme", "refunds", REFUNDS, "refunds.txt")
    create_profile(db, "shadow-b", model="fake-b", chunk_tokens=48, overlap=8)
    deleted = kb["publisher"].delete("acme", "refunds")
    assert sorted(t["profile"] for t in deleted.tasks) == ["minilm-v1", "shadow-b"]
    assert deleted.profile == "minilm-v1"
    assert rows(db_url, "SELECT profile, status FROM index_task WHERE version_number = 2 ORDER BY profile") == [
        ("minilm-v1", "PENDING"), ("shadow-b", "PENDING")]


def test_verify_reports_a_pointer_naming_a_tombstone_that_has_chunks(db, db_url, kb):
    v1 = kb["publisher"].publish("acme", "refunds", REFUNDS, "refunds.txt")
    index(db, db_url, kb, v1.task_id, "refunds", 1)
    deleted = kb["publisher"].delete("acme", "refunds")
    index(db, db_url, kb, deleted.task_id, "refunds", 2)
    assert verify(db).ok
    with psycopg.connect(db_url, autocommit=True) as conn:  # a chunk smuggled under the tombstone
        conn.execute("INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal,"
                     " heading_path, text, token_count, content_digest, embedding)"
                     " SELECT chunk_id || '-forged', tenant_id, document_id, 2, profile, ordinal, heading_path, text,"
                     " token_count, content_digest, embedding FROM chunk WHERE version_number = 1 AND ordinal = 0")
    report = verify(db)
    assert "search_pointer_tombstone_chunks" in {v.check for v in report.violations}


def test_retention_removes_a_deleted_documents_chunks_after_the_window_like_any_superseded_version(db, db_url, kb):
    from datetime import UTC, datetime, timedelta

    from resources.retention import apply_retention

    v1 = kb["publisher"].publish("acme", "refunds", REFUNDS, "refunds.txt")
    index(db, db_url, kb, v1.task_id, "refunds", 1)
    deleted = kb["publisher"].delete("acme", "refunds")
    index(db, db_url, kb, deleted.task_id, "refunds", 2)
    assert apply_retention(db, window_seconds=3600).removed_versions == []  # within the rollback window: kept
    assert rows(db_url, "SELECT count(*) FROM chunk WHERE version_number = 1")[0][0] > 0
    later = datetime.now(UTC) + timedelta(hours=2)
    report = apply_retention(db, window_seconds=3600, now=later)
    assert report.removed_versions == [("acme", "refunds", "minilm-v1", 1)]
    assert rows(db_url, "SELECT count(*) FROM chunk")[0][0] == 0
    assert rows(db_url, "SELECT count(*) FROM lexical_chunk")[0][0] == 0
    assert rows(db_url, "SELECT version_number, chunk_count FROM search_pointer") == [(2, 0)]
    assert documents_in_every_mode(db, kb) == {m: set() for m in MODES}
    assert verify(db).ok


def test_a_model_migration_carries_deletes_and_rollback_keeps_them_deleted(db, db_url, kb):
    """A document deleted while a shadow profile is being built: its tombstone gets a task in both profiles; a
    document deleted before the shadow existed is backfilled as its tombstone (its latest version); after the
    switch and after a rollback, neither comes back in any mode."""
    from resources.profiles import activate_profile, request_backfill, rollback_profile

    kb["fake"] = FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    gone_early = kb["publisher"].publish("acme", "handbook", HANDBOOK, "handbook.txt")
    index(db, db_url, kb, gone_early.task_id, "handbook", 1)
    early = kb["publisher"].delete("acme", "handbook")
    index(db, db_url, kb, early.task_id, "handbook", 2)
    v1 = kb["publisher"].publish("acme", "refunds", REFUNDS, "refunds.txt")
    index(db, db_url, kb, v1.task_id, "refunds", 1)

    create_profile(db, "shadow-b", model="fake-b", chunk_tokens=48, overlap=8)
    request_backfill(db, "shadow-b")
    backfilled = kb["queue"].claim_backfill("backfill", limit=10)
    by_document = {t.document_id: t for t in backfilled}
    assert by_document["handbook"].version_number == 2, "a deleted document is backfilled as its tombstone"
    deleted = kb["publisher"].delete("acme", "refunds")
    shadow_task = next(t["task_id"] for t in deleted.tasks if t["profile"] == "shadow-b")

    fakes = {"fake-b": FakeEmbedder(model_name="fake-b"), DEFAULT_MODEL_NAME: kb["fake"]}

    def run_claimed(task_id: int, attempt: int, document: str, version: int, owner: str) -> None:
        run = IndexingRun(db=db, queue=kb["queue"], keeper=LeaseKeeper(kb["queue"]), owner=owner, blobs=kb["blobs"],
                          embedder_for=fakes.__getitem__, tagged=[(task_id, attempt)], granted_by="backfill",
                          batch_size=16)
        key = key_of(db_url, document, version)
        for step in (run.parse, run.chunk, run.embed, run.publish):
            (result,) = step([key])[key]
            assert result.outcome == "ok", (step.__name__, result)

    for t in backfilled:
        run_claimed(t.lease.task_id, t.lease.attempt, t.document_id, t.version_number, f"shadow-{t.document_id}")
    claimed = kb["queue"].claim_task(shadow_task, "backfill")
    run_claimed(shadow_task, claimed.lease.attempt, "refunds", 2, "shadow-refunds-delete")
    index(db, db_url, kb, deleted.task_id, "refunds", 2, owner="active-delete")
    assert rows(db_url, "SELECT profile, document_id, version_number, chunk_count FROM search_pointer "
                        "ORDER BY 1, 2") == [("minilm-v1", "handbook", 2, 0), ("minilm-v1", "refunds", 2, 0),
                                             ("shadow-b", "handbook", 2, 0), ("shadow-b", "refunds", 2, 0)]
    activate_profile(db, "shadow-b", force=True)
    for mode in MODES:
        assert search(db, fakes["fake-b"], QUERY, tenant_id="acme", k=20, mode=mode) == []
    rollback_profile(db)
    assert documents_in_every_mode(db, kb) == {m: set() for m in MODES}
    assert verify(db).ok


def test_a_delete_waits_twice_and_reads_its_tasks_with_the_commit(db, db_url, kb, pipeline_waits):
    """A delete's transaction waits for the lock with the latest version, then for COMMIT, which brings its tasks
    (3 waits while it read them before COMMIT); an already deleted document and one never published wait as long."""
    kb["publisher"].publish("acme", "refunds", b"Refunds are paid within 30 days.", "refunds.txt")
    before = pipeline_waits[0]
    deleted = kb["publisher"].delete("acme", "refunds")
    assert (deleted.outcome, deleted.version, deleted.status, deleted.created) == ("deleted", 2, "PENDING", True)
    assert [t["profile"] for t in deleted.tasks] == ["minilm-v1"] and deleted.task_id == deleted.tasks[0]["task_id"]
    assert pipeline_waits[0] - before == 2
    before = pipeline_waits[0]
    again = kb["publisher"].delete("acme", "refunds")
    assert (again.outcome, again.version, again.task_id) == ("already_deleted", 2, deleted.task_id)
    assert pipeline_waits[0] - before == 2
    before = pipeline_waits[0]
    assert kb["publisher"].delete("acme", "never").outcome == "not_found"
    assert pipeline_waits[0] - before == 2


def test_a_fast_path_delete_waits_four_times_and_runs_no_statement_alone(db, db_url, kb, pipeline_waits,
                                                                         monkeypatch):
    """The delete's transaction (2 waits), then the fenced publish of its tombstone with the task's claim sent in it
    (2 waits): every statement goes in a pipelined transaction (the claim ran alone, one wait more, at 050c180)."""
    from resources.chunk_copy import fast_publish_for
    from resources.database import Session

    kb["publisher"].publish("acme", "refunds", b"Refunds are paid within 30 days.", "refunds.txt")
    alone: list[str] = []
    real_run = Session._run

    def run(self, name, params):
        if self.conn._pipeline is None:
            alone.append(name)
        return real_run(self, name, params)

    monkeypatch.setattr(Session, "_run", run)
    publisher = Publisher(db, kb["blobs"], fast=fast_publish_for(db))
    before = pipeline_waits[0]
    deleted = publisher.delete("acme", "refunds")
    assert (deleted.outcome, deleted.version, deleted.status) == ("deleted", 2, "SUCCEEDED")
    assert (pipeline_waits[0] - before, alone) == (4, [])
    assert rows(db_url, "SELECT status, attempts FROM index_task WHERE task_id = %s", [deleted.task_id]) == [
        ("SUCCEEDED", 1)]
    assert rows(db_url, "SELECT to_status, message FROM task_event WHERE task_id = %s AND kind = 'transition' "
                        "ORDER BY event_id", [deleted.task_id])[:2] == [
        ("PENDING", "published"), ("RUNNING", "claimed by the fast path: published without a run")]
    assert rows(db_url, "SELECT version_number, chunk_count FROM search_pointer WHERE document_id = 'refunds'") == [
        (2, 0)]


def test_a_delete_with_no_profile_to_index_it_is_refused_by_the_server_and_commits_nothing(db, db_url, kb):
    """As a publish (``publish_refusals``, sent with COMMIT): no tombstone, task or charge commits."""
    from pipelines.domain.errors import InvalidRequest
    from resources.publisher import NO_ACTIVE_PROFILE

    kb["publisher"].publish("acme", "refunds", b"Refunds are paid within 30 days.", "refunds.txt")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET is_active = false")
    with pytest.raises(InvalidRequest) as caught:
        kb["publisher"].delete("acme", "refunds")
    assert caught.value.message == NO_ACTIVE_PROFILE
    assert rows(db_url, "SELECT (SELECT count(*) FROM document_version), (SELECT count(*) FROM index_task), "
                        "(SELECT live_versions FROM tenant_storage)") == [(1, 1, 1)]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET is_active = true WHERE name = 'minilm-v1'")
    assert kb["publisher"].delete("acme", "refunds").outcome == "deleted"


def test_a_delete_over_a_slow_link_waits_twice_and_its_fast_publish_a_few_more(db, db_url, kb, tmp_path):
    """bench/relay.py at 10 ms each way: a delete's transaction is pipelined (BEGIN, the lock and the latest
    version; the tombstone, its charge, its tasks and COMMIT), so it costs ~2.2 round trips (~3.2 while it read its
    tasks before COMMIT). With the fast path (as `kbindex delete` and the API delete) it also claims the task and
    publishes the tombstone through the fenced publish, pipelined too, its profile and its pointer move read with the
    fence, its count and completion checks made by the server with COMMIT and the task's claim sent with the fence:
    ~4.5 in all (~5.6 while the claim waited alone, ~7.8 while the pointer move did too; test_index_sink.py counts
    the fenced publish's waits exactly). A round trip is (median time through the relay - median time direct) /
    20 ms, relay and direct deletes alternating: the machine's own work, which grows with its load (CI once
    measured 6.9 without taking it away), is not counted. Each delete still records its tombstone and task, and a
    second finds it."""
    from contextlib import ExitStack

    from bench.relay import url_through_relay
    from resources.chunk_copy import fast_publish_for
    from resources.database import Database

    names = [f"doc{i}" for i in range(24)]
    for name in names:
        kb["publisher"].publish("acme", name, f"text of {name}".encode(), f"{name}.txt")
    per_delete = {}
    with ExitStack() as stack:
        links = {"relay": stack.enter_context(Database(url_through_relay(db_url, 10, stack), max_size=1)),
                 "direct": stack.enter_context(Database(db_url, max_size=1))}
        for side, batch in (("plain", names[:12]), ("fast path", names[12:])):
            publishers = {link: Publisher(database, BlobStore(str(tmp_path / "blobs")),
                                          fast=fast_publish_for(database) if side == "fast path" else None)
                          for link, database in links.items()}
            seconds = {"relay": [], "direct": []}
            # the first of each connects its pool; then relay and direct alternate, so both see the same load
            for n, name in enumerate(batch):
                link = "relay" if n % 2 == 0 else "direct"
                started = time.perf_counter()
                outcome = publishers[link].delete("acme", name)
                if n >= 2:
                    seconds[link].append(time.perf_counter() - started)
                status = "PENDING" if side == "plain" else "SUCCEEDED"
                assert (outcome.outcome, outcome.version, outcome.status) == ("deleted", 2, status)
            # the same deletes timed direct are taken away: the machine's own work is not a round trip
            per_delete[side] = (statistics.median(seconds["relay"]) - statistics.median(seconds["direct"])) / 0.020
    shown = ", ".join(f"{side} {n:.1f}" for side, n in per_delete.items()) + " round trips a delete"
    print(shown)  # `pytest -s ... -k slow_link` shows the figures
    assert per_delete["plain"] < 3 and per_delete["fast path"] < 5.2, shown
    assert kb["publisher"].delete("acme", names[1]).outcome == "already_deleted"
    assert rows(db_url, "SELECT count(*) FROM document_version WHERE kind = 'tombstone'") == [(24,)]
