"""The Dagster partition keys kbindex has added, so the live key set stays bounded by churn.

The claiming sensor records every key it adds; ``prunable`` names the keys of versions with nothing in
flight whose last addition is older than the lineage window, or that are not among the newest
``max_keys``, for pipelines/lineage_job.py to delete from Dagster, with the runs that worked on them (``runs_of``)
once they cover no live key. A version whose key was pruned keeps its history in task_event, Dagster run ids
included (``TaskQueue.dagster_runs``); if it is indexed again, the sensor simply adds its key again.

This is the one mechanism that deletes partition keys: retention removes chunks, never keys, so a version
it released (nothing left to search) loses its key here once nothing of it is in flight and its window or
the cap has passed, like every other finished version. Keys added before this ledger existed (migration
0020) were recorded by migration 0028.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from resources.database import Database

DEFAULT_LINEAGE_SECONDS = 7 * 24 * 3600.0
"""How long a finished version keeps its partition key (and so its lineage page) in the Dagster UI."""
DEFAULT_MAX_KEYS = 30_000
"""At most this many finished versions keep their key, the newest, whatever the churn. With 1M versions in
the corpus and 30k live keys the UI's partitions tab and asset graph answered in <= 1.02 s on a first request
and <= 0.49 s warm on this 2-core machine; at 50k a first request took 2.09 s, at 100k 4.41 s (bench.scale.ui).
While keys change (every new version adds one) each partitions-tab request rebuilds its status cache from every
materialization in Dagster's event log, ~1.5 s more per 100k pruned keys (README, "With history behind the live
keys"): so prune_lineage_keys also deletes the runs of the keys it prunes, with their events."""


def record_added(db: Database, keys: Sequence[str]) -> None:
    if keys:
        db.execute("dagster_partition_key_record", {"partition_keys": list(keys)})


def prunable(db: Database, *, window_seconds: float = DEFAULT_LINEAGE_SECONDS, max_keys: int = DEFAULT_MAX_KEYS,
             limit: int = 5000, now: datetime | None = None) -> list[str]:
    """Up to ``limit`` keys whose version has no task in flight, oldest first: those older than the window,
    and those beyond the newest ``max_keys``."""
    rows = db.fetch_all("dagster_partition_key_prunable",
                        {"window_seconds": window_seconds, "max_keys": max_keys, "limit": limit, "now": now})
    return [r["partition_key"] for r in rows]


def runs_of(db: Database, keys: Sequence[str]) -> list[str]:
    """The ids of the Dagster runs that worked on the versions with these keys (their tasks' lease owners)."""
    if not keys:
        return []
    return [r["run_id"] for r in db.fetch_all("dagster_partition_key_runs", {"partition_keys": list(keys)})]


def live(db: Database, keys: Sequence[str]) -> set[str]:
    """Which of these keys are recorded as still in Dagster."""
    if not keys:
        return set()
    return {r["partition_key"] for r in db.fetch_all("dagster_partition_key_live", {"partition_keys": list(keys)})}


def oldest_added(db: Database) -> datetime | None:
    """When the oldest recorded key was added (None: no key is recorded)."""
    return db.fetch_one("dagster_partition_key_oldest")["added_at"]


def walk_resumes_after(db: Database) -> datetime | None:
    """Where prune's walk over runs left behind resumes: after runs created then (None: from the oldest)."""
    return db.fetch_one("prune_run_walk_position")["after"]


def walk_stopped_at(db: Database, after: datetime | None) -> None:
    """The walk looked at runs created up to ``after``; None: it reached the end and starts over next time."""
    db.execute("prune_run_walk_move", {"after": after})


def forget(db: Database, keys: Sequence[str]) -> None:
    """These keys were deleted from Dagster."""
    if keys:
        db.execute("dagster_partition_key_forget", {"partition_keys": list(keys)})
