"""The fenced publish transaction: all of a version or nothing, forward-only pointer, stable rows (invariants 3-6)."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from pipelines.domain.chunking import Chunk, VersionIdentity, chunk_id, content_digest
from pipelines.domain.errors import (
    EmbeddingInvalidResponse,
    IndexWriteFailed,
    InternalError,
    LeaseLost,
    TaskCancelled,
)
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder, Fault, checked_embed
from resources.index_sink import IndexSink

PROFILE = "minilm-v1"


def make_chunks(tenant: str, document: str, version: int, texts: list[str], profile: str = PROFILE) -> list[Chunk]:
    """Chunks with the real stable ids (pipelines.domain.chunking.chunk_id), as the chunk step makes them."""
    identity = VersionIdentity(tenant, document, version, profile)
    out = []
    for i, text in enumerate(texts):
        heading = ("Policy", f"Section {i}")
        digest = content_digest(text)
        out.append(Chunk(chunk_id(identity, i, heading, digest), i, heading, None, text, text,
                         len(text.split()), digest))
    return out


def embed(chunks, embedder=None) -> np.ndarray:
    """Embed with the fake under the profile's name (the fake answering as the profile's model)."""
    embedder = embedder or FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    return checked_embed(
        embedder, [c.text for c in chunks], expected_model=DEFAULT_MODEL_NAME, expected_dim=384, batch_size=8
    )


def rows(db_url: str, tenant: str = "acme") -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(
            "SELECT chunk_id, document_id, version_number, ordinal, heading_path, text, content_digest, "
            "embedding::text, xmin::text FROM chunk WHERE tenant_id = %s ORDER BY document_id, version_number, ordinal",
            (tenant,),
        ).fetchall()


def pointer(db_url: str, document: str, tenant: str = "acme"):
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT version_number, task_id, chunk_count FROM search_pointer WHERE tenant_id = %s AND document_id = %s",
            (tenant, document),
        ).fetchone()
    return row


TEXTS = [f"Refunds for order type {i} are paid within {i + 3} days." for i in range(23)]


@pytest.fixture
def sink(db, queue) -> IndexSink:
    return IndexSink(db, queue, write_batch=10)


def claim_one(queue, owner: str = "w1"):
    (claimed,) = queue.claim(owner, limit=1)
    return claimed


def claim_reindex(db_url, queue, owner: str = "w1"):
    """A REINDEX task of acme/policy v1, claimed by id the way an operator's backfill run claims it."""
    with psycopg.connect(db_url) as conn:
        (task_id,) = conn.execute(
            "INSERT INTO index_task (tenant_id, document_id, version_number, task_type, profile) "
            "VALUES ('acme', 'policy', 1, 'REINDEX', %s) RETURNING task_id",
            (PROFILE,),
        ).fetchone()
    claimed = queue.claim_task(task_id, owner)
    assert claimed is not None
    return claimed


def test_publish_writes_all_chunks_moves_pointer_and_succeeds(db_url, sink, queue, publish_task):
    published = publish_task(document="policy")
    task = claim_one(queue)
    chunks = make_chunks("acme", "policy", task.version_number, TEXTS)
    outcome = sink.publish(task.lease, chunks, embed(chunks))
    assert outcome.chunk_count == 23 and not outcome.superseded and outcome.pointer_version == 1
    stored = rows(db_url)
    assert [r[0] for r in stored] == [c.chunk_id for c in chunks]
    assert stored[0][4] == ["Policy", "Section 0"]
    assert pointer(db_url, "policy") == (1, published.task_id, 23)
    row = queue.get(published.task_id)
    assert row["status"] == "SUCCEEDED" and row["chunk_count"] == 23


def test_the_fence_reads_the_tasks_profiles_in_its_own_wait(db_url, sink, queue, publish_task, monkeypatch):
    """The profile each version is checked against is sent with the fence and the pointer move
    (index_profile_of_tasks, task_lock_fenced, search_pointer_advance_fenced: one wait for the three in the
    pipelined transaction), never looked up on its own."""
    from resources import database

    publish_task(document="policy")
    task = claim_one(queue)
    chunks = make_chunks("acme", "policy", task.version_number, TEXTS[:3])
    sent: list[str] = []
    real_run = database.Session._run
    monkeypatch.setattr(database.Session, "_run",
                        lambda self, name, params: sent.append(name) or real_run(self, name, params))
    assert sink.publish(task.lease, chunks, embed(chunks)).chunk_count == 3
    assert sent[:3] == ["index_profile_of_tasks", "task_lock_fenced", "search_pointer_advance_fenced"], sent
    assert "index_profile_get" not in sent, sent


@pytest.mark.parametrize("batch", [1, 3])
def test_the_fenced_publish_waits_once_before_commit(db_url, sink, queue, publish_task, pipeline_waits, batch):
    """The fence, the tasks' profiles and the pointer move are read in one wait; the writes, the server-side count
    and completion checks and the completion wait for nothing but COMMIT: two waits in all (5 before issue #32's
    slow-link work, 3 while the checks were read here). A batch waits as a single version does."""
    for i in range(batch):
        publish_task(document=f"doc-{i}")
    tasks = queue.claim("w1", limit=batch)
    items = [item_of(t, TEXTS[:3]) for t in tasks]
    before = pipeline_waits[0]
    if batch == 1:
        outcome = sink.publish(items[0].lease, items[0].chunks, items[0].vectors, work=items[0].work)
        assert outcome.chunk_count == 3
    else:
        assert sink._batches(items) == [list(range(batch))]
        assert [r.chunk_count for r in sink.publish_many(items)] == [3] * batch
    assert pipeline_waits[0] - before == 2
    assert all(queue.get(t.lease.task_id)["status"] == "SUCCEEDED" for t in tasks)


def test_expired_lease_writes_nothing(db_url, sink, queue, publish_task, clock):
    publish_task(document="policy")
    task = claim_one(queue)
    chunks = make_chunks("acme", "policy", 1, TEXTS)
    vectors = embed(chunks)
    clock.advance(31)
    with pytest.raises(LeaseLost):
        sink.publish(task.lease, chunks, vectors)
    assert rows(db_url) == [] and pointer(db_url, "policy") is None
    assert queue.get(task.lease.task_id)["status"] == "RUNNING"


def test_lease_taken_over_by_a_new_attempt_of_the_same_owner_writes_nothing(db_url, sink, queue, publish_task, clock):
    publish_task(document="policy")
    old = claim_one(queue, "worker")
    clock.advance(31)
    new = claim_one(queue, "worker")
    assert new.lease.task_id == old.lease.task_id and new.lease.attempt == old.lease.attempt + 1
    chunks = make_chunks("acme", "policy", 1, TEXTS)
    vectors = embed(chunks)
    with pytest.raises(LeaseLost):
        sink.publish(old.lease, chunks, vectors)
    assert rows(db_url) == [] and pointer(db_url, "policy") is None
    assert sink.publish(new.lease, chunks, vectors).chunk_count == 23
    assert len(rows(db_url)) == 23


def test_cancelled_task_writes_nothing(db_url, sink, queue, publish_task):
    publish_task(document="policy")
    task = claim_one(queue)
    queue.cancel(task.lease.task_id)
    chunks = make_chunks("acme", "policy", 1, TEXTS)
    with pytest.raises(TaskCancelled):
        sink.publish(task.lease, chunks, embed(chunks))
    assert rows(db_url) == [] and pointer(db_url, "policy") is None


def test_failure_inside_the_transaction_rolls_everything_back(db_url, sink, queue, publish_task, monkeypatch):
    publish_task(document="policy")
    task = claim_one(queue)
    chunks = make_chunks("acme", "policy", 1, TEXTS)
    vectors = embed(chunks)

    def broken_complete(*args, **kwargs):
        raise IndexWriteFailed("connection lost during commit")

    monkeypatch.setattr(queue, "complete_published", broken_complete)
    with pytest.raises(IndexWriteFailed):
        sink.publish(task.lease, chunks, vectors)
    assert rows(db_url) == [] and pointer(db_url, "policy") is None
    monkeypatch.undo()
    assert sink.publish(task.lease, chunks, vectors).chunk_count == 23


def test_a_lease_running_out_during_the_transaction_aborts_it_at_commit_and_writes_nothing(
        db_url, sink, queue, publish_task, clock, monkeypatch):
    """The fence held at the lock, then the lease ran out before the completion: the server's completion check
    (task_completed_check, sent with COMMIT) aborts the transaction and the publish says the lease was lost."""
    publish_task(document="policy")
    task = claim_one(queue)
    chunks = make_chunks("acme", "policy", 1, TEXTS)
    original = queue.complete_published

    def late_complete(session, leases, counts):
        clock.advance(queue.lease_seconds + 1)  # the writes took longer than the lease had left
        original(session, leases, counts)

    monkeypatch.setattr(queue, "complete_published", late_complete)
    with pytest.raises(LeaseLost):
        sink.publish(task.lease, chunks, embed(chunks))
    assert rows(db_url) == [] and pointer(db_url, "policy") is None
    assert queue.get(task.lease.task_id)["status"] == "RUNNING"


def test_rerun_of_the_same_version_writes_the_same_rows_and_rewrites_nothing(db_url, sink, queue, publish_task):
    publish_task(document="policy")
    first = claim_one(queue)
    chunks = make_chunks("acme", "policy", 1, TEXTS)
    sink.publish(first.lease, chunks, embed(chunks))
    before = rows(db_url)
    again = claim_reindex(db_url, queue)  # a REINDEX of the same version under the same profile
    assert again.task_type == "REINDEX"
    rechunked = make_chunks("acme", "policy", 1, TEXTS)
    assert [c.chunk_id for c in rechunked] == [c.chunk_id for c in chunks]
    outcome = sink.publish(again.lease, rechunked, embed(rechunked))
    assert outcome.chunk_count == 23 and not outcome.superseded
    assert rows(db_url) == before, "same ids, same content, same row versions (xmin): nothing rewritten"
    assert pointer(db_url, "policy") == (1, again.lease.task_id, 23)


def test_rerun_with_a_changed_chunk_set_replaces_the_version_exactly(db_url, sink, queue, publish_task):
    publish_task(document="policy")
    first = claim_one(queue)
    chunks = make_chunks("acme", "policy", 1, TEXTS)
    sink.publish(first.lease, chunks, embed(chunks))
    again = claim_reindex(db_url, queue)
    fewer = make_chunks("acme", "policy", 1, TEXTS[:5] + ["A brand new closing paragraph."])
    sink.publish(again.lease, fewer, embed(fewer))
    assert [r[0] for r in rows(db_url)] == [c.chunk_id for c in fewer]


def test_older_version_after_a_newer_one_is_superseded_and_not_written(db_url, sink, queue, publish_task):
    publish_task(document="policy", data=b"version one")
    publish_task(document="policy", data=b"version two")
    claimed = {t.version_number: t for t in queue.claim("w1", limit=2)}
    v2 = make_chunks("acme", "policy", 2, ["Version two text."])
    sink.publish(claimed[2].lease, v2, embed(v2))
    v1 = make_chunks("acme", "policy", 1, ["Version one text.", "More of it."])
    outcome = sink.publish(claimed[1].lease, v1, embed(v1))
    assert outcome.superseded and outcome.chunk_count == 0 and outcome.pointer_version == 2
    assert {r[2] for r in rows(db_url)} == {2}
    assert pointer(db_url, "policy")[0] == 2
    task = queue.get(claimed[1].lease.task_id)
    assert task["status"] == "SUCCEEDED" and task["chunk_count"] == 0
    assert any("superseded" in (e["message"] or "") for e in queue.events(claimed[1].lease.task_id))


def test_newer_version_moves_the_pointer_and_keeps_old_rows_out_of_the_way(db_url, sink, queue, publish_task):
    publish_task(document="policy", data=b"version one")
    t1 = claim_one(queue)
    c1 = make_chunks("acme", "policy", 1, TEXTS[:3])
    sink.publish(t1.lease, c1, embed(c1))
    publish_task(document="policy", data=b"version two")
    t2 = claim_one(queue)
    c2 = make_chunks("acme", "policy", 2, TEXTS[3:5])
    sink.publish(t2.lease, c2, embed(c2))
    assert pointer(db_url, "policy")[0] == 2
    assert sorted({r[2] for r in rows(db_url)}) == [1, 2]


@pytest.mark.parametrize("fault", [Fault.WRONG_COUNT, Fault.WRONG_ORDER, Fault.WRONG_DIMENSION, Fault.WRONG_MODEL])
def test_invalid_embedding_never_reaches_the_index(db_url, sink, queue, publish_task, fault):
    publish_task(document="policy")
    task = claim_one(queue)
    chunks = make_chunks("acme", "policy", 1, TEXTS)
    with pytest.raises(EmbeddingInvalidResponse) as info:
        embed(chunks, FakeEmbedder(model_name=DEFAULT_MODEL_NAME, schedule={2: fault}))
    queue.fail(task.lease, info.value.code, info.value.message)
    assert rows(db_url) == [] and pointer(db_url, "policy") is None
    assert queue.get(task.lease.task_id)["status"] == "DEAD"


def test_sink_refuses_vectors_that_do_not_fit(db_url, sink, queue, publish_task):
    publish_task(document="policy")
    task = claim_one(queue)
    chunks = make_chunks("acme", "policy", 1, TEXTS)
    vectors = embed(chunks)
    with pytest.raises(EmbeddingInvalidResponse):
        sink.publish(task.lease, chunks, vectors[:-1])
    bad = vectors.copy()
    bad[3, 7] = np.inf
    with pytest.raises(EmbeddingInvalidResponse):
        sink.publish(task.lease, chunks, bad)
    assert rows(db_url) == [] and queue.get(task.lease.task_id)["status"] == "RUNNING"


def test_empty_version_publishes_zero_chunks(db_url, sink, queue, publish_task):
    publish_task(document="policy")
    task = claim_one(queue)
    outcome = sink.publish(task.lease, [], np.zeros((0, 384), dtype=np.float32))
    assert outcome.chunk_count == 0 and pointer(db_url, "policy")[0] == 1


def test_run_state_that_disagrees_with_the_task_row_is_refused(db_url, sink, queue, publish_task):
    from types import SimpleNamespace

    publish_task(document="policy")
    task = claim_one(queue)
    chunks = make_chunks("acme", "policy", 1, TEXTS)
    vectors = embed(chunks)
    base = dict(tenant_id="acme", document_id="policy", version_number=1, profile=PROFILE, dimension=384)
    with pytest.raises(EmbeddingInvalidResponse):
        sink.publish(task.lease, chunks, vectors, work=SimpleNamespace(**base, model="other-model"))
    with pytest.raises(Exception, match="version_number"):
        sink.publish(task.lease, chunks, vectors, work=SimpleNamespace(**{**base, "version_number": 2}, model=DEFAULT_MODEL_NAME))
    assert rows(db_url) == []
    ok = sink.publish(task.lease, chunks=chunks, vectors=vectors, work=SimpleNamespace(**base, model=DEFAULT_MODEL_NAME))
    assert ok.chunk_count == 23


def test_chunks_made_for_another_profile_or_version_are_refused(db_url, sink, queue, publish_task):
    """The sink re-derives every chunk id from the locked task row (issue #12, defect 1): run state of the
    building profile can never be committed under the active profile's task, nor another version's."""
    publish_task(document="policy")
    task = claim_one(queue)
    for wrong in (make_chunks("acme", "policy", 1, TEXTS, profile="shadow-c128"),
                  make_chunks("acme", "policy", 2, TEXTS)):
        with pytest.raises(InternalError, match="not made for version 1 under profile minilm-v1"):
            sink.publish(task.lease, wrong, embed(wrong))
    import dataclasses

    right = make_chunks("acme", "policy", 1, TEXTS)
    tampered = [*right[:3], dataclasses.replace(right[3], text="a different text"), *right[4:]]
    with pytest.raises(InternalError):
        sink.publish(task.lease, tampered, embed(tampered))
    assert rows(db_url) == [] and pointer(db_url, "policy") is None
    assert sink.publish(task.lease, right, embed(right)).chunk_count == 23


# -- many versions per transaction (publish_many: issue #14, small documents) -------------------------


def work_of(task, model: str = DEFAULT_MODEL_NAME):
    """The run's idea of a claimed task (what IndexingRun passes as ``work``)."""
    from types import SimpleNamespace

    return SimpleNamespace(tenant_id=task.tenant_id, document_id=task.document_id, version_number=task.version_number,
                           profile=PROFILE, model=model, dimension=384)


def item_of(task, texts: list[str]):
    from resources.index_sink import PublishItem

    chunks = make_chunks(task.tenant_id, task.document_id, task.version_number, texts)
    return PublishItem(task.lease, chunks, embed(chunks), work_of(task))


def assert_index_consistent(db) -> None:
    from resources.verifier import verify

    report = verify(db)
    assert report.ok, report.to_dict()


def test_many_versions_publish_in_one_transaction_and_a_lost_lease_fails_alone(db, db_url, queue, publish_task):
    for i in range(5):
        publish_task(document=f"doc-{i}")
    tasks = queue.claim("w1", limit=5)
    queue.cancel(tasks[2].lease.task_id)
    sink = IndexSink(db, queue, write_batch=100)
    assert sink._batches([item_of(t, [f"Text {t.document_id}"]) for t in tasks]) == [[0, 1, 2, 3, 4]]
    results = sink.publish_many([item_of(t, [f"Refunds of {t.document_id}.", f"Hours of {t.document_id}."])
                                 for t in tasks])
    assert isinstance(results[2], TaskCancelled)
    assert [r.chunk_count for i, r in enumerate(results) if i != 2] == [2, 2, 2, 2]
    statuses = {t.document_id: queue.get(t.lease.task_id)["status"] for t in tasks}
    assert statuses == {"doc-0": "SUCCEEDED", "doc-1": "SUCCEEDED", "doc-2": "CANCELLED", "doc-3": "SUCCEEDED",
                        "doc-4": "SUCCEEDED"}
    assert pointer(db_url, "doc-2") is None and all(pointer(db_url, f"doc-{i}")[2] == 2 for i in (0, 1, 3, 4))
    assert_index_consistent(db)


@pytest.mark.parametrize("refused", ["other_version_chunks", "wrong_model"])
def test_a_version_its_checks_refuse_after_its_pointer_moved_publishes_nothing_and_its_batch_mates_do(
        db, db_url, queue, publish_task, refused):
    """The pointer move goes out with the fence, before the versions are checked against their task rows: a version
    refused then (chunks made for another version; vectors of another model) had its pointer moved, so the
    transaction is given up and sent again without it. Its pointer stays unmoved and its task RUNNING; the others
    publish in the second transaction, and a third is not needed."""

    from resources import database
    from resources.index_sink import PublishItem

    for i in range(3):
        publish_task(document=f"doc-{i}")
    tasks = queue.claim("w1", limit=3)
    items = [item_of(t, [f"Refunds of {t.document_id}."]) for t in tasks]
    bad = tasks[1]
    if refused == "other_version_chunks":
        chunks = make_chunks(bad.tenant_id, bad.document_id, bad.version_number + 1, ["Refunds of doc-1."])
        items[1] = PublishItem(bad.lease, chunks, embed(chunks), work_of(bad))
    else:
        items[1] = PublishItem(bad.lease, items[1].chunks, items[1].vectors, work_of(bad, model="another-model"))
    sink = IndexSink(db, queue, write_batch=100)
    assert sink._batches(items) == [[0, 1, 2]]
    moves: list[list[int]] = []
    real_run = database.Session._run

    def run(self, name, params):
        if name == "search_pointer_advance_fenced":
            moves.append(list(params["task_ids"]))
        return real_run(self, name, params)

    database.Session._run = run
    try:
        results = sink.publish_many(items)
    finally:
        database.Session._run = real_run
    expected = InternalError if refused == "other_version_chunks" else EmbeddingInvalidResponse
    assert isinstance(results[1], expected), results
    assert [results[0].chunk_count, results[2].chunk_count] == [1, 1]
    ids = [t.lease.task_id for t in tasks]
    assert moves == [ids, [ids[0], ids[2]]]  # sent with all three, then again without the refused one
    assert pointer(db_url, "doc-1") is None and pointer(db_url, "doc-0")[0] == pointer(db_url, "doc-2")[0] == 1
    assert [queue.get(i)["status"] for i in ids] == ["SUCCEEDED", "RUNNING", "SUCCEEDED"]
    assert_index_consistent(db)


def test_a_version_that_spoils_its_batch_fails_alone_and_its_batch_mates_publish(db, db_url, queue, publish_task):
    for i in range(3):
        publish_task(document=f"doc-{i}")
    tasks = queue.claim("w1", limit=3)
    items = [item_of(t, [f"Refunds of {t.document_id}."]) for t in tasks]
    # A row already holds doc-1's chunk id under another version: the upsert may not take it over, so the
    # count check fails inside the batch transaction (everything rolls back) ...
    clash = items[1].chunks[0]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, heading_path,"
                     " text, token_count, content_digest, embedding) SELECT %s, 'acme', 'doc-1', 7, %s, 0, '{}', 'x', 1,"
                     " 'd', embedding FROM (SELECT %s::vector AS embedding) v", (clash.chunk_id, PROFILE, str([float(x) for x in items[1].vectors[0]])))
    results = IndexSink(db, queue).publish_many(items)
    # ... and each version is published again on its own: only doc-1 fails.
    assert isinstance(results[1], IndexWriteFailed)
    assert [results[0].chunk_count, results[2].chunk_count] == [1, 1]
    assert [queue.get(t.lease.task_id)["status"] for t in tasks] == ["SUCCEEDED", "RUNNING", "SUCCEEDED"]
    assert pointer(db_url, "doc-1") is None


@pytest.mark.parametrize("order", ["newer_first", "older_first"])
def test_two_versions_of_one_document_in_one_call_never_share_a_transaction(db, db_url, queue, publish_task, order):
    publish_task(document="policy")
    publish_task(document="policy")
    tasks = sorted(queue.claim("w1", limit=2), key=lambda t: t.version_number)
    if order == "newer_first":
        tasks.reverse()
    sink = IndexSink(db, queue)
    items = [item_of(t, [f"Policy text of version {t.version_number}."]) for t in tasks]
    assert sink._batches(items) == [[0], [1]]
    results = sink.publish_many(items)
    by_version = {t.version_number: r for t, r in zip(tasks, results)}
    assert pointer(db_url, "policy")[0] == 2 and not by_version[2].superseded
    assert by_version[1].superseded == (order == "newer_first")
    assert_index_consistent(db)


def test_batched_and_one_by_one_publishes_leave_the_same_index(db, db_url, queue, publish_task):
    """Same documents under two tenants: one published in a batch, the other one version per call."""
    texts = {f"doc-{i}": [f"Refunds take {i} days.", f"Desk {i} opens at nine.", "Shared closing words."]
             for i in range(4)}
    for tenant in ("batch", "single"):
        for document in texts:
            publish_task(tenant=tenant, document=document)
    tasks = queue.claim("w1", limit=8)
    sink = IndexSink(db, queue)
    batch = [t for t in tasks if t.tenant_id == "batch"]
    assert all(not isinstance(r, Exception) for r in sink.publish_many([item_of(t, texts[t.document_id]) for t in batch]))
    for task in (t for t in tasks if t.tenant_id == "single"):
        item = item_of(task, texts[task.document_id])
        sink.publish(item.lease, item.chunks, item.vectors, work=item.work)
    with psycopg.connect(db_url) as conn:
        stats = {tenant: conn.execute("SELECT term, df FROM lexical_term_stats WHERE tenant_id = %s ORDER BY term",
                                      (tenant,)).fetchall() for tenant in ("batch", "single")}
        chunk_texts = {tenant: conn.execute("SELECT document_id, ordinal, text FROM chunk WHERE tenant_id = %s"
                                            " ORDER BY 1, 2", (tenant,)).fetchall() for tenant in ("batch", "single")}
    assert stats["batch"] == stats["single"] and len(stats["batch"]) > 10
    assert chunk_texts["batch"] == chunk_texts["single"]
    assert_index_consistent(db)


def test_a_publish_that_claims_its_task_first_holds_the_lease_the_claim_grants(db_url, sink, queue, publish_task,
                                                                                  pipeline_waits):
    """``claim=True`` (the fast path): the claim goes in the publish transaction, before the fence, and waits with it;
    the fence holds on the attempt that claim grants (attempts + 1), so the version publishes in the same two waits
    as a lease claimed beforehand, with the claim's event and the success under one attempt."""
    from resources.task_queue import TaskQueue

    task_id = publish_task(document="policy").task_id
    chunks = make_chunks("acme", "policy", 1, TEXTS[:3])
    before = pipeline_waits[0]
    outcome = sink.publish(TaskQueue.lease_to_claim(task_id, 0, "fast-1"), chunks, embed(chunks), claim=True)
    assert (outcome.chunk_count, outcome.superseded, pipeline_waits[0] - before) == (3, False, 2)
    task = queue.get(task_id)
    assert (task["status"], task["attempts"], pointer(db_url, "policy")) == ("SUCCEEDED", 1, (1, task_id, 3))
    with psycopg.connect(db_url) as conn:
        events = conn.execute("SELECT attempt, from_status, to_status, lease_owner FROM task_event "
                              "WHERE task_id = %s AND kind = 'transition' ORDER BY event_id", [task_id]).fetchall()
    assert events[-2:] == [(1, "PENDING", "RUNNING", "fast-1"), (1, "RUNNING", "SUCCEEDED", "fast-1")]


def test_a_claim_that_grants_another_attempt_is_rolled_back_with_its_publish(db_url, sink, queue, publish_task):
    """The task was claimed and failed back to RETRY_WAIT after its attempts were read: the claim in the publish
    transaction grants attempt 2, the fence expects 1, so ClaimMissed and nothing commits, the claim included (the
    task is still RETRY_WAIT under attempt 1, due for the pipeline). A task another worker holds is missed alike."""
    from resources.index_sink import ClaimMissed
    from resources.task_queue import TaskQueue

    task_id = publish_task(document="policy").task_id
    queue.fail(claim_one(queue, "w1").lease, "INDEX_WRITE_FAILED", "a write failed")
    chunks = make_chunks("acme", "policy", 1, TEXTS[:3])
    with pytest.raises(ClaimMissed):
        sink.publish(TaskQueue.lease_to_claim(task_id, 0, "fast-1"), chunks, embed(chunks), claim=True)
    task = queue.get(task_id)
    assert (task["status"], task["attempts"], task["lease_owner"]) == ("RETRY_WAIT", 1, None)
    assert rows(db_url) == [] and pointer(db_url, "policy") is None

    held = queue.claim_task(task_id, "w2").lease  # the same task, now RUNNING for w2 under attempt 2
    with pytest.raises(ClaimMissed):
        sink.publish(TaskQueue.lease_to_claim(task_id, 1, "fast-1"), chunks, embed(chunks), claim=True)
    task = queue.get(task_id)
    assert (task["status"], task["attempts"], task["lease_owner"]) == ("RUNNING", 2, "w2") and held.attempt == 2
    assert rows(db_url) == [] and pointer(db_url, "policy") is None


def test_a_version_refused_after_its_claim_leaves_the_task_unclaimed(db_url, sink, queue, publish_task):
    """Chunks made for another version, with ``claim=True``: the checks refuse them after the pointer moved, the
    transaction is sent again without the version, and its claim went with the first: the task is PENDING,
    unattempted, for a run."""
    task_id = publish_task(document="policy").task_id
    from resources.task_queue import TaskQueue

    chunks = make_chunks("acme", "policy", 7, TEXTS[:3])
    with pytest.raises(InternalError):
        sink.publish(TaskQueue.lease_to_claim(task_id, 0, "fast-1"), chunks, embed(chunks), claim=True)
    task = queue.get(task_id)
    assert (task["status"], task["attempts"]) == ("PENDING", 0)
    assert rows(db_url) == [] and pointer(db_url, "policy") is None
