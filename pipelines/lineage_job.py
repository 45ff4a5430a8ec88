"""Jobs that keep the Dagster side bounded at enterprise size (issue #14).

``prune_lineage_keys`` (started by its sensor, at most every 10 minutes, when there is work) deletes the
partition keys of versions with nothing in flight once their lineage window has passed, or beyond the
cap, a bounded batch per run: the live key set follows the churn, not the corpus (Dagster's UI and every
call that lists keys slow down with it). With them go the runs that covered only pruned keys, and their
events, so the history the UI rebuilds from follows the churn too, and the finished runs of the maintenance jobs
(retention, artifact sweep, prune itself) older than the window. It is the only job that deletes keys:
retention (pipelines/retention_job.py) deletes chunks and bytes, never keys, so a released
version's key goes here like any other, after its window. ``backfill_profile`` is
how an operator starts a model migration from the UI: it asks the claiming sensor to build the
profile's backlog in ordinary bounded runs beside live indexing, whatever its size.
"""

from datetime import datetime, timedelta, timezone

import dagster as dg
from pydantic import Field

from pipelines.artifact_sweep_job import sweep_artifacts_job
from pipelines.jobs import index_versions_job
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from pipelines.retention_job import apply_retention_job
from pipelines.sensors import LIVE, keys_by_run, tick_database_resource, tick_instance
from resources.dagster_resources import DatabaseResource, leases_of
from resources.partition_keys import (
    DEFAULT_LINEAGE_SECONDS,
    DEFAULT_MAX_KEYS,
    forget,
    live,
    oldest_added,
    prunable,
    runs_of,
    walk_resumes_after,
    walk_stopped_at,
)
from resources.profiles import request_backfill


class PruneConfig(dg.Config):
    window_seconds: float = Field(default=DEFAULT_LINEAGE_SECONDS, ge=0,
                                  description="Keep a finished version's partition key (its UI lineage) this long.")
    max_keys: int = Field(default=DEFAULT_MAX_KEYS, ge=0,
                          description="Keep at most this many finished versions' keys (the newest), whatever the window.")
    batch: int = Field(default=5000, ge=1, le=100_000,
                       description="Keys deleted per run at most (5,000: 4-7 s under dagster dev, ~3 s more "
                                   "for their runs).")
    catch_up_runs: int = Field(default=1000, ge=1, le=100_000, description=(
        "Runs left behind by keys pruned earlier (while delete_runs was off) looked at per run, oldest first, "
        "each walk resuming where the last stopped (~6 ms a run to delete)."))
    maintenance_runs: int = Field(default=1000, ge=0, le=100_000, description=(
        "Finished runs of the maintenance jobs (apply_retention, sweep_artifacts, prune_lineage_keys) older than "
        "the window deleted per run at most, oldest first: they come every hour, forever."))
    delete_runs: bool = Field(default=True, description=(
        "Also delete the finished runs that worked on the pruned keys and on no live key, with their events: "
        "the history the partitions tab is rebuilt from whenever a key is added. Their ids stay in each task's "
        "history (`kbindex task ID`); their pages in the UI go."))


FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
RUN_ID_CHUNK = 1000


def delete_runs_of(instance: dg.DagsterInstance, database: DatabaseResource, pruned: list[str]) -> tuple[int, int]:
    """Delete the finished runs that worked on the ``pruned`` keys and on no other key still live; (deleted, kept).

    Dagster rebuilds the partitions tab's status cache from every materialization of the asset each time a
    key is added (README, "With history behind the live keys"), and pruning a key leaves its events behind:
    only deleting their runs (``DagsterInstance.delete_run``, which deletes the run's events) bounds that
    history by the live keys. Called before the keys are deleted, so a prune that dies in between finds the
    same keys, and so their runs, next time.
    """
    run_ids = runs_of(database.db, pruned)
    runs = [record.dagster_run for start in range(0, len(run_ids), RUN_ID_CHUNK)
            for record in instance.get_run_records(dg.RunsFilter(run_ids=run_ids[start:start + RUN_ID_CHUNK],
                                                                 statuses=FINISHED))]
    return delete_unless_live(instance, database, runs, set(pruned))


def delete_runs_left_behind(instance: dg.DagsterInstance, database: DatabaseResource,
                            limit: int) -> tuple[int, int]:
    """The runs of keys pruned before prune deleted runs (or while ``delete_runs`` was off): the next ``limit``
    finished index runs created before the oldest live key was added, deleted by the same rule; (deleted, kept).

    Only index_versions runs: their lease tags list every key. The walk resumes where the previous one stopped
    (``walk_resumes_after``), so runs it keeps (each also covers a key added again since) cannot hold its front
    for good (1,000 of them did, when each walk started at the oldest). Once a walk reaches the end, the next
    starts from the oldest again: it finds a kept run whose key has since been pruned with ``delete_runs`` off
    (with it on, the key-driven pass deletes it).
    """
    oldest = oldest_added(database.db)
    before = oldest.astimezone(timezone.utc) if oldest is not None else datetime.now(timezone.utc)
    after = walk_resumes_after(database.db)
    filters = dg.RunsFilter(job_name=index_versions_job.name, statuses=FINISHED, created_before=before,
                            created_after=after.astimezone(timezone.utc) if after is not None else None)
    records = instance.get_run_records(filters, limit=limit, ascending=True)
    deleted, kept = delete_unless_live(instance, database, [r.dagster_run for r in records], set())
    reached_end = len(records) < limit  # moved after deleting: a prune that dies in between walks them again
    walk_stopped_at(database.db, None if reached_end else max(r.create_timestamp for r in records))
    return deleted, kept


PRUNE_JOB = "prune_lineage_keys"
MAINTENANCE_JOBS = (apply_retention_job.name, sweep_artifacts_job.name, PRUNE_JOB)
"""Jobs whose runs only report what they did (counts in their metadata): each schedule adds 24 a day."""


def old_maintenance_runs(instance: dg.DagsterInstance, window_seconds: float, limit: int) -> list[str]:
    """Up to ``limit`` finished maintenance runs created longer than ``window_seconds`` ago, oldest first per job."""
    before = datetime.now(timezone.utc) - timedelta(seconds=window_seconds)
    found: list[str] = []
    for job in MAINTENANCE_JOBS:
        if len(found) >= limit:
            break
        filters = dg.RunsFilter(job_name=job, statuses=FINISHED, created_before=before)
        found += [r.dagster_run.run_id for r in instance.get_run_records(filters, limit=limit - len(found),
                                                                          ascending=True)]
    return found


RANGE_START_TAG = "dagster/asset_partition_range_start"
EVENT_PAGE = 1000


def materialized_by(instance: dg.DagsterInstance, run_id: str) -> set[str]:
    """The partition keys ``run_id`` materialized, from its own events (indexed by run; pages of EVENT_PAGE).

    Only operator-launched range runs need it: a key the run planned but never materialized holds none of its
    events that the key's lineage needs."""
    keys: set[str] = set()
    cursor = None
    while True:
        page = instance.get_records_for_run(run_id, cursor=cursor, limit=EVENT_PAGE,
                                            of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        keys |= {r.event_log_entry.dagster_event.partition for r in page.records
                 if r.event_log_entry.dagster_event is not None and r.event_log_entry.dagster_event.partition}
        if not page.has_more:
            return keys
        cursor = page.cursor


def delete_unless_live(instance: dg.DagsterInstance, database: DatabaseResource, runs: list[dg.DagsterRun],
                       pruned: set[str]) -> tuple[int, int]:
    """Delete each of ``runs`` that covers no key still live (``pruned`` are going now); (deleted, kept).

    A run that also covers a live key is kept: it may hold that key's only materialization. A UI range run
    (no lease tags) names only its range's ends, and its middle keys cannot be listed once pruned: it covers
    the keys it materialized, read from its own events.
    """
    covered = keys_by_run(runs, database)
    for run in runs:
        if not leases_of(run.tags) and RANGE_START_TAG in run.tags:
            covered[run.run_id] |= materialized_by(instance, run.run_id)
    still_live = live(database.db, sorted(set().union(*covered.values()) - pruned))
    deleted = 0
    for run in runs:
        if covered[run.run_id] & still_live:
            continue
        instance.delete_run(run.run_id)
        deleted += 1
    return deleted, len(runs) - deleted


@dg.op(out=dg.Out(dg.Nothing),
       description="Delete the partition keys of finished versions past the lineage window, and their runs.")
def prune_partition_keys(context: dg.OpExecutionContext, config: PruneConfig, database: DatabaseResource) -> dg.Output:
    keys = prunable(database.db, window_seconds=config.window_seconds, max_keys=config.max_keys,
                    limit=config.batch)
    deleted = kept = caught_up = passed_over = 0
    if config.delete_runs:
        deleted, kept = delete_runs_of(context.instance, database, keys)
    for key in keys:
        context.instance.delete_dynamic_partition(VERSIONS_PARTITIONS_NAME, key)
    forget(database.db, keys)
    if config.delete_runs:  # after forget: the walk stops at the oldest key still live
        caught_up, passed_over = delete_runs_left_behind(context.instance, database, config.catch_up_runs)
    maintenance = old_maintenance_runs(context.instance, config.window_seconds, config.maintenance_runs)
    for run_id in maintenance:
        context.instance.delete_run(run_id)
    return dg.Output(None, metadata={"partition_keys_deleted": len(keys), "runs_deleted": deleted, "runs_kept": kept,
                                     "older_runs_deleted": caught_up, "older_runs_kept": passed_over,
                                     "maintenance_runs_deleted": len(maintenance),
                                     "window_seconds": config.window_seconds,
                                     "max_keys": config.max_keys})


@dg.job(name=PRUNE_JOB, executor_def=dg.in_process_executor,
        description="Keep Dagster's partition keys bounded: versions in flight plus a lineage window.")
def prune_lineage_keys_job() -> None:
    prune_partition_keys()


PRUNE_INTERVAL_SECONDS = 600
"""How often the sensor below looks for keys to prune. A run deletes up to ``PruneConfig.batch`` keys (5,000:
4-7 s under dagster dev in bench.scale.prune_drain, ~0.8 ms a key in bench.scale.ui through this storage; its
45-66 s were a plain dagster_postgres instance's), so pruning drains up to 30,000 keys an hour (measured: 29,910). The hourly schedule it
replaces drained 5,000, while a model migration adds a key for every version it rebuilds (~86 a second in
bench.scale.migration's fake round): after a 100k-version migration the live keys stayed over the cap for
about 20 hours (derived)."""


@dg.sensor(job=prune_lineage_keys_job, minimum_interval_seconds=PRUNE_INTERVAL_SECONDS,
           default_status=dg.DefaultSensorStatus.RUNNING,
           description=("Starts prune_lineage_keys when a finished version's key is past the lineage window or the "
                        "cap, or a maintenance run is older than the window, and no prune run is in flight: up to "
                        "5,000 keys every 10 minutes."))
def prune_lineage_keys_when_due(context: dg.SensorEvaluationContext) -> dg.RunRequest | dg.SkipReason:
    """Cheap checks a tick (the prunable query with limit 1 walks at most the cap's keys, whatever the corpus;
    one indexed run lookup per maintenance job), so an idle deployment starts no runs, unlike a schedule."""
    if (not prunable(tick_database_resource(context).db, limit=1)
            and not old_maintenance_runs(tick_instance(context), DEFAULT_LINEAGE_SECONDS, 1)):
        return dg.SkipReason("no partition key is past the lineage window or the cap, and no maintenance run")
    in_flight = dg.RunsFilter(job_name=prune_lineage_keys_job.name, statuses=LIVE)
    if tick_instance(context).get_run_records(in_flight, limit=1):
        return dg.SkipReason("a prune_lineage_keys run is still in flight")
    return dg.RunRequest()


class BackfillConfig(dg.Config):
    profile: str = Field(description="The building profile to backfill (see `kbindex profile list`).")


@dg.op(out=dg.Out(dg.Nothing), description="Ask the claiming sensor to build the profile's backlog.")
def request_profile_backfill(context: dg.OpExecutionContext, config: BackfillConfig,
                             database: DatabaseResource) -> dg.Output:
    row = request_backfill(database.db, config.profile)
    context.log.info(f"backfill of {row['name']} requested: {row['backlog']} version(s) to build")
    return dg.Output(None, metadata={"profile": row["name"], "backlog": int(row["backlog"])})


@dg.job(name="backfill_profile", executor_def=dg.in_process_executor,
        description="Start a model migration: the claiming sensor builds the profile in bounded runs beside live work.")
def backfill_profile_job() -> None:
    request_profile_backfill()
