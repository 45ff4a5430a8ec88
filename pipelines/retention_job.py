"""The retention job: delete chunks of versions superseded longer ago than a window, then unneeded bytes.

``apply_retention`` (job) runs one op that calls resources.retention.apply_retention, then deletes
stored document bytes no version needs any more (resources.blob_gc: superseded past the window, or
orphaned by a failed publish, older than an hour), and reports the counts as output metadata. It
leaves Dagster's partition keys alone: ``prune_lineage_keys`` (pipelines/lineage_job.py) is the one
job that deletes them. ``apply_retention_hourly``
runs it at the top of every hour with the default 7-day window; launch it from the UI with
``ops: {retention_pass: {config: {window_seconds: ...}}}`` to use a longer one. A window shorter than
KBINDEX_RETENTION_MIN_WINDOW_SECONDS (default: the 7 days) fails the run before anything is deleted
(RETENTION_WINDOW_TOO_SHORT): the launchpad has no authentication, and a window of 0 would delete the
rollback data of every tenant (issue #31, finding 2). Only the code location's environment lowers it.
"""

import dagster as dg
from pydantic import Field

from pipelines.domain.errors import RetentionWindowTooShort
from resources.blob_gc import collect_blobs
from resources.dagster_resources import BlobStoreResource, DatabaseResource
from resources.retention import DEFAULT_WINDOW_SECONDS, apply_retention
from resources.settings import RETENTION_MIN_WINDOW_ENV, retention_min_window_seconds


class RetentionConfig(dg.Config):
    window_seconds: float = Field(
        default=DEFAULT_WINDOW_SECONDS,
        ge=0,
        description="Keep a superseded version's chunks this long after search stopped reading it (rollback window). "
        f"At least {RETENTION_MIN_WINDOW_ENV} (default 7 days): a shorter one fails the run and deletes nothing.",
    )


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Delete chunks of versions superseded longer ago than the window, then bytes no version needs.",
)
def retention_pass(
    context: dg.OpExecutionContext, config: RetentionConfig, database: DatabaseResource, blobs: BlobStoreResource
) -> dg.Output:
    floor = retention_min_window_seconds()
    if config.window_seconds < floor:
        raise RetentionWindowTooShort(
            f"window_seconds={config.window_seconds:g} is shorter than the minimum {floor:g} "
            f"({RETENTION_MIN_WINDOW_ENV}); nothing was deleted",
            window_seconds=config.window_seconds, minimum=floor,
        )
    report = apply_retention(database.db, window_seconds=config.window_seconds)
    gc = collect_blobs(database.db, blobs.get_store(), window_seconds=config.window_seconds)
    summary = {
        **report.to_metadata(),
        **gc.to_metadata(),
        "window_seconds": config.window_seconds,
    }
    context.log.info(f"retention: {summary}")
    return dg.Output(None, metadata=summary)


@dg.job(
    name="apply_retention",
    executor_def=dg.in_process_executor,
    description="Retention of superseded versions after the rollback window (chunks and stored bytes).",
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
