"""Metadata and allow lists on versions (issue 30, items 1 and 3): part of a version's identity; a change of
them alone is indexed by copying the previous version's chunks and vectors (no parse, no embedding), through
a run or through the fast path in the publishing process; the pointer takes them at the instant it flips."""

from __future__ import annotations

import psycopg
import pytest

from pipelines.domain.errors import InvalidMetadata
from pipelines.domain.metadata import EVERYTHING, ReadScope
from resources.chunk_copy import FastPublish
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder
from resources.publisher import Publisher, PublishRequest
from resources.search import search
from resources.task_queue import TaskQueue
from tests.integration.test_delete import CountingBlobs, index, key_of, rows, start_run

POLICY = "\n\n".join(f"Clause {i}. Salary bands of grade {i} are reviewed every {i % 5 + 1} years." for i in range(10))
QUERY = "salary bands review"


def embedded(kb) -> int:
    """Texts the fake model embedded so far (it records each call's batch size)."""
    return sum(kb["fake"].calls)


@pytest.fixture
def kb(db, tmp_path):
    blobs = CountingBlobs(str(tmp_path / "blobs"))
    queue = TaskQueue(db, lease_seconds=60)
    return {"blobs": blobs, "publisher": Publisher(db, blobs), "queue": queue, "fake": FakeEmbedder(model_name=DEFAULT_MODEL_NAME),
            "fast": Publisher(db, blobs, fast=FastPublish(db, queue))}


def hits(db, kb, read=EVERYTHING, mode="hybrid", query=QUERY):
    return search(db, kb["fake"], query, tenant_id="acme", k=50, mode=mode, read=read)


def test_metadata_and_allow_list_are_part_of_the_version(kb, db_url):
    pub = kb["publisher"]
    v1 = pub.publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"dept": "hr", "year": 2026})
    assert (v1.version, v1.created, v1.metadata) == (1, True, {"dept": "hr", "year": 2026})
    again = pub.publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"year": 2026, "dept": "hr"})
    assert (again.version, again.created) == (1, False), "same bytes, same metadata (any key order): same version"
    v2 = pub.publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"dept": "hr", "year": 2027})
    v3 = pub.publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"dept": "hr", "year": 2027},
                     allow=["group:hr", "user:alice", "group:hr"])
    assert (v2.version, v3.version, v3.allow) == (2, 3, ["group:hr", "user:alice"])
    v4 = pub.publish("acme", "policy", POLICY.encode(), "policy.md")
    assert (v4.version, v4.metadata, v4.allow) == (4, {}, None), "no metadata is metadata too: a new version"
    assert rows(db_url, "SELECT version_number, metadata, allow_principals FROM document_version ORDER BY 1") == [
        (1, {"dept": "hr", "year": 2026}, None), (2, {"dept": "hr", "year": 2027}, None),
        (3, {"dept": "hr", "year": 2027}, ["group:hr", "user:alice"]), (4, {}, None)]
    for bad in ({"bad key": 1}, {"x": {"nested": 1}}, {"x": float("nan")}, {"when": "2026-02-30"}):
        with pytest.raises(InvalidMetadata):
            pub.publish("acme", "policy", b"other", "policy.md", metadata=bad)
    with pytest.raises(InvalidMetadata):
        pub.publish("acme", "policy", b"other", "policy.md", allow=[])
    assert rows(db_url, "SELECT count(*) FROM document_version")[0][0] == 4, "a refused publish records nothing"


def test_a_metadata_only_change_copies_chunks_and_vectors_through_the_run(db, db_url, kb):
    pub = kb["publisher"]
    v1 = pub.publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"dept": "hr"})
    index(db, db_url, kb, v1.task_id, "policy", 1)
    chunks_v1 = rows(db_url, "SELECT ordinal, text, embed_digest, embedding::text FROM chunk WHERE version_number = 1"
                             " ORDER BY ordinal")
    assert chunks_v1 and embedded(kb) > 0
    kb["fake"].calls.clear()
    kb["blobs"].reads.clear()

    v2 = pub.publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"dept": "finance"},
                     allow=["group:finance"])
    run = start_run(db, kb, v2.task_id, "run-meta")
    key = key_of(db_url, "policy", 2)
    assert run.models([key]) == set(), "a metadata-only change loads no model"
    steps = {}
    for step in (run.parse, run.chunk, run.embed, run.publish):
        (steps[step.__name__],) = step([key])[key]
    assert steps["parse"].details["copied_from"] == 1 and steps["embed"].details["embedded"] == 0
    assert steps["publish"].details["chunk_count"] == len(chunks_v1)
    assert kb["blobs"].reads == [] and embedded(kb) == 0, "no bytes read, nothing embedded"
    chunks_v2 = rows(db_url, "SELECT ordinal, text, embed_digest, embedding::text FROM chunk WHERE version_number = 2"
                             " ORDER BY ordinal")
    assert chunks_v2 == chunks_v1
    ids = rows(db_url, "SELECT count(DISTINCT chunk_id) FROM chunk")[0][0]
    assert ids == 2 * len(chunks_v1), "the copies have ids of their own version (invariant 5)"
    got = hits(db, kb)
    assert {(h.document_id, h.version_number) for h in got} == {("policy", 2)}
    assert all(h.metadata == {"dept": "finance"} for h in got)
    assert hits(db, kb, ReadScope.of(["group:hr"])) == [], "the narrowed allow list took effect with the flip"
    assert hits(db, kb, ReadScope.of(["group:finance"])) and hits(db, kb, ReadScope()) == []
    lexical_rows = rows(db_url, "SELECT version_number, count(*) FROM lexical_chunk GROUP BY 1 ORDER BY 1")
    assert lexical_rows == [(1, len(chunks_v1)), (2, len(chunks_v1))]


def test_the_fast_path_publishes_metadata_changes_and_deletes_without_a_run(db, db_url, kb):
    v1 = kb["publisher"].publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"dept": "hr"})
    index(db, db_url, kb, v1.task_id, "policy", 1)
    kb["fake"].calls.clear()
    kb["blobs"].reads.clear()
    fast = kb["fast"]
    v2 = fast.publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"dept": "hr"}, allow=["group:hr"])
    assert (v2.version, v2.status) == (2, "SUCCEEDED"), "searchable before publish() returned"
    assert embedded(kb) == 0 and kb["blobs"].reads == []
    owner = rows(db_url, "SELECT lease_owner FROM task_event WHERE task_id = %s AND to_status = 'SUCCEEDED'",
                 [v2.task_id])[0][0]
    assert owner.startswith("fast:")
    assert {h.version_number for h in hits(db, kb, ReadScope.of(["group:hr"]))} == {2}
    assert hits(db, kb, ReadScope.of(["user:bob"])) == []

    new_bytes = fast.publish("acme", "policy", (POLICY + "\n\nClause 99. New.").encode(), "policy.md")
    assert new_bytes.status == "PENDING", "new bytes need a run: the fast path leaves them"

    deleted = fast.delete("acme", "policy")
    assert (deleted.version, deleted.status) == (4, "SUCCEEDED")
    assert hits(db, kb) == []
    tombstone = rows(db_url, "SELECT metadata, allow_principals FROM document_version WHERE version_number = 4")
    assert tombstone == [({}, None)], "the tombstone keeps the latest version's metadata and allow list"
    # The content version 3 finishing after its tombstone never resurrects the document.
    index(db, db_url, kb, new_bytes.task_id, "policy", 3)
    assert hits(db, kb) == []


def test_a_batch_of_metadata_changes_is_fast_published_with_one_copy_source_lookup(db, db_url, kb, monkeypatch):
    """publish_many hands its committed versions to the fast path together: one chunk_copy_sources statement for
    the batch, each metadata-only change SUCCEEDED before it returns, new bytes left PENDING for a run."""
    import resources.chunk_copy as chunk_copy
    from resources.publisher import PublishRequest

    for doc in ("a", "b"):
        v1 = kb["publisher"].publish("acme", doc, f"{doc}: {POLICY}".encode(), "policy.md")
        index(db, db_url, kb, v1.task_id, doc, 1)
    lookups = []
    real = chunk_copy.copy_sources
    monkeypatch.setattr(chunk_copy, "copy_sources", lambda db, keys: lookups.append(len(keys)) or real(db, keys))
    out = kb["fast"].publish_many("acme", [
        PublishRequest("a", f"a: {POLICY}".encode(), "policy.md", metadata={"dept": "hr"}),
        PublishRequest("b", f"b: {POLICY}".encode(), "policy.md", allow=["group:hr"]),
        PublishRequest("c", b"new bytes", "c.md")])
    assert [(o.document_id, o.version, o.status) for o in out] == [("a", 2, "SUCCEEDED"), ("b", 2, "SUCCEEDED"),
                                                                   ("c", 1, "PENDING")]
    assert lookups == [3]
    assert {(h.document_id, h.version_number) for h in hits(db, kb, ReadScope.of(["group:hr"]))} == {("a", 2), ("b", 2)}


def test_a_first_version_asks_for_no_copy_source(db, db_url, kb, monkeypatch):
    """Nothing precedes version 1, so the fast path sends no chunk_copy_sources for it (one round trip less a new
    document over a slow link); version 2 with the same bytes still asks, and copies."""
    sent: list[str] = []
    real = type(db).fetch_all
    monkeypatch.setattr(type(db), "fetch_all",
                        lambda self, name, params=None: sent.append(name) or real(self, name, params))
    v1 = kb["fast"].publish("acme", "policy", POLICY.encode(), "policy.md")
    out = kb["fast"].publish_many("acme", [PublishRequest(d, f"{d}: {POLICY}".encode(), "policy.md") for d in "xy"])
    assert (v1.version, v1.status) == (1, "PENDING") and [o.status for o in out] == ["PENDING", "PENDING"]
    assert "chunk_copy_sources" not in sent, sent
    index(db, db_url, kb, v1.task_id, "policy", 1)
    v2 = kb["fast"].publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"dept": "legal"})
    assert (v2.version, v2.status, sent.count("chunk_copy_sources")) == (2, "SUCCEEDED", 1)


def test_the_fast_path_looks_up_no_profile_of_its_own(db, db_url, kb, monkeypatch):
    """index_task_ensure's rows carry their profile's dimension and a tombstone needs none, so neither a
    metadata-only change nor a delete sends index_profile_get outside the fenced publish (a round trip each over
    a slow link); both are published at once, as before."""
    v1 = kb["fast"].publish("acme", "policy", POLICY.encode(), "policy.md")
    index(db, db_url, kb, v1.task_id, "policy", 1)
    sent: list[str] = []
    real = type(db).fetch_one
    monkeypatch.setattr(type(db), "fetch_one",
                        lambda self, name, params=None: sent.append(name) or real(self, name, params))
    v2 = kb["fast"].publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"dept": "legal"})
    assert (v2.version, v2.status) == (2, "SUCCEEDED")
    assert {(h.document_id, h.version_number) for h in hits(db, kb)} == {("policy", 2)}
    gone = kb["fast"].delete("acme", "policy")
    assert (gone.outcome, gone.version, gone.status) == ("deleted", 3, "SUCCEEDED")
    assert hits(db, kb) == []
    assert "index_profile_get" not in sent, sent


def test_a_fast_path_that_loses_its_copy_source_leaves_the_task_unclaimed_and_a_run_parses(db, db_url, kb,
                                                                                            monkeypatch):
    """The copy is read before the claim (which goes in the publish transaction): a copy gone meanwhile leaves the
    task PENDING and unattempted, due now, for a run (at 050c180, which claimed first, it waited in RETRY_WAIT)."""
    v1 = kb["publisher"].publish("acme", "policy", POLICY.encode(), "policy.md")
    index(db, db_url, kb, v1.task_id, "policy", 1)
    import resources.chunk_copy as chunk_copy

    from resources.database import Session

    monkeypatch.setattr(chunk_copy, "load_copy", lambda *a, **k: None)  # retention won the race
    ran: list[str] = []
    real_run = Session._run
    monkeypatch.setattr(Session, "_run", lambda self, name, params=None: ran.append(name) or real_run(self, name, params))
    v2 = kb["fast"].publish("acme", "policy", POLICY.encode(), "policy.md", metadata={"dept": "legal"})
    assert v2.status == "PENDING"
    assert not {"task_claim", "task_fail"} & set(ran), ran  # nothing was claimed, so nothing to fail
    task = kb["queue"].get(v2.task_id)
    assert (task["status"], task["attempts"], task["error_code"]) == ("PENDING", 0, None)
    monkeypatch.undo()
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM chunk WHERE version_number = 1")  # now really gone
    out = index(db, db_url, kb, v2.task_id, "policy", 2, owner="run-2")
    assert "copied_from" not in out["parse"].details and out["publish"].details["chunk_count"] > 0
    assert {h.metadata.get("dept") for h in hits(db, kb)} == {"legal"}
