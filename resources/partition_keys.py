"""The Dagster partition keys kbindex has added, so the live key set stays bounded by churn.

The claiming sensor records every key it adds; ``prunable`` names the keys of versions with nothing in
flight whose last addition is older than the lineage window, for pipelines/lineage_job.py to delete
from Dagster. A version whose key was pruned keeps its history in task_event, Dagster run ids
included (``TaskQueue.dagster_runs``); if it is indexed again, the sensor simply adds its key again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from resources.database import Database

DEFAULT_LINEAGE_SECONDS = 7 * 24 * 3600.0
"""How long a finished version keeps its partition key (and so its lineage page) in the Dagster UI."""


def record_added(db: Database, keys: Sequence[str]) -> None:
    if keys:
        db.execute("dagster_partition_key_record", {"partition_keys": list(keys)})


def prunable(db: Database, *, window_seconds: float = DEFAULT_LINEAGE_SECONDS, limit: int = 5000,
             now: datetime | None = None) -> list[str]:
    """Up to ``limit`` keys older than the window whose version has no task in flight, oldest first."""
    rows = db.fetch_all("dagster_partition_key_prunable",
                        {"window_seconds": window_seconds, "limit": limit, "now": now})
    return [r["partition_key"] for r in rows]


def forget(db: Database, keys: Sequence[str]) -> None:
    """These keys were deleted from Dagster."""
    if keys:
        db.execute("dagster_partition_key_forget", {"partition_keys": list(keys)})
