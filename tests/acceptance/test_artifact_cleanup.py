"""After a burst, the artifact folder is empty (issue #28, defect 5): a run deletes the artifacts of the tasks
that end in it (published, or failed for good); a task cancelled under the run keeps them until the sweep job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import psycopg

from pipelines.artifact_sweep_job import sweep_artifacts_hourly, sweep_artifacts_job
from pipelines.assets import indexing_assets
from pipelines.definitions import defs
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.blob_store import BlobStore
from resources.dagster_resources import (
    LEASES_TAG,
    OWNER_TAG,
    DatabaseResource,
    EmbedderResource,
    default_resources,
    encode_leases,
)
from resources.database import Database
from resources.embedder import EmbeddingResponse, FakeEmbedder
from resources.publisher import Publisher
from resources.task_queue import TaskQueue


class _CancellingEmbedder(FakeEmbedder):
    """The fake embedder; the first time it is asked for the victim's texts, an operator cancels the victim."""

    victim: tuple[str, int] | None = None  # (database url, task id), cleared once cancelled

    def respond(self, texts: list[str]) -> EmbeddingResponse:
        if _CancellingEmbedder.victim is not None and any("victim" in t for t in texts):
            url, task_id = _CancellingEmbedder.victim
            _CancellingEmbedder.victim = None
            with Database(url) as db:
                TaskQueue(db).cancel(task_id)
        return super().respond(texts)


class _CancellingResource(EmbedderResource):
    def for_model(self, model: str) -> Any:
        return _CancellingEmbedder(model_name=model)


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_after_a_burst_and_the_sweep_the_artifact_folder_holds_no_files(db_url, kb_env, fake_profile, monkeypatch):
    import resources.indexing_run as indexing_run

    monkeypatch.setattr(indexing_run, "KEEP_ARTIFACT_SECONDS", 0.0)  # every output on disk, as for long documents
    root = Path(kb_env["KBINDEX_ARTIFACTS"])
    db = Database(db_url)
    try:
        publisher = Publisher(db, BlobStore(kb_env["KBINDEX_BLOB_URL"]))
        queue = TaskQueue(db, lease_seconds=60)
        body = lambda tag: "\n\n".join(f"{tag} paragraph {i} about refunds and invoices." for i in range(12)).encode()
        good = [publisher.publish("acme", f"good-{i}.txt", body(f"good{i}"), f"good-{i}.txt") for i in range(3)]
        broken = publisher.publish("acme", "broken.pdf", b"%PDF-1.7\nthis is not really a pdf", "broken.pdf")
        victim = publisher.publish("acme", "victim.txt", body("victim"), "victim.txt")
        claimed = queue.claim("burst", limit=10)
        assert len(claimed) == 5
        keys = [r["partition_key"] for r in db.fetch_all(
            "document_version_partition_keys", {"task_ids": [t.lease.task_id for t in claimed]})]
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
        _CancellingEmbedder.victim = (db_url, victim.task_id)
        result = dg.materialize(
            indexing_assets, resources={**default_resources(), "embedder": _CancellingResource(batch_size=4)},
            instance=instance, raise_on_error=False,
            tags={LEASES_TAG: encode_leases([(t.lease.task_id, t.lease.attempt) for t in claimed]),
                  OWNER_TAG: "burst",
                  "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
        )
        assert result.success
        status = {r.task_id: queue.get(r.task_id)["status"] for r in (*good, broken, victim)}
        assert [status[r.task_id] for r in good] == ["SUCCEEDED"] * 3
        assert (status[broken.task_id], status[victim.task_id]) == ("DEAD", "CANCELLED")

        # The run deleted what ended in it; the cancelled task only lost its lease there: its files wait.
        left = _files(root)
        assert left and all(f.startswith(f"task-{victim.task_id}/") for f in left), left

        sweep = sweep_artifacts_job.execute_in_process(
            resources={"database": DatabaseResource(url=db_url)},
            run_config={"ops": {"artifact_sweep_pass": {"config": {"grace_seconds": 0.0}}}},
        )
        assert sweep.success
        assert _files(root) == []
        assert list(root.iterdir()) == []  # the task folders went with their files
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT count(*) FROM search_pointer").fetchone()[0] == 3
    finally:
        db.close()


def test_the_sweep_job_and_its_hourly_schedule_are_in_the_code_location():
    assert defs.resolve_job_def("sweep_artifacts").name == "sweep_artifacts"
    schedule = defs.resolve_schedule_def("sweep_artifacts_hourly")
    assert schedule.cron_schedule == "15 * * * *" and schedule.job_name == "sweep_artifacts"
    assert sweep_artifacts_hourly.default_status == dg.DefaultScheduleStatus.RUNNING
