"""Erase after a real Dagster materialization (in process, a DagsterInstance on PostgreSQL storage): pg_dump of the
kbindex database and of Dagster's, and every file under the test's folders (KBINDEX_HOME with DAGSTER_HOME inside
it, blobs, artifacts), hold no copy of a phrase only the erased document contained (DESIGN.md invariant 9)."""

from __future__ import annotations

import dagster as dg
import pytest

from pipelines.assets import indexing_assets
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.dagster_resources import LEASES_TAG, OWNER_TAG, default_resources, encode_leases
from resources.database import Database
from resources.embedder import FakeEmbedder
from resources.eraser import Eraser
from resources.publisher import Publisher
from resources.search import search
from resources.task_queue import TaskQueue
from resources.verifier import verify
from tests.integration.test_erase import PHRASE, dump, files_holding

SECRET = f"# Settlement\n\nThe settlement with {PHRASE} is paid within 30 days.\n\n## Terms\n\n{PHRASE} waives fees.".encode()
HANDBOOK = b"# Handbook\n\nA settlement of travel expenses is paid within 30 days."


def test_erase_after_a_dagster_run_leaves_no_copy_in_either_database_or_any_file(db_url, dagster_pg_url, kb_env,
                                                                                  fake_profile, tmp_path):
    dagster_home = tmp_path / "home" / "dagster"
    dagster_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text(f"storage:\n  postgres:\n    postgres_url: \"{dagster_pg_url}\"\n")
    db = Database(db_url)
    instance = dg.DagsterInstance.from_config(str(dagster_home))
    try:
        blobs = BlobStore(kb_env["KBINDEX_BLOB_URL"])
        publisher, queue = Publisher(db, blobs), TaskQueue(db, lease_seconds=60)
        publisher.publish("acme", "secret.md", SECRET, f"{PHRASE}.md")
        publisher.publish("acme", "handbook.md", HANDBOOK, "handbook.md")
        claimed = queue.claim("claim-1", limit=10)
        keys = [r["partition_key"] for r in
                db.fetch_all("document_version_partition_keys", {"task_ids": [t.lease.task_id for t in claimed]})]
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
        result = dg.materialize(
            indexing_assets, resources=default_resources(), instance=instance, raise_on_error=False,
            tags={LEASES_TAG: encode_leases([(t.lease.task_id, t.lease.attempt) for t in claimed]), OWNER_TAG: "claim-1",
                  "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
        )
        assert result.success
        needle = PHRASE.encode()
        assert needle in dump(db_url)

        receipt = Eraser(db, blobs, ArtifactStore(kb_env["KBINDEX_ARTIFACTS"])).erase("acme", "secret.md")

        assert receipt.outcome == "erased" and receipt.removed["chunks"] >= 1 and receipt.removed["blobs"] == 1
        assert needle not in dump(db_url)
        dagster_dump = dump(dagster_pg_url.replace("postgresql+psycopg2://", "postgresql://"))
        assert b"secret.md" in dagster_dump  # the partition keys are there (the test reads the right database)
        assert needle not in dagster_dump
        assert files_holding(tmp_path, needle) == []
        found = {h.document_id for h in search(db, FakeEmbedder(), "settlement within 30 days", tenant_id="acme", k=20)}
        assert found == {"handbook.md"}
        assert verify(db).ok
    finally:
        instance.dispose()
        db.close()


@pytest.fixture(autouse=True)
def _no_stray_home(monkeypatch, tmp_path):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home" / "dagster"))
