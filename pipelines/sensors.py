"""Sensors: the claiming sensor that turns due index tasks into runs, and the crashed-run recorder.

The claim commits inside the sensor evaluation; if the tick then dies before its runs are stored,
nothing is lost: the leases expire and a later claim takes the tasks over (invariant 7). Runs are
requested only while at most KBINDEX_MAX_WAITING_RUNS wait for a slot, and the sensor heartbeats
the leases of waiting runs each tick, so a queued run does not lose its leases before it starts.
A deep queue becomes a few big runs spread over the tenant's run slots; a lone publish, one small run.
"""


import os
import time
import uuid
from collections import defaultdict
from datetime import datetime, timezone

import dagster as dg
from dagster import DagsterRunStatus, RunsFilter

from pipelines.jobs import index_versions_job
from pipelines.partitions import VERSIONS_PARTITIONS_NAME, document_versions
from resources.dagster_resources import (
    LEASES_TAG,
    MODELS_TAG,
    OWNER_TAG,
    TENANT_TAG,
    DatabaseResource,
    decode_leases,
    encode_leases,
)
from pipelines.domain.errors import KbindexError
from resources.task_queue import ClaimedTask, Lease, TaskQueue

BATCH_MAX = int(os.environ.get("KBINDEX_RUN_BATCH", "160"))  # versions per run, at most
# A tick's fresh versions of one tenant are spread over this many runs (the per-tenant run limit in
# dagster.yaml), none smaller than BATCH_MIN: a deep queue fills every slot with one big run each
# (a run pays ~2 s of process start plus imports and a model load), a shallow one gets one small run.
RUN_SPREAD = int(os.environ.get("KBINDEX_RUN_SPREAD", "2"))
BATCH_MIN = int(os.environ.get("KBINDEX_RUN_BATCH_MIN", "12"))
MAX_WAITING_RUNS = int(os.environ.get("KBINDEX_MAX_WAITING_RUNS", "1"))
WAITING_LEASE_MAX_SECONDS = float(os.environ.get("KBINDEX_WAITING_LEASE_MAX_SECONDS", "900"))
LEASE_SECONDS = float(os.environ.get("KBINDEX_LEASE_SECONDS", "60"))
WAITING = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]
NOT_LAUNCHED = (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED)


def split_sizes(n: int, batch_max: int, spread: int = 1, batch_min: int = 1) -> list[int]:
    """Sizes of the runs for ``n`` fresh versions: as even as possible, at most ``batch_max`` each,
    over at least ``spread`` runs when every run still gets ``batch_min`` versions."""
    if n <= 0:
        return []
    runs = max(-(-n // max(1, batch_max)), min(max(1, spread), max(1, n // max(1, batch_min))))
    base, extra = divmod(n, runs)
    return [base + (1 if i < extra else 0) for i in range(runs)]


def balance_sizes(weights: list[int], sizes: list[int], batch_max: int) -> list[int]:
    """Re-cut ``sizes`` (consecutive groups of ``weights``) so each group carries about the same weight.

    Runs of a burst start together and a run's time is its text, not its number of versions: with
    equal counts, the run that drew the long documents finishes last while the other's cores idle.
    Weights are the versions' byte sizes (a proxy for their chunks). Keeps the number of runs, at
    least one version and at most ``batch_max`` versions in each.
    """
    runs = len(sizes)
    if runs < 2 or len(weights) != sum(sizes):
        return sizes
    out: list[int] = []
    start = 0
    for r in range(runs - 1):
        left = runs - r  # groups still to cut, this one included
        target = sum(weights[start:]) / left
        end, acc = start, 0
        limit = min(len(weights) - (left - 1), start + batch_max)  # leave one for each later group
        while end < limit and (end == start or acc + weights[end] / 2 <= target):
            acc += weights[end]
            end += 1
        out.append(end - start)
        start = end
    out.append(len(weights) - start)
    return out if out[-1] <= batch_max else sizes


def plan_runs(
    claimed: list[ClaimedTask],
    keys: dict[int, str],
    existing: set[str],
    owner: str,
    batch_max: int,
    *,
    spread: int = 1,
    batch_min: int = 1,
    weights: dict[int, int] | None = None,
) -> tuple[list[dg.RunRequest], list[str]]:
    """Group claimed tasks into run requests; returns (requests, partition keys to add, in order).

    New keys of one tenant are added together and so form a contiguous range: one run covers many
    versions (``split_sizes``). A key that already exists (a retry or a taken-over lease) sits
    elsewhere in the key order, so it gets a run of its own.
    """
    by_tenant: dict[str, list[ClaimedTask]] = defaultdict(list)
    for task in claimed:
        by_tenant[task.tenant_id].append(task)
    requests: list[dg.RunRequest] = []
    to_add: list[str] = []
    for tenant, tasks in by_tenant.items():
        fresh = [t for t in tasks if keys[t.lease.task_id] not in existing]
        again = [t for t in tasks if keys[t.lease.task_id] in existing]
        start = 0
        sizes = split_sizes(len(fresh), batch_max, spread, batch_min)
        if weights:
            sizes = balance_sizes([max(1, weights.get(t.lease.task_id, 1)) for t in fresh], sizes, batch_max)
        for size in sizes:
            group = fresh[start : start + size]
            start += size
            group_keys = [keys[t.lease.task_id] for t in group]
            to_add.extend(group_keys)
            requests.append(_request(group, group_keys, owner, tenant))
        for task in again:
            requests.append(_request([task], [keys[task.lease.task_id]], owner, tenant))
    return requests, to_add


def _request(group: list[ClaimedTask], group_keys: list[str], owner: str, tenant: str) -> dg.RunRequest:
    pairs = [(t.lease.task_id, t.lease.attempt) for t in group]
    tags = {LEASES_TAG: encode_leases(pairs), OWNER_TAG: owner, TENANT_TAG: tenant}
    run_key = ",".join(f"{task_id}:{attempt}" for task_id, attempt in pairs)
    if len(group_keys) == 1:
        return dg.RunRequest(run_key=run_key, partition_key=group_keys[0], tags=tags)
    tags["dagster/asset_partition_range_start"] = group_keys[0]
    tags["dagster/asset_partition_range_end"] = group_keys[-1]
    return dg.RunRequest(run_key=run_key, tags=tags)


@dg.sensor(
    job=index_versions_job,
    minimum_interval_seconds=1,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Claims due index tasks (SKIP LOCKED lease) and starts runs for them, many versions per run.",
)
def claim_index_tasks(context: dg.SensorEvaluationContext, database: DatabaseResource) -> dg.SensorResult | dg.SkipReason:
    queue = TaskQueue(database.db, lease_seconds=LEASE_SECONDS)
    waiting = keep_waiting_leases(context.instance, queue)
    owner = f"batch-{uuid.uuid4().hex[:12]}"
    # With the run queue full, start no new work, but still take over expired leases (invariant 7:
    # nothing stays RUNNING past its lease plus one claim tick).
    queue_full = waiting >= MAX_WAITING_RUNS
    claimed = queue.claim(owner, limit=BATCH_MAX * max(1, RUN_SPREAD), expired_only=queue_full)
    if not claimed:
        if queue_full:
            return dg.SkipReason(f"{waiting} run(s) still waiting to start; no expired leases to take over")
        return dg.SkipReason("no due index tasks")
    _inject_fault_after_claim()
    rows = database.db.fetch_all("document_version_partition_keys", {"task_ids": [t.lease.task_id for t in claimed]})
    keys = {r["task_id"]: r["partition_key"] for r in rows}
    weights = {r["task_id"]: r["byte_size"] for r in rows}
    existing = {k for k in keys.values() if context.instance.has_dynamic_partition(VERSIONS_PARTITIONS_NAME, k)}
    requests, to_add = plan_runs(claimed, keys, existing, owner, BATCH_MAX, spread=RUN_SPREAD, batch_min=BATCH_MIN,
                                 weights=weights)
    models = _models(database, {t.profile for t in claimed})
    if models:
        requests = [r.with_replaced_attrs(tags={**r.tags, MODELS_TAG: models}) for r in requests]
    context.log.info(f"claimed {len(claimed)} task(s) as {owner}: {len(requests)} run(s)")
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[document_versions.build_add_request(to_add)] if to_add else [],
    )


def _models(database: DatabaseResource, profiles: set[str]) -> str:
    """The models of these profiles (a run tag: the run starts loading them before its first step)."""
    models = set()
    for name in profiles:
        row = database.db.fetch_one("index_profile_get", {"name": name})
        if row is not None:
            models.add(row["model"])
    return ",".join(sorted(models))


def keep_waiting_leases(instance: dg.DagsterInstance, queue: TaskQueue) -> int:
    """Heartbeat the leases of this job's runs that wait for a run slot; returns how many runs wait.

    A run queued behind the per-tenant limit may wait longer than a lease; without this its leases
    would expire before it starts and every version would be reclaimed one run each. The heartbeat
    is the ordinary fenced one under the run's own owner, so a lease already lost stays lost; runs
    queued longer than WAITING_LEASE_MAX_SECONDS are left to expire (a stuck queue loses nothing).
    """
    records = instance.get_run_records(RunsFilter(job_name=index_versions_job.name, statuses=WAITING))
    now = time.time()
    for record in records:
        if record.dagster_run.status not in NOT_LAUNCHED:  # a launched run's process keeps its own leases
            continue
        if now - record.create_timestamp.timestamp() > WAITING_LEASE_MAX_SECONDS:
            continue
        tags = record.dagster_run.tags
        owner = tags.get(OWNER_TAG)
        for task_id, attempt in decode_leases(tags.get(LEASES_TAG)) if owner else []:
            try:
                queue.heartbeat(Lease(task_id, attempt, owner, datetime.now(timezone.utc)))
            except KbindexError:  # lost, finished, cancelled, or a database hiccup: not ours to keep
                pass
    return len(records)


def _inject_fault_after_claim() -> None:
    """Fault injection for tests: die once after the claim committed (KBINDEX_FAULT_SENSOR_AFTER_CLAIM=marker file)."""
    marker = os.environ.get("KBINDEX_FAULT_SENSOR_AFTER_CLAIM")
    if marker and os.path.exists(marker):
        os.remove(marker)
        raise RuntimeError("injected fault: the sensor dies after its claim committed")


@dg.run_failure_sensor(
    monitored_jobs=[index_versions_job],
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=1,
    description="Records RUN_CRASHED for tasks of runs that died without recording an outcome (retried at once).",
)
def record_crashed_runs(context: dg.RunFailureSensorContext, database: DatabaseResource) -> None:
    queue = TaskQueue(database.db, lease_seconds=LEASE_SECONDS)
    run = context.dagster_run
    pairs = decode_leases(run.tags.get(LEASES_TAG))
    for task_id, attempt in pairs:
        status = queue.fail_unfenced_crash(task_id, attempt, "RUN_CRASHED", "the run process died before recording an outcome")
        if status is not None:
            context.log.info(f"task {task_id} attempt {attempt}: RUN_CRASHED -> {status}")
