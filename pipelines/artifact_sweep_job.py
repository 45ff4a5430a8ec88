"""The artifact sweep job: delete run artifacts of tasks that ended outside the run that wrote them.

``sweep_artifacts`` (job) runs one op that calls resources.artifact_sweep.sweep_artifacts on the
runs' artifact folder (KBINDEX_ARTIFACTS, default KBINDEX_HOME/artifacts) and reports the counts as
output metadata. ``sweep_artifacts_hourly`` runs it every hour at a quarter past (retention has
the top of the hour); launch it from the UI with ``ops: {artifact_sweep_pass: {config: {grace_seconds: ...}}}``
to use another grace period.
"""

import dagster as dg
from pydantic import Field

from resources.artifact_store import ArtifactStore
from resources.artifact_sweep import DEFAULT_GRACE_SECONDS, artifact_root, sweep_artifacts
from resources.dagster_resources import DatabaseResource


class ArtifactSweepConfig(dg.Config):
    grace_seconds: float = Field(
        default=DEFAULT_GRACE_SECONDS,
        ge=0,
        description="Keep files younger than this: a run may be writing them.",
    )


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Delete the run artifacts of tasks that ended or no longer exist, and old-layout files.",
)
def artifact_sweep_pass(
    context: dg.OpExecutionContext, config: ArtifactSweepConfig, database: DatabaseResource
) -> dg.Output:
    root = artifact_root()
    report = sweep_artifacts(database.db, ArtifactStore(root), grace_seconds=config.grace_seconds)
    summary = {**report.to_metadata(), "grace_seconds": config.grace_seconds}
    context.log.info(f"artifact sweep of {root}: {summary}")
    return dg.Output(None, metadata=summary)


@dg.job(
    name="sweep_artifacts",
    executor_def=dg.in_process_executor,
    description="Delete run artifacts (parsed text, chunks, vectors) of tasks that ended outside their run.",
)
def sweep_artifacts_job() -> None:
    artifact_sweep_pass()


sweep_artifacts_hourly = dg.ScheduleDefinition(
    name="sweep_artifacts_hourly",
    job=sweep_artifacts_job,
    cron_schedule="15 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Sweep orphaned run artifacts every hour with the default one-hour grace period.",
)
