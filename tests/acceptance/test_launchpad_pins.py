"""Issue #31, finding 2: the Dagster launchpad (no authentication) cannot re-point a run's resources.

Values the code location builds its resources with used to become run-config defaults that anyone at the
launchpad could override: ``resources.indexing_run.config.artifacts`` pointed at a folder they could write made
the run unpickle their file (code as the run user), ``resources.database.config.url`` another database. These
fields are pinned now (resources/dagster_resources.py, PINNED_FIELDS): not in any job's config schema, and a run
config naming one is refused before the run starts.
"""

from __future__ import annotations

import pickle

import dagster as dg
import pytest

from pipelines.assets import indexing_assets
from pipelines.definitions import defs
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.blob_store import BlobStore
from resources.dagster_resources import LEASES_TAG, OWNER_TAG, PINNED_FIELDS, default_resources, encode_leases
from resources.database import Database
from resources.publisher import Publisher
from resources.task_queue import TaskQueue


class _Payload:
    """What an attacker's pickle does when loaded: create a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _config_fields(field) -> set[str]:
    config = getattr(field.config_type, "fields", {}).get("config")
    return set(getattr(config.config_type, "fields", {})) if config is not None else set()


def test_no_job_of_the_code_location_offers_a_pinned_field_in_its_config_schema():
    """What the launchpad shows: every job's run config schema, resource by resource."""
    resources = default_resources()
    jobs = defs.get_repository_def().get_all_jobs()
    assert {job.name for job in jobs} >= {"__ASSET_JOB", "apply_retention", "index_versions", "sweep_artifacts"}
    for key, names in PINNED_FIELDS.items():
        assert set(names) <= set(type(resources[key]).model_fields), key  # the pinned names are real fields
    for job in jobs:
        offered = job.run_config_schema.config_type.fields["resources"].config_type.fields
        for key, names in PINNED_FIELDS.items():
            assert not _config_fields(offered[key]) & set(names), (job.name, key, _config_fields(offered[key]))
    # the tuning knobs stay configurable: the check above is not passing because nothing is offered at all
    assert "pool_size" in _config_fields(jobs[0].run_config_schema.config_type.fields["resources"].config_type.fields["database"])


@pytest.fixture
def claimed(db_url, kb_env, fake_profile):
    """One published and claimed version: its task id, partition key and lease tags."""
    db = Database(db_url)
    try:
        Publisher(db, BlobStore(kb_env["KBINDEX_BLOB_URL"])).publish("acme", "refund.md", b"# Refunds\n\n30 days.", "refund.md")
        (task,) = TaskQueue(db, lease_seconds=60).claim("launchpad-test", limit=1)
        (row,) = db.fetch_all("document_version_partition_keys", {"task_ids": [task.lease.task_id]})
    finally:
        db.close()
    tags = {LEASES_TAG: encode_leases([(task.lease.task_id, task.lease.attempt)]), OWNER_TAG: "launchpad-test"}
    return task.lease.task_id, row["partition_key"], tags


@pytest.mark.parametrize("resource, field", [(k, n) for k, names in PINNED_FIELDS.items() for n in names])
def test_a_run_config_overriding_a_pinned_field_is_refused_and_no_foreign_pickle_is_loaded(
        claimed, kb_env, tmp_path, resource, field):
    task_id, key, tags = claimed
    evil = tmp_path / "evil"  # outside KBINDEX_HOME, writable by whoever uses the launchpad
    marker = tmp_path / "pwned"
    (evil / f"task-{task_id}").mkdir(parents=True)
    for stage in ("parsed_document", "document_chunks", "chunk_embeddings"):
        (evil / f"task-{task_id}" / f"{stage}.pickle").write_bytes(pickle.dumps(_Payload(str(marker))))
    value = {"url": "postgresql://attacker@evil.example:5432/kb"}.get(field, str(evil)) if resource == "database" \
        else str(evil)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, [key])
    with pytest.raises(dg.DagsterInvalidConfigError, match=field):
        dg.materialize(indexing_assets, resources=default_resources(), instance=instance, partition_key=key, tags=tags,
                       run_config={"resources": {resource: {"config": {field: value}}}}, raise_on_error=False)
    assert not marker.exists()
    assert instance.get_runs() == []  # refused before a run existed


def test_without_an_override_the_run_uses_the_environments_artifact_folder(claimed, kb_env, tmp_path):
    """The pinned values still come from the KBINDEX_* settings: the same run without the override succeeds."""
    task_id, key, tags = claimed
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, [key])
    result = dg.materialize(indexing_assets, resources=default_resources(), instance=instance, partition_key=key,
                            tags=tags)
    assert result.success
    assert not (tmp_path / "evil").exists()
