"""The source sensor: one sync pass over every source per interval, its counts on the tick.

The pass runs inside the sensor evaluation (it requests no run): it lists, compares with the ledger in
PostgreSQL, reads only changed files and publishes or deletes through the same Publisher as the CLI. The
index tasks it creates are then claimed by ``claim_index_tasks`` like any publish. Its state is the ledger
and ``source.last_pass`` in PostgreSQL, never the cursor: a reset cursor costs nothing. Each tick's
SkipReason carries the counts, so the Dagster UI's tick history is the pass history.

A tick is bounded (KBINDEX_SOURCE_TICK_SECONDS, default 40 s, below the daemon's 60-s gRPC limit): a pass
that reaches the budget stops reading, reports itself partial, and the next tick goes on from the ledger.
KBINDEX_SOURCE_REHASH_PER_PASS (default 0) rehashes that many unchanged files per source per tick.
"""

from __future__ import annotations

import os
import time

import dagster as dg

from resources.dagster_resources import BlobStoreResource, DatabaseResource
from resources.chunk_copy import fast_publish_for
from resources.publisher import Publisher
from resources.source_sync import SourceSync

SYNC_INTERVAL_SECONDS = int(os.environ.get("KBINDEX_SOURCE_SYNC_SECONDS", "60"))
TICK_BUDGET_SECONDS = float(os.environ.get("KBINDEX_SOURCE_TICK_SECONDS", "40"))
REHASH_PER_PASS = int(os.environ.get("KBINDEX_SOURCE_REHASH_PER_PASS", "0"))
"""Files per source per tick read although their size and stamp did not move, hashed longest ago first: finds,
within files / N ticks, a change that kept size and mtime. 0 (default): a pass over unchanged files reads nothing."""


@dg.sensor(
    name="sync_sources",
    minimum_interval_seconds=SYNC_INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="One sync pass over every source (`kbindex source add`): publishes new and changed files, "
                "deletes vanished ones within the safety share. Counts on each tick.",
)
def sync_sources(context: dg.SensorEvaluationContext, database: DatabaseResource,
                 blobs: BlobStoreResource) -> dg.SkipReason:
    db = database.db
    sync = SourceSync(db, Publisher(db, blobs.get_store(), fast=fast_publish_for(db)))  # deletes: no run needed
    started = time.monotonic()
    lines: list[str] = []
    for source in sync.list():
        left = TICK_BUDGET_SECONDS - (time.monotonic() - started)
        if left <= 0:
            lines.append(f"{source.name}: not synced this tick (tick budget spent), next tick")
            continue
        try:
            counts = sync.sync(source.name, budget_seconds=left, rehash_slice=REHASH_PER_PASS)
        except Exception as exc:  # one broken source must not stop the others; the tick says which
            context.log.warning(f"source {source.name}: pass failed: {type(exc).__name__}")
            lines.append(f"{source.name}: pass failed ({type(exc).__name__})")
            continue
        lines.append(f"{source.name}: {counts.summary()}")
    text = "; ".join(lines) if lines else "no sources (add one with `kbindex source add`)"
    context.log.info(text)
    return dg.SkipReason(text)
