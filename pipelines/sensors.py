"""Sensors: the claiming sensor that turns due index tasks into runs, and the crashed-run recorder.

The claiming sensor's leases are reservations (sql/queries/lease.sql): they last the longest expected
wait for a run slot (KBINDEX_RESERVATION_SECONDS), need no heartbeat, and the run adopts them when it
starts. If the tick dies before its runs are stored, nothing is lost: the next ticks see reservations
that no run names and end them after KBINDEX_ORPHAN_RESERVATION_SECONDS, and a claim takes the tasks
over without spending an attempt (invariant 7). Runs are requested only while at most
KBINDEX_MAX_WAITING_RUNS wait for a slot.
A deep queue becomes a few big runs spread over the tenant's run slots; a lone publish, one small run.
Retried versions join those runs: their existing partition keys are moved to the end of the key
order with the fresh ones (unless a live run still covers them). A crash shared by several tasks is
bisected (record_crashed_runs); a run that can do nothing useful any more (a queued run whose leases
were all taken over, a launched run that lost every lease) is canceled before the tick plans
its runs, so it pins no partition keys and gives its run slot back (release_runs).
A tick that finds nothing due waits up to KBINDEX_CLAIM_WAIT_SECONDS for a publish's NOTIFY and claims it
then, so a lone publish is not left for the daemon's next loop, 5 s later (resources/task_wakeup.py). There are
KBINDEX_CLAIM_SENSORS such sensors: a tick that claimed hands the rest of its wait to the next one, so a publish
made right after a claim does not wait for the next loop either (pipelines/claim_window.py).
"""


import contextlib
import os
import signal
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import dagster as dg
import psycopg
from dagster import DagsterRunStatus, RunsFilter

from pipelines.claim_window import ClaimWindow
from pipelines.jobs import index_versions_job
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from pipelines.stopping import stop_check, stop_requested
from pipelines.warm_launcher import WarmRunLauncher
from resources import dagster_private
from resources.dagster_resources import (
    MODELS_TAG,
    OWNER_TAG,
    TENANT_TAG,
    WINDOW_TAG,
    DatabaseResource,
    claim_owner_of,
    kept_database_resource,
    lease_tags,
    leases_of,
    run_key_of,
    run_owner,
)
from resources.partition_keys import record_added
from resources.task_queue import ClaimedTask, RunLeases, TaskQueue
from resources.task_wakeup import TaskWakeup

# A run is sized by its work, not its number of versions: a run pays a fixed cost (process start, imports,
# Dagster's step events: seconds), which 160 long documents spread thin and 160 abstracts do not (issue #14:
# small documents ran at ~0.3 of bare encode). ~160 documents of the shared corpus.
RUN_BYTES = int(os.environ.get("KBINDEX_RUN_BYTES", str(5 * 1024 * 1024)))
# What a version costs besides its text, in bytes of text: per version a run writes 4 materializations,
# 4 progress rows, an adoption and a transition, whatever its size (bench/per_version.py; the counts do
# not grow with the run's versions: 500 in one run cost less per version than 50). A version weighs its
# bytes plus this, so a run of tiny documents is bounded by that fixed cost, not by a count (issue #34).
VERSION_BYTES = int(os.environ.get("KBINDEX_RUN_VERSION_BYTES", "2048"))
# Versions per run, at most: the count that fills RUN_BYTES with empty versions (2,560 by default), a
# ceiling only tiny documents reach. It was a flat 320 because a 1,000-version run of abstracts once took
# ~3 minutes where ~300-version runs took ~20 s; per-version event batching and O(run) key ranges (issue
# #14) removed what grew, and bench/per_version.py pins that nothing a run writes per version grows with N.
# With VERSION_BYTES 0 (bytes alone) the ceiling stays the old 320: RUN_BYTES // 1 would let a tick ask for
# millions of due rows.
BATCH_MAX = int(os.environ.get("KBINDEX_RUN_BATCH", str(RUN_BYTES // VERSION_BYTES if VERSION_BYTES > 0 else 320)))
# Versions per run of lease takeovers, whose sizes are unknown before the claim.
BATCH_UNSIZED = int(os.environ.get("KBINDEX_RUN_BATCH_UNSIZED", "160"))
# A tick's fresh versions of one tenant are spread over this many runs (the per-tenant run limit in
# dagster.yaml), none smaller than BATCH_MIN: a deep queue fills every slot with one big run each,
# a shallow one gets one small run.
RUN_SPREAD = int(os.environ.get("KBINDEX_RUN_SPREAD", "2"))
BATCH_MIN = int(os.environ.get("KBINDEX_RUN_BATCH_MIN", "12"))
# ...and a tick's versions are spread over several runs only if each run gets this many bytes: a run's
# fixed cost (~3 core-seconds: process start, imports, step events) is worth ~300 chunks of embedding, so
# two runs of 20 abstracts cost twice that for nothing (the embedding service keeps every core busy for
# one run). A burst of 1,000 publishes on the 1M-version bench ended in two runs of 19 and 20.
RUN_SPLIT_BYTES = int(os.environ.get("KBINDEX_RUN_SPLIT_BYTES", str(256 * 1024)))
# A tick that finds nothing due waits this long for a publish (a task event's NOTIFY, resources/task_wakeup.py)
# and claims it at once, instead of at the next tick: the daemon ticks a sensor at most every 5 s. Kept below
# that loop so the daemon's other sensors still run every loop; 0 claims once per tick, as Dagster would.
# bench.delete, publish -> searchable p50: 3.5 s of the 5 s loop gave 2.02 s and 2.04 s; 4.5 s gave 1.76 s.
CLAIM_WAIT_SECONDS = float(os.environ.get("KBINDEX_CLAIM_WAIT_SECONDS", "4.5"))
# Woken by a publish, the tick waits this long before it claims: a delete or metadata-only change is published
# by its own publishing process right after the commit (resources/chunk_copy.py, milliseconds later), and a claim
# that beat it would send it through a run instead (2 of 10 of each in bench.delete without this grace).
CLAIM_WAKE_GRACE_SECONDS = float(os.environ.get("KBINDEX_CLAIM_WAKE_GRACE_SECONDS", "0.1"))
# Claiming sensors that share a daemon loop's wait (pipelines/claim_window.py): the loop can claim this many times
# on a wake-up. Published back to back, ~3 publishes fall in a 5-s loop; 1 is Dagster's way, one claim a loop.
CLAIM_SENSORS = max(1, int(os.environ.get("KBINDEX_CLAIM_SENSORS", "3")))
# A later tick of the loop claims on a wake-up only when this many versions or fewer are due: a lone publish,
# not a stream of them (a stream waits for the next loop's first tick and goes in bigger runs, each run paying
# its fixed cost once). The loop's first tick claims whatever is due, as before.
WAKE_CLAIM_MAX = int(os.environ.get("KBINDEX_WAKE_CLAIM_MAX", "12"))
MAX_WAITING_RUNS = int(os.environ.get("KBINDEX_MAX_WAITING_RUNS", "1"))
# A run STARTING this long with no process, that the warm launcher never forked, lost its launch (fail_lost_launches).
# A launch reaches the fork server milliseconds after the run is marked STARTING.
LOST_LAUNCH_SECONDS = float(os.environ.get("KBINDEX_LOST_LAUNCH_SECONDS", "30"))
LEASE_SECONDS = float(os.environ.get("KBINDEX_LEASE_SECONDS", "60"))
# A reservation lasts the longest expected wait for a run slot: a run queued behind the per-tenant limit
# must find its leases still reserved when it starts (issue #28: at 60-s leases and load ~25, a run lost
# all 150 before it started, and each came back as a one-version run).
RESERVATION_SECONDS = float(os.environ.get("KBINDEX_RESERVATION_SECONDS", "900"))
# A reservation that no run names this long after its claim was orphaned (the tick died after claiming,
# or the gRPC call timed out before its runs were stored: up to 60 s).
ORPHAN_GRACE_SECONDS = float(os.environ.get("KBINDEX_ORPHAN_RESERVATION_SECONDS", str(max(120.0, 2 * LEASE_SECONDS))))
# How often a reservation may end without its run starting before the task ends DEAD RUN_NEVER_STARTED.
GIVEBACK_LIMIT = int(os.environ.get("KBINDEX_RESERVATION_GIVEBACKS", "5"))
WAITING = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]
LAUNCHED = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]  # each holds a run slot
LIVE = [*WAITING, *LAUNCHED]
ASSET_JOB_NAME = "__ASSET_JOB"  # UI materializations; a re-execution keeps the lease tags of its parent
PARTITION_TAGS = ("dagster/partition", "dagster/asset_partition_range_start", "dagster/asset_partition_range_end")


def version_weight(size: int, version_bytes: int) -> int:
    """What one version weighs in a run's budget: its bytes (at least 1) plus its fixed cost."""
    return max(1, size) + version_bytes


def claim_count(due_bytes: list[int], budget: int, floor: int, version_bytes: int = 0) -> int:
    """How many of the due versions (byte sizes, in claim order) to claim: as many as fit ``budget``
    bytes, at least ``floor`` (or all of them, if fewer are due); each version weighs ``version_bytes``
    more than its size (its fixed cost)."""
    total = count = 0
    for size in due_bytes:
        total += version_weight(size, version_bytes)
        if total > budget and count >= floor:
            break
        count += 1
    return count


def split_sizes(n: int, batch_max: int, spread: int = 1, batch_min: int = 1, min_runs: int = 1) -> list[int]:
    """Sizes of the runs for ``n`` fresh versions: as even as possible, at most ``batch_max`` each,
    over at least ``spread`` runs when every run still gets ``batch_min`` versions, and over at least
    ``min_runs`` (the byte budget's count) as long as each gets a version."""
    if n <= 0:
        return []
    runs = max(-(-n // max(1, batch_max)), min(max(1, spread), max(1, n // max(1, batch_min))), min(n, min_runs))
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


@dataclass
class RunPlan:
    """The run requests of one tick and the partition keys to move or add, in key order."""

    requests: list[dg.RunRequest] = field(default_factory=list)
    add: list[str] = field(default_factory=list)
    """Keys to add, in this order: each run's keys end up contiguous (its range)."""
    delete: list[str] = field(default_factory=list)
    """Existing keys to delete first so that re-adding them puts them at the end (retries, takeovers)."""


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
    caps: dict[int, int | None] | None = None,
    pinned: set[str] = frozenset(),  # type: ignore[assignment]
    run_bytes: int = 0,
    split_bytes: int = 0,
    version_bytes: int = 0,
) -> RunPlan:
    """Group claimed tasks into run requests over contiguous partition-key ranges.

    A run covers the range of its keys in insertion order, so a key must be (re)added together
    with its batch-mates. A key that already exists (a retry, a takeover, another profile's task
    of the same version) is deleted and re-added with the fresh ones, so retried versions share
    big runs too, unless a run that is not finished still covers it (``pinned``): moving it would
    change that run's range under it, so it gets a run of its own as before. The tasks of one key
    always share a run. Tasks with a crash-bisection cap (``caps``) run in groups of the same cap,
    at most that many tasks per run. ``run_bytes`` (with ``weights``, the versions' byte sizes): no run
    carries much more than that many bytes; ``split_bytes``: the versions are spread over ``spread`` runs
    only as far as each run gets that many bytes; ``version_bytes``: what each version weighs besides
    its bytes (its fixed cost), so a run of tiny versions is bounded by their number times that.
    """
    caps = caps or {}
    plan = RunPlan()
    by_tenant: dict[str, dict[str, list[ClaimedTask]]] = defaultdict(dict)
    for task in claimed:  # tenant -> key -> its tasks, in claim order
        by_tenant[task.tenant_id].setdefault(keys[task.lease.task_id], []).append(task)
    for tenant, units in by_tenant.items():
        free: list[str] = []
        capped: dict[int, list[str]] = defaultdict(list)
        for key, tasks in units.items():
            if key in existing and key in pinned:
                plan.requests.append(_request(tasks, [key], owner, tenant))
                continue
            if key in existing:
                plan.delete.append(key)
            task_caps = [c for c in (caps.get(t.lease.task_id) for t in tasks) if c]
            (capped[min(task_caps)] if task_caps else free).append(key)
        unit_weights = [sum(version_weight((weights or {}).get(t.lease.task_id, 1), version_bytes) for t in units[k])
                        for k in free]
        by_bytes = -(-sum(unit_weights) // run_bytes) if weights and run_bytes > 0 else 1
        worth = max(1, sum(unit_weights) // split_bytes) if weights and split_bytes > 0 else spread
        sizes = split_sizes(len(free), batch_max, min(spread, worth), batch_min, min_runs=by_bytes)
        if weights:
            sizes = balance_sizes(unit_weights, sizes, batch_max)
        groups = _cut(free, sizes)
        for cap, group_keys in sorted(capped.items(), reverse=True):
            groups.extend(_pack(group_keys, units, min(cap, batch_max)))
        for group_keys in groups:
            plan.add.extend(group_keys)
            plan.requests.append(_request([t for k in group_keys for t in units[k]], group_keys, owner, tenant))
    return plan


def _cut(items: list[str], sizes: list[int]) -> list[list[str]]:
    out, start = [], 0
    for size in sizes:
        out.append(items[start : start + size])
        start += size
    return out


def _pack(group_keys: list[str], units: dict[str, list[ClaimedTask]], cap: int) -> list[list[str]]:
    """Consecutive runs of at most ``cap`` tasks (a key's tasks are never split; a key alone may exceed it)."""
    out: list[list[str]] = []
    count = 0
    for key in group_keys:
        n = len(units[key])
        if not out or count + n > cap:
            out.append([])
            count = 0
        out[-1].append(key)
        count += n
    return out


def run_tags(pairs: list[tuple[int, int]], keys: list[str], owner: str, tenant: str) -> dict[str, str]:
    """The tags the sensor gives a run of these leases over these keys: the leases, owner and tenant, and the key
    range when there is more than one key (one key goes in the request's partition key instead)."""
    tags = {**lease_tags(pairs), OWNER_TAG: owner, TENANT_TAG: tenant}
    if len(keys) > 1:
        tags["dagster/asset_partition_range_start"] = keys[0]
        tags["dagster/asset_partition_range_end"] = keys[-1]
    return tags


def _request(group: list[ClaimedTask], group_keys: list[str], owner: str, tenant: str) -> dg.RunRequest:
    pairs = [(t.lease.task_id, t.lease.attempt) for t in group]
    tags = run_tags(pairs, group_keys, owner, tenant)
    run_key = run_key_of(pairs)  # a run tag too (dagster/run_key): bounded like the lease tags
    if len(group_keys) == 1:
        return dg.RunRequest(run_key=run_key, partition_key=group_keys[0], tags=tags)
    return dg.RunRequest(run_key=run_key, tags=tags)


CLAIM_WINDOW = ClaimWindow()


def claiming_sensor(name: str) -> dg.SensorDefinition:
    """One claiming sensor; all of them run the same tick (``claim_tick``) and share the loop's wait window."""

    @dg.sensor(
        name=name,
        job=index_versions_job,
        minimum_interval_seconds=1,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Claims due index tasks (SKIP LOCKED lease) and starts runs for them, many versions per run.",
    )
    def _claim(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        return claim_tick(context, name)

    return _claim


def claim_tick(context: dg.SensorEvaluationContext, name: str) -> dg.SensorResult | dg.SkipReason:
    """One tick of the claiming sensor ``name``: take over, claim, wait for a publish, plan the runs."""
    if stop_requested():
        # `kbindex dev` is stopping Dagster: a task claimed now would wait reserved (up to RESERVATION_SECONDS) for
        # a run that never starts. Seen under load: a run killed by the stop was recorded RUN_CRASHED, claimed
        # again by a tick in the stop's last seconds, and not claimable for 45 s after it.
        return dg.SkipReason("kbindex dev is stopping Dagster: nothing is claimed")
    window = CLAIM_WINDOW.enter(name, time.monotonic(), CLAIM_WAIT_SECONDS)
    if window.ended(time.monotonic()):
        return dg.SkipReason("this daemon loop's claim window has ended: the loop's first claiming tick claimed")
    database = tick_database_resource(context)
    queue = task_queue(database)
    instance = tick_instance(context)
    runs = leased_runs(instance)  # one read of Dagster's live runs serves the whole tick
    lost = fail_lost_launches(instance, runs)
    if lost:
        context.log.warning(f"run(s) {', '.join(lost)} were left STARTING by a lost launch: failed, their tasks given back")
        runs = [r for r in runs if r.run.run_id not in lost]
    orphaned = queue.expire_orphaned_reservations(sorted({r.leases.owner for r in runs}), ORPHAN_GRACE_SECONDS)
    if orphaned:
        context.log.warning(f"{orphaned} reservation(s) had no run {ORPHAN_GRACE_SECONDS:.0f} s after their claim: "
                            "taken over without spending an attempt")
    waiting = sum(1 for r in runs if r.leases.waiting)
    owner = f"batch-{uuid.uuid4().hex[:12]}"
    # With the run queue full, start no new work, but still take over expired leases (invariant 7:
    # nothing stays RUNNING past its lease plus one claim tick).
    queue_full = waiting >= MAX_WAITING_RUNS
    # The loop's first tick does not wait with the queue full (nothing it claims could start); a later one does:
    # the queue is full of the run the loop just requested, which starts within a second or so.
    wait = window.deadline > time.monotonic() and (not queue_full or not window.opened)
    with contextlib.ExitStack() as stack:
        wakeup = _listen(stack, database, context) if wait else None  # LISTEN before the claim: none missed
        claimed = claim_due(database, queue, owner, queue_full)
        # After the claim (a slow cancel never delays a takeover, invariant 7) and before planning: a released
        # run pins no keys, so the tasks taken over from it share big runs instead of getting one run each.
        released = release_runs(instance, queue, runs)
        for run_id in released:
            context.log.warning(f"run {run_id} holds none of its leases any more: canceled to free its run slot")
        # Stopping ends the wait at once: Dagster's stop waits for this RPC (pipelines/stopping.py).
        while not claimed and wakeup is not None and wakeup.wait(window.deadline, stop=stop_check()):
            time.sleep(CLAIM_WAKE_GRACE_SECONDS)  # a publisher's own fast path claims its task first
            claimed = claim_on_wake(database, queue, instance, owner, any_size=window.opened)
    if not claimed:
        if queue_full:
            return dg.SkipReason(f"{waiting} run(s) still waiting to start; no expired leases to take over")
        return dg.SkipReason("no due index tasks")
    _inject_fault_after_claim()
    rows = database.db.fetch_all("run_plan_inputs", {"task_ids": [t.lease.task_id for t in claimed]})
    keys = {r["task_id"]: r["partition_key"] for r in rows}
    weights = {r["task_id"]: r["byte_size"] for r in rows}
    caps = {r["task_id"]: r["run_size_cap"] for r in rows}
    # One indexed membership query for all keys (has_dynamic_partition costs ~11 ms per key at 100k keys).
    existing = set(instance.get_existing_dynamic_partitions(VERSIONS_PARTITIONS_NAME, list(set(keys.values()))))
    # A backfill in progress plans its runs as key ranges resolved only when each run executes:
    # moving keys under it would bend those ranges (seen in bench.chaos --migration), so keys stay.
    live = [r.run for r in runs if r.run.run_id not in set(released)]
    pinned = (existing if dagster_private.backfill_in_progress(instance) else live_run_keys(live, database)
              ) if existing else set()
    plan = plan_runs(claimed, keys, existing, owner, BATCH_MAX, spread=RUN_SPREAD, batch_min=BATCH_MIN,
                     weights=weights, caps=caps, pinned=pinned, run_bytes=RUN_BYTES, split_bytes=RUN_SPLIT_BYTES,
                     version_bytes=VERSION_BYTES)
    # Moved keys are deleted here and re-added, in plan order, with the new ones: one statement for them
    # all. (Returned as a SensorResult's dynamic partitions request, the daemon would first ask for each key
    # on its own whether it exists: a round trip per key, 16 s a 16-version tick over a 500-ms link.) If the
    # tick dies in between, the keys are simply missing or unused: the reservations are orphaned and the next
    # claim adds them afresh.
    for key in plan.delete:
        instance.delete_dynamic_partition(VERSIONS_PARTITIONS_NAME, key)
    if plan.add:
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, plan.add)
    models = _models(database, {t.profile for t in claimed})
    extra = {WINDOW_TAG: "opened" if window.opened else "handed", **({MODELS_TAG: models} if models else {})}
    requests = [r.with_replaced_attrs(tags={**r.tags, **extra}) for r in plan.requests]
    context.log.info(f"claimed {len(claimed)} task(s) as {owner}: {len(requests)} run(s), {len(plan.add)} key(s) added, "
                     f"{len(plan.delete)} moved")
    record_added(database.db, plan.add)  # the lineage window counts from here (prune_lineage_keys)
    return dg.SensorResult(run_requests=requests)


claim_index_tasks = claiming_sensor("claim_index_tasks")
CLAIMING_SENSORS = [claim_index_tasks, *(claiming_sensor(f"claim_index_tasks_{i}") for i in range(2, CLAIM_SENSORS + 1))]


def claim_on_wake(database: DatabaseResource, queue: TaskQueue, instance: dg.DagsterInstance, owner: str,
                  any_size: bool) -> list[ClaimedTask]:
    """What a waiting tick claims when a task event wakes it: nothing while nothing is due (most events are other
    runs' progress), nothing while the run queue is full (the run this loop requested may not have started yet),
    and, unless ``any_size`` (the loop's first tick), nothing while more than WAKE_CLAIM_MAX versions are due."""
    due = database.db.fetch_all("task_due_sizes", {"limit": WAKE_CLAIM_MAX + 1})
    if not due or (not any_size and len(due) > WAKE_CLAIM_MAX):
        return []
    if sum(1 for r in leased_runs(instance) if r.leases.waiting) >= MAX_WAITING_RUNS:
        return []
    return claim_due(database, queue, owner, queue_full=False)


def claim_due(database: DatabaseResource, queue: TaskQueue, owner: str, queue_full: bool) -> list[ClaimedTask]:
    """Claim what is due for ``owner``: live work sized by claim_limit (only expired leases with the run queue
    full), then requested profile backfills in the capacity it left. for_run: each lease is a reservation its
    run adopts when it starts (task_adopt); one that ends unadopted gives its attempt back."""
    limit, left = claim_limit(database, queue_full)
    claimed = queue.claim(owner, limit=limit, expired_only=queue_full, for_run=True)
    if not queue_full and len(claimed) < limit and left > 0:
        # Capacity live work left free goes to requested profile backfills (a model migration): the
        # tick's run slots, not the live claim's limit (which, with nothing due, is only room for
        # BATCH_UNSIZED takeovers per slot and held a migration to half its runs' size).
        room = backfill_limit(database, BATCH_MAX * max(1, RUN_SPREAD) - len(claimed), left, bool(claimed))
        claimed += queue.claim_backfill(owner, room, for_run=True) if room else []
    return claimed


def _listen(stack: contextlib.ExitStack, database: DatabaseResource,
            context: dg.SensorEvaluationContext) -> TaskWakeup | None:
    """The tick's wake-up on new task events, or None (the LISTEN failed: the tick then claims once, as without
    it, and says why)."""
    try:
        return stack.enter_context(TaskWakeup(database.db.url))
    except psycopg.Error as exc:
        context.log.warning(f"could not LISTEN for new tasks ({type(exc).__name__}): claiming once this tick")
        return None


def task_queue(database: DatabaseResource) -> TaskQueue:
    """The task queue as the sensors use it: leases, reservations and give-backs from the environment."""
    return TaskQueue(database.db, lease_seconds=LEASE_SECONDS, reservation_seconds=RESERVATION_SECONDS,
                     giveback_limit=GIVEBACK_LIMIT)


def claim_limit(database: DatabaseResource, queue_full: bool) -> tuple[int, int]:
    """How many tasks this tick claims, and the bytes it leaves for a profile backfill.

    The due versions that fill ``RUN_SPREAD`` runs of ``RUN_BYTES`` (one indexed read of the queue's
    head, O(limit)), at most ``BATCH_MAX`` per run; when all that is due fits, room for
    ``BATCH_UNSIZED`` per run of lease takeovers (their sizes are not known before the claim).
    """
    spread = max(1, RUN_SPREAD)
    unsized = min(BATCH_UNSIZED, BATCH_MAX) * spread
    if queue_full:
        return unsized, 0
    budget = RUN_BYTES * spread
    due = [r["byte_size"] for r in database.db.fetch_all("task_due_sizes", {"limit": BATCH_MAX * spread})]
    count = claim_count(due, budget, min(len(due), BATCH_MIN * spread), VERSION_BYTES)
    if count < len(due):
        return count, 0
    return max(count, unsized), max(0, budget - sum(version_weight(b, VERSION_BYTES) for b in due))


def backfill_limit(database: DatabaseResource, slots: int, budget: int, claimed_any: bool) -> int:
    """How many backlog tasks of requested profile backfills fill ``budget`` bytes (a model migration
    gets what live work left, sized like it; at least ``BATCH_MIN`` per run when nothing else was claimed)."""
    if slots < 1:
        return 0
    sizes = [r["byte_size"] for r in database.db.fetch_all("task_backfill_sizes", {"limit": slots})]
    floor = 0 if claimed_any else min(len(sizes), BATCH_MIN * max(1, RUN_SPREAD))
    return claim_count(sizes, budget, floor, VERSION_BYTES)


@dataclass(frozen=True)
class LeasedRun:
    """A live Dagster run that carries kbindex leases in its tags."""

    run: dg.DagsterRun
    leases: RunLeases
    since: float = 0.0
    """When its status last changed (epoch seconds)."""


_TICK_INSTANCES: dict[str, dg.DagsterInstance] = {}
_TICK_INSTANCES_LOCK = threading.Lock()


def tick_database_resource(context: dg.SensorEvaluationContext) -> DatabaseResource:
    """The claiming sensor's database: the context's ``database`` resource when it brings one (tests), else the
    code location's (KBINDEX_DATABASE_URL) on this process's kept pool.

    Not a declared resource on purpose: for a sensor with resources, Dagster builds a Dagster instance from
    the daemon's ref on every tick just to hand it to the resources (three storages: new connections, their
    driver set-up and catalog queries; the kbindex resources never read it), about half of an idle code
    location's Dagster statements, and ~30 round trips a tick over a slow link. The sensor reads Dagster
    through ``tick_instance``, kept too.
    """
    if "database" in (context.resource_defs or {}):
        return context.resources.database
    return kept_database_resource()


def tick_instance(context: dg.SensorEvaluationContext) -> dg.DagsterInstance:
    """The Dagster instance a tick reads and writes through: one per code-server process and instance, kept.

    ``context.instance`` builds a new instance from the daemon's ref on every evaluation and disposes of it after:
    new storage engines and their connections, and the schedule storage's table checks, ~25 ms of this
    process's CPU and ~30 ms of PostgreSQL's per tick (every ~5 s, idle or not), against ~5 ms with one kept
    instance. Its pooled engines test a connection that sat idle before using it, so a PostgreSQL restart is
    survived as by the daemon's own long-lived instance. The context is lent it (``context.log`` would build
    another). A context built with an instance of its own (tests) keeps that one.
    """
    ref = context.instance_ref
    if ref is None:
        return context.instance
    key = dg.serialize_value(ref)
    with _TICK_INSTANCES_LOCK:
        instance = _TICK_INSTANCES.get(key)
        if instance is None:
            instance = _TICK_INSTANCES[key] = dg.DagsterInstance.from_ref(ref)
    dagster_private.lend_instance(context, instance)  # context.log would build yet another one
    return instance


def leased_runs(instance: dg.DagsterInstance) -> list[LeasedRun]:
    """The runs of the index job and of UI materializations that are queued or hold a run slot and carry
    lease tags: one read of Dagster's run records, O(live runs)."""
    out = []
    for record in instance.get_run_records(RunsFilter(statuses=LIVE)):
        run = record.dagster_run
        pairs, owner = leases_of(run.tags), claim_owner_of(run.tags)
        if run.job_name in (index_versions_job.name, ASSET_JOB_NAME) and pairs and owner:
            out.append(LeasedRun(run, RunLeases(owner, run_owner(run.run_id), pairs, run.status in WAITING),
                                 record.update_timestamp.timestamp()))
    return out


def fail_lost_launches(instance: dg.DagsterInstance, runs: list[LeasedRun]) -> list[str]:
    """Fail the runs STARTING for over LOST_LAUNCH_SECONDS whose launch the warm launcher says was lost; their ids.

    A run dequeued just as PostgreSQL went away can be left STARTING with no process: its launch failed and
    Dagster could not record that. It counts as waiting to start, so with the run queue full it held every new
    claim until run monitoring's start timeout (seen in test_chaos_small, about 1 in 40 paired runs). Failed
    here, the crash sensor gives its tasks back (never started: no attempt spent). Only the warm launcher can
    tell a lost launch from a slow one; with another launcher, run monitoring's timeout remains.
    """
    launcher = instance.run_launcher
    if not isinstance(launcher, WarmRunLauncher):
        return []
    now, failed = time.time(), []
    for r in runs:
        if r.run.status != DagsterRunStatus.STARTING or now - r.since < LOST_LAUNCH_SECONDS:
            continue
        if launcher.launch_was_lost(r.run):
            current = instance.get_run_by_id(r.run.run_id)
            if current is not None and current.status == DagsterRunStatus.STARTING:
                instance.report_run_failed(current, f"kbindex: STARTING for {now - r.since:.0f} s with no run process, "
                                                    "and the warm launcher never forked one (a lost launch)")
                failed.append(r.run.run_id)
    return failed


def keys_by_run(runs: list[dg.DagsterRun], database: DatabaseResource) -> dict[str, set[str]]:
    """The partition keys each run covers: its key, its range ends, its tagged tasks' keys (every key of a run the
    sensor requested: its lease tags name all its tasks). One query for all the runs."""
    keys = {run.run_id: {v for k in PARTITION_TAGS if (v := run.tags.get(k))} for run in runs}
    runs_of_task: dict[int, list[str]] = {}
    for run in runs:
        for task_id, _ in leases_of(run.tags):
            runs_of_task.setdefault(task_id, []).append(run.run_id)
    if runs_of_task:
        for r in database.db.fetch_all("run_plan_inputs", {"task_ids": list(runs_of_task)}):
            for run_id in runs_of_task[r["task_id"]]:
                keys[run_id].add(r["partition_key"])
    return keys


def live_run_keys(runs: list[dg.DagsterRun], database: DatabaseResource) -> set[str]:
    """Partition keys that a run not yet finished covers (``keys_by_run``).

    Such a key must not move: Dagster resolves a run's key range at each step, so moving an end
    would shrink or stretch the range under the run. O(live runs): the queue plus the run slots.
    """
    return set().union(*keys_by_run(runs, database).values())


def release_runs(instance: dg.DagsterInstance, queue: TaskQueue, runs: list[LeasedRun]) -> list[str]:
    """Cancel the runs that can do nothing useful any more; returns their ids.

    One statement judges them all (``lease_runs_to_release``): a queued run whose leases were all taken over
    would only start to adopt nothing, while pinning its partition keys; a launched run whose
    process hangs (SIGSTOP, a stuck call) stops heartbeating, its leases are taken over, but Dagster still
    counts it as started, so it keeps a run slot and due work waits behind the per-tenant run limit. A run
    whose publish transaction holds its rows is never judged hung, even if its leases ran out meanwhile.
    The launcher is asked to terminate a launched run (a K8s/Docker launcher stops its pod; a process of
    this code server that cannot react, being stopped, is killed), and the run is marked canceled so the
    run queue frees the slot at once.
    """
    if not runs:
        return []
    released = []
    for ix in queue.runs_to_release([r.leases for r in runs]):
        run = runs[ix].run
        if not runs[ix].leases.waiting:
            _stop_run_process(instance, run)
        current = instance.get_run_by_id(run.run_id)
        if current is not None and not current.is_finished:
            instance.report_run_canceled(current, message="kbindex: the run holds none of its leases any more "
                                                          "(taken over, cancelled, or hung)")
        released.append(run.run_id)
    return released


def _stop_run_process(instance: dg.DagsterInstance, run: dg.DagsterRun) -> None:
    """Stop the run's process where the launcher can (the caller then marks the run canceled)."""
    if dagster_private.is_default_run_launcher(instance.run_launcher):
        # Its terminate is a gRPC call to the code server that evaluates this very sensor: it can
        # block the tick (seen: a SIGSTOPped run stalled every later claim). Kill our child instead.
        _kill_child_run_process(instance, run.run_id)
    else:
        try:
            instance.run_launcher.terminate(run.run_id)  # K8s, Docker, ECS: stop the pod or task
        except Exception:  # noqa: BLE001 - best effort: the caller marks the run canceled either way
            pass


def _kill_child_run_process(instance: dg.DagsterInstance, run_id: str) -> None:
    """SIGKILL the run's process if it is a child of this process (the code server that launched it).

    The default run launcher's terminate only sets an event the run process polls; a stopped
    process never sees it. The pid comes from the run's "Started process" engine event; checking
    the parent first keeps a recycled pid or a process on another host out of reach.
    """
    for pid in dagster_private.run_process_pids(instance, run_id):
        if _parent_pid(pid) == os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _models(database: DatabaseResource, profiles: set[str]) -> str:
    """The models of these profiles (a run tag: the run starts loading them before its first step)."""
    models = set()
    for name in profiles:
        row = database.db.fetch_one("index_profile_get", {"name": name})
        if row is not None:
            models.add(row["model"])
    return ",".join(sorted(models))


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
    description=("Records RUN_CRASHED for tasks of runs that died without recording an outcome (retried at once; "
                 "a crash shared by several tasks costs none of them an attempt and halves their next run); "
                 "tasks the run never started are given back."),
)
def record_crashed_runs(context: dg.RunFailureSensorContext) -> None:
    database = tick_database_resource(context)  # not a declared resource: see tick_database_resource
    run = context.dagster_run
    owner = claim_owner_of(run.tags)
    if not owner:
        return
    outcomes = task_queue(database).fail_crashed_run(
        leases_of(run.tags), "RUN_CRASHED", "the run process died before recording an outcome",
        owner=owner, run_owner=run_owner(run.run_id))
    for o in outcomes:
        if o.given_back:
            context.log.info(f"task {o.task_id}: never started by this run -> {o.status} (attempt given back)")
            continue
        cap = f" (next run at most {o.run_size_cap} task(s))" if o.run_size_cap and len(outcomes) > 1 else ""
        context.log.info(f"task {o.task_id}: RUN_CRASHED -> {o.status}{cap}")


# Dagster's run-status wrapper reads the tick's context.instance before the function above is called; lent the
# process's kept instance first, it builds none from the daemon's ref per tick (tick_instance).
record_crashed_runs = dagster_private.run_before_evaluation(record_crashed_runs, tick_instance)
