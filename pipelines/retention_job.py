"""The retention job: delete chunks of versions superseded longer ago than a window, and their partition keys.

``apply_retention`` (job) runs one op that calls resources.retention.apply_retention, deletes the
reported keys from the ``document_versions`` dynamic partitions (one at a time, as Dagster allows),
confirms them in the database, then deletes stored document bytes no version needs any more
(resources.blob_gc: superseded past the window, or orphaned by a failed publish, older than an
hour), and reports the counts as output metadata. ``apply_retention_hourly``
runs it at the top of every hour with the default 7-day window; launch it from the UI with
``ops: {retention_pass: {config: {window_seconds: ...}}}`` to use another one.
"""

import dagster as dg
from pydantic import Field

from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.blob_gc import collect_blobs
from resources.dagster_resources import BlobStoreResource, DatabaseResource
from resources.retention import DEFAULT_WINDOW_SECONDS, apply_retention, confirm_partition_keys_deleted


class RetentionConfig(dg.Config):
    window_seconds: float = Field(
        default=DEFAULT_WINDOW_SECONDS,
        ge=0,
        description="Keep a superseded version's chunks this long after search stopped reading it (rollback window).",
    )


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Delete chunks of versions superseded longer ago than the window, and their partition keys.",
)
def retention_pass(
    context: dg.OpExecutionContext, config: RetentionConfig, database: DatabaseResource, blobs: BlobStoreResource
) -> dg.Output:
    report = apply_retention(database.db, window_seconds=config.window_seconds)
    # Only the reported keys, in one indexed query: listing every key costs O(corpus) per run.
    existing = set(context.instance.get_existing_dynamic_partitions(
        VERSIONS_PARTITIONS_NAME, list(report.partition_keys_to_delete))) if report.partition_keys_to_delete else set()
    deleted = 0
    for key in report.partition_keys_to_delete:
        if key in existing:
            context.instance.delete_dynamic_partition(VERSIONS_PARTITIONS_NAME, key)
            deleted += 1
    confirm_partition_keys_deleted(database.db, report.partition_keys_to_delete)
    gc = collect_blobs(database.db, blobs.get_store(), window_seconds=config.window_seconds)
    summary = {
        **report.to_metadata(),
        **gc.to_metadata(),
        "partition_keys_deleted": deleted,
        "window_seconds": config.window_seconds,
    }
    context.log.info(f"retention: {summary}")
    return dg.Output(None, metadata=summary)


@dg.job(
    name="apply_retention",
    executor_def=dg.in_process_executor,
    description="Retention of superseded versions after the rollback window (chunks and Dagster partition keys).",
)
def apply_retention_job() -> None:
    retention_pass()


apply_retention_hourly = dg.ScheduleDefinition(
    name="apply_retention_hourly",
    job=apply_retention_job,
    cron_schedule="0 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Run retention every hour with the default 7-day window.",
)
