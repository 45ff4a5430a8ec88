"""What one indexing run costs the database does not grow with its number of versions (issue #14).

Per-version statements (a progress write per step, a task and profile read per lease, a dozen publish
statements and a commit per version) made small documents cost ~0.3 of bare encode. A run now reads,
announces and publishes its versions in batches: the named statements it issues for 4 versions and for
16 are the same, name by name, count by count.
"""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.database import Session
from resources.embedder import FakeEmbedder
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.publisher import Publisher
from resources.run_state import RunState
from resources.task_queue import TaskQueue


def statements_of_one_run(db, db_url, tmp_path, monkeypatch, tenant: str, versions: int) -> Counter:
    blobs = BlobStore(str(tmp_path / "blobs"))
    publisher = Publisher(db, blobs)
    for i in range(versions):
        body = f"Policy {i}.\n\nRefunds of class {i} are paid within {i % 7 + 3} days.\n\nDesk {i} opens at nine."
        publisher.publish(tenant, f"doc-{i}.txt", body.encode(), f"doc-{i}.txt")
    queue = TaskQueue(db, lease_seconds=60)
    claimed = queue.claim("sensor", limit=versions, for_run=True)
    assert len(claimed) == versions
    with psycopg.connect(db_url) as conn:
        keys = [k for (k,) in conn.execute("SELECT partition_key FROM document_version WHERE tenant_id = %s", (tenant,))]
    run = IndexingRun(db=db, queue=queue, keeper=LeaseKeeper(queue), owner=f"run-{tenant}", granted_by="sensor",
                      blobs=blobs, embedder_for=lambda model: FakeEmbedder(model_name=model),
                      state=RunState(ArtifactStore(tmp_path / "artifacts")),
                      tagged=[(c.lease.task_id, c.lease.attempt) for c in claimed], batch_size=16)
    counted: Counter = Counter()
    original = Session._run

    def counting(self, name, params):
        counted[name] += 1
        return original(self, name, params)

    with monkeypatch.context() as patch:
        patch.setattr(Session, "_run", counting)
        for step in (run.parse, run.chunk, run.embed, run.publish):
            results = step(keys)
            assert all(r.outcome == "ok" for rs in results.values() for r in rs), results
    with psycopg.connect(db_url) as conn:
        (succeeded,) = conn.execute("SELECT count(*) FROM index_task WHERE tenant_id = %s AND status = 'SUCCEEDED'",
                                    (tenant,)).fetchone()
    assert succeeded == versions
    return counted


@pytest.mark.timeout(300)
def test_a_run_issues_the_same_statements_for_4_versions_as_for_16(db, db_url, tmp_path, monkeypatch):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-a' WHERE is_active")
    small = statements_of_one_run(db, db_url, tmp_path, monkeypatch, "small", 4)
    large = statements_of_one_run(db, db_url, tmp_path, monkeypatch, "large", 16)
    assert small == large, f"statements that grow with the run's versions: {dict(large - small)}"
    assert sum(large.values()) <= 30, dict(large)
