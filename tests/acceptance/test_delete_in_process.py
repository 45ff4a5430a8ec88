"""A tombstone through Dagster's in-process `materialize` with the claiming sensor's lease tags, in one run with a
content version: the four assets report it as a delete, it reads no bytes and writes no chunk, and its publish
takes the document out of every search mode while its run-mate becomes searchable."""

from __future__ import annotations

import dagster as dg
import psycopg
import pytest

from pipelines.assets import indexing_assets
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.blob_store import BlobStore
from resources.dagster_resources import LEASES_TAG, OWNER_TAG, default_resources, encode_leases
from resources.database import Database
from resources.embedder import FakeEmbedder
from resources.publisher import Publisher
from resources.search import search
from resources.task_queue import TaskQueue
from resources.verifier import verify

REFUNDS = b"# Refunds\n\nCustomers may ask for a refund within 30 days of purchase.\n\n## Exceptions\n\nGift cards are final."
HANDBOOK = b"# Handbook\n\nA refund of travel expenses is paid within 30 days."


@pytest.fixture
def setup(db_url, kb_env, fake_profile):
    db = Database(db_url)
    yield db, Publisher(db, BlobStore(kb_env["KBINDEX_BLOB_URL"])), TaskQueue(db, lease_seconds=60)
    db.close()


def _materialize_claimed(db, queue, instance, owner: str):
    claimed = queue.claim(owner, limit=10)
    keys = [r["partition_key"] for r in
            db.fetch_all("document_version_partition_keys", {"task_ids": [t.lease.task_id for t in claimed]})]
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
    pairs = [(t.lease.task_id, t.lease.attempt) for t in claimed]
    return keys, dg.materialize(
        indexing_assets, resources=default_resources(), instance=instance, raise_on_error=False,
        tags={LEASES_TAG: encode_leases(pairs), OWNER_TAG: owner,
              "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
    )


def _documents(db, mode: str) -> set[str]:
    return {h.document_id for h in search(db, FakeEmbedder(), "refund within 30 days", tenant_id="acme", k=20, mode=mode)}


def test_a_tombstone_materializes_in_process_beside_a_content_version(setup, db_url, tmp_path):
    db, publisher, queue = setup
    publisher.publish("acme", "refunds.md", REFUNDS, "refunds.md")
    instance = dg.DagsterInstance.ephemeral()
    _, first = _materialize_claimed(db, queue, instance, "claim-1")
    assert first.success
    assert all(_documents(db, mode) == {"refunds.md"} for mode in ("dense", "lexical", "hybrid"))

    deleted = publisher.delete("acme", "refunds.md")
    handbook = publisher.publish("acme", "handbook.md", HANDBOOK, "handbook.md")
    (tombstone_key,) = [r["partition_key"] for r in
                        db.fetch_all("document_version_partition_keys", {"task_ids": [deleted.task_id]})]
    keys, result = _materialize_claimed(db, queue, instance, "claim-2")
    assert result.success
    assert len(keys) == 2 and tombstone_key in keys

    assert (queue.get(deleted.task_id)["status"], queue.get(deleted.task_id)["chunk_count"]) == ("SUCCEEDED", 0)
    assert queue.get(handbook.task_id)["status"] == "SUCCEEDED"
    assert all(_documents(db, mode) == {"handbook.md"} for mode in ("dense", "lexical", "hybrid"))
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT version_number, chunk_count FROM search_pointer WHERE document_id = 'refunds.md'"
                            ).fetchall() == [(2, 0)]
    by_asset = {}
    for asset in ("parsed_document", "document_chunks", "chunk_embeddings", "search_index"):
        (mat,) = [m for m in instance.fetch_materializations(dg.AssetKey(asset), limit=10).records
                  if m.partition_key == tombstone_key]
        by_asset[asset] = {k: v.value for k, v in mat.asset_materialization.metadata.items()}
    assert by_asset["parsed_document"]["tombstone"] is True and by_asset["parsed_document"]["outcome"] == "ok"
    assert by_asset["document_chunks"]["chunks"] == 0
    assert by_asset["chunk_embeddings"]["vectors"] == 0
    assert (by_asset["search_index"]["chunk_count"], by_asset["search_index"]["pointer_version"]) == (0, 2)
    assert verify(db).ok


def test_a_metadata_only_change_materializes_in_process_by_copying(setup, db_url):
    """Issue 30 through Dagster: the same bytes with a new allow list are version 2; the run copies version 1's
    chunks and vectors (the assets say so, nothing is embedded), and the new allow list holds at the flip."""
    from pipelines.domain.metadata import ReadScope

    db, publisher, queue = setup
    publisher.publish("acme", "refunds.md", REFUNDS, "refunds.md", metadata={"dept": "support"})
    instance = dg.DagsterInstance.ephemeral()
    assert _materialize_claimed(db, queue, instance, "claim-1")[1].success
    changed = publisher.publish("acme", "refunds.md", REFUNDS, "refunds.md", metadata={"dept": "support"},
                                allow=["group:support"])
    (key,), result = _materialize_claimed(db, queue, instance, "claim-2")
    assert result.success and queue.get(changed.task_id)["status"] == "SUCCEEDED"
    meta = {}
    for asset in ("parsed_document", "chunk_embeddings", "search_index"):
        (mat,) = [m for m in instance.fetch_materializations(dg.AssetKey(asset), limit=10).records
                  if m.partition_key == key]
        meta[asset] = {k: v.value for k, v in mat.asset_materialization.metadata.items()}
    assert meta["parsed_document"]["copied_from"] == 1
    assert (meta["chunk_embeddings"]["embedded"], meta["chunk_embeddings"]["copied_from"]) == (0, 1)
    assert meta["search_index"]["pointer_version"] == 2 and meta["search_index"]["chunk_count"] > 0
    fake = FakeEmbedder()
    assert search(db, fake, "refund within 30 days", tenant_id="acme", k=5) == []
    hits = search(db, fake, "refund within 30 days", tenant_id="acme", k=5, read=ReadScope.of(["group:support"]))
    assert hits and {h.version_number for h in hits} == {2}
    assert verify(db).ok
