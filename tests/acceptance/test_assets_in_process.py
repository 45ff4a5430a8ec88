"""The four assets through Dagster's in-process `materialize`: many versions per run, each fenced.

These exercise the wiring (partitions, the IndexingRun resource, per-version failure boundary)
on the real database with the fake embedder; tests/acceptance/test_daemon_e2e.py runs the real
daemon, code server and model.
"""

from __future__ import annotations

import dagster as dg
import psycopg
import pytest

from pipelines.assets import indexing_assets
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.blob_store import BlobStore
from resources.dagster_resources import LEASES_TAG, OWNER_TAG, default_resources, encode_leases
from resources.database import Database
from resources.publisher import Publisher
from resources.task_queue import TaskQueue

GOOD = b"# Refunds\n\nCustomers may ask for a refund within 30 days of purchase.\n\n## Exceptions\n\nGift cards are final."


@pytest.fixture
def setup(db_url, kb_env, fake_profile):
    db = Database(db_url)
    publisher = Publisher(db, BlobStore(kb_env["KBINDEX_BLOB_URL"]))
    yield db, publisher, TaskQueue(db, lease_seconds=60)
    db.close()


def _keys(db, task_ids):
    return [r["partition_key"] for r in db.fetch_all("document_version_partition_keys", {"task_ids": task_ids})]


def _materialize(instance, keys, tags):
    return dg.materialize(
        indexing_assets,
        resources=default_resources(),
        instance=instance,
        tags={**tags, "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
        raise_on_error=False,
    )


def test_a_batch_run_indexes_every_version_and_one_bad_file_fails_alone(setup, db_url):
    db, publisher, queue = setup
    published = [
        publisher.publish("acme", "refund.md", GOOD, "refund.md"),
        publisher.publish("acme", "broken.pdf", b"%PDF-1.7\nthis is not really a pdf", "broken.pdf"),
        publisher.publish("acme", "notes.txt", "Die Rückgabe ist 30 Tage möglich.".encode("utf-8"), "notes.txt"),
    ]
    claimed = queue.claim("batch-test", limit=10)
    assert len(claimed) == 3
    keys = _keys(db, [t.lease.task_id for t in claimed])
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
    pairs = [(t.lease.task_id, t.lease.attempt) for t in claimed]
    result = _materialize(instance, keys, {LEASES_TAG: encode_leases(pairs), OWNER_TAG: "batch-test"})
    assert result.success
    status = {r.task_id: queue.get(r.task_id) for r in published}
    assert status[published[0].task_id]["status"] == "SUCCEEDED"
    assert status[published[2].task_id]["status"] == "SUCCEEDED"
    assert status[published[1].task_id]["status"] == "DEAD"
    assert status[published[1].task_id]["error_code"] == "PARSE_ERROR"
    with psycopg.connect(db_url) as conn:
        pointers = conn.execute("SELECT document_id, version_number, chunk_count FROM search_pointer ORDER BY 1").fetchall()
        chunks = conn.execute("SELECT count(*) FROM chunk").fetchone()[0]
    assert [p[0] for p in pointers] == ["notes.txt", "refund.md"]
    assert chunks == sum(p[2] for p in pointers) > 0
    mats = instance.fetch_materializations(dg.AssetKey("search_index"), limit=10).records
    assert {m.partition_key for m in mats} == set(keys)


def test_a_run_whose_lease_was_taken_over_writes_nothing(setup, db_url):
    db, publisher, queue = setup
    r = publisher.publish("acme", "refund.md", GOOD, "refund.md")
    (first,) = queue.claim("batch-old", limit=1)
    # The lease is taken over (a later claim after expiry): simulate by expiring it in the database clock.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_task SET lease_until = now() - interval '1 second' WHERE task_id = %s", [r.task_id])
    (second,) = queue.claim("batch-new", limit=1)
    assert second.lease.attempt == first.lease.attempt + 1
    keys = _keys(db, [r.task_id])
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
    result = _materialize(
        instance, keys, {LEASES_TAG: encode_leases([(r.task_id, first.lease.attempt)]), OWNER_TAG: "batch-old"}
    )
    # It built nothing, so it must not report success (issue #12, defect 10): the run fails with the reason.
    assert not result.success
    assert not instance.fetch_materializations(dg.AssetKey("search_index"), limit=1).records
    task = queue.get(r.task_id)
    assert (task["status"], task["lease_owner"], task["attempts"]) == ("RUNNING", "batch-new", second.lease.attempt)
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM chunk").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM search_pointer").fetchone()[0] == 0


def test_an_operator_run_without_leases_claims_the_task_first(setup, db_url):
    db, publisher, queue = setup
    r = publisher.publish("acme", "refund.md", GOOD, "refund.md")
    keys = _keys(db, [r.task_id])
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
    result = dg.materialize(indexing_assets, resources=default_resources(), instance=instance, partition_key=keys[0])
    assert result.success
    task = queue.get(r.task_id)
    assert task["status"] == "SUCCEEDED" and task["attempts"] == 1
    assert task["lease_owner"] is None or task["lease_owner"].startswith("run-")
    # A second manual run finds nothing to do: the task is SUCCEEDED, and nothing is written twice.
    with psycopg.connect(db_url) as conn:
        before = conn.execute("SELECT count(*) FROM chunk").fetchone()[0]
    again = dg.materialize(indexing_assets, resources=default_resources(), instance=instance, partition_key=keys[0],
                           raise_on_error=False)
    assert not again.success  # nothing was built, and the run says so rather than reporting a materialization
    failure = next(e for e in again.all_events if e.is_step_failure)
    assert "SUCCEEDED and not claimable" in str(failure.step_failure_data.user_failure_data.metadata)
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM chunk").fetchone()[0] == before
    assert queue.get(r.task_id)["attempts"] == 1


def test_a_new_version_reuses_the_vectors_of_its_unchanged_chunks(setup):
    db, publisher, queue = setup
    paragraphs = [f"Section {i}. Records of class {i} are kept for {i % 7 + 1} years." for i in range(60)]
    instance = dg.DagsterInstance.ephemeral()

    def index(data: bytes) -> dict:
        r = publisher.publish("acme", "retention.txt", data, "retention.txt")
        keys = _keys(db, [r.task_id])
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
        result = dg.materialize(indexing_assets, resources=default_resources(), instance=instance, partition_key=keys[0])
        assert result.success and queue.get(r.task_id)["status"] == "SUCCEEDED"
        (mat,) = instance.fetch_materializations(
            dg.AssetKey("chunk_embeddings"), limit=1
        ).records
        return {k: v.value for k, v in mat.asset_materialization.metadata.items()}

    first = index("\n\n".join(paragraphs).encode())
    paragraphs[30] = "Section 30. This one paragraph changed in the second version."
    second = index("\n\n".join(paragraphs).encode())
    assert first["reused"] == 0
    assert second["vectors"] - 3 <= second["reused"] < second["vectors"]  # only the changed chunk(s) embedded


def test_a_run_tagged_with_both_profiles_of_a_version_indexes_both(setup, db_url):
    """Issue #12, defect 2: the sensor may put a version's INDEX and REINDEX tasks in one run; both are
    adopted and both succeed (before, only the first lease per partition key was adopted)."""
    from resources.profiles import create_profile

    db, publisher, queue = setup
    r = publisher.publish("acme", "refund.md", GOOD, "refund.md")
    create_profile(db, "shadow-c64", model="fake-384", chunk_tokens=64, overlap=8)
    shadow = next(t["task_id"] for t in queue.list() if t["profile"] == "shadow-c64")
    leases = [queue.claim_task(task_id, "batch-both").lease for task_id in (r.task_id, shadow)]
    keys = _keys(db, [r.task_id])
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
    result = _materialize(instance, keys, {LEASES_TAG: encode_leases([(x.task_id, x.attempt) for x in leases]),
                                           OWNER_TAG: "batch-both"})
    assert result.success
    assert {queue.get(x.task_id)["status"] for x in leases} == {"SUCCEEDED"}
    assert {queue.get(x.task_id)["attempts"] for x in leases} == {1}  # no takeover burned an attempt
    (mat,) = instance.fetch_materializations(dg.AssetKey("search_index"), limit=1).records
    meta = {k: v.value for k, v in mat.asset_materialization.metadata.items()}
    assert meta["profiles"] == "minilm-v1,shadow-c64" and meta["outcome"] == "ok"


@pytest.mark.parametrize("algorithm", ["AES-128", "AES-256"])
def test_aes_encrypted_pdfs_that_open_without_a_password_become_searchable(setup, algorithm):
    """Issue #11: on a fresh install (cryptography declared) such PDFs are indexed end to end, not DEAD."""
    import io

    from pypdf import PdfWriter

    from resources.embedder import FakeEmbedder
    from resources.search import search
    from tests.unit.test_hostile_inputs import _pdf_with_text

    db, publisher, queue = setup
    writer = PdfWriter(clone_from=io.BytesIO(_pdf_with_text("Refunds within 30 days of purchase")))
    writer.encrypt(user_password="", owner_password="owner-secret", algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    r = publisher.publish("acme", "protected.pdf", out.getvalue(), "protected.pdf")
    (claimed,) = queue.claim("batch-aes", limit=1)
    keys = _keys(db, [r.task_id])
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
    result = _materialize(instance, keys, {LEASES_TAG: encode_leases([(claimed.lease.task_id, claimed.lease.attempt)]),
                                           OWNER_TAG: "batch-aes"})
    assert result.success
    assert queue.get(r.task_id)["status"] == "SUCCEEDED"
    hits = search(db, FakeEmbedder(model_name="fake-384"), "refunds within 30 days", tenant_id="acme", k=3)
    assert [h.document_id for h in hits] == ["protected.pdf"]
