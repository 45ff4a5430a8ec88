"""The kbindex side of ``bench.peers``: the same rounds through the real indexing code, without Dagster.

Each round publishes the documents (``Publisher``), claims the tasks that creates and runs them through
``IndexingRun`` (parse -> chunk -> embed -> publish) on a migrated scratch database, as
tests/integration/test_reuse_counts.py does. Counts are the embed step's own: texts ``embedded``,
``reused`` from stored vectors, ``shared`` within the run. Re-publishing identical bytes creates no
version and no task, so a re-run embeds nothing because there is nothing to run.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TENANT = "bench-peers"
OWNER = "bench-peers"


@contextmanager
def scratch_database() -> Iterator[str]:
    """A migrated database on KBINDEX_DATABASE_URL's server or a throwaway embedded one; dropped afterwards."""
    import os

    from bench import server_url
    from bench.queue.__main__ import scratch_database as migrated

    with server_url() as admin_url, migrated(admin_url, f"kbindex_bench_peers_{os.getpid()}") as url:
        yield url


class KbindexRounds:
    """Publish-and-index rounds on one database, with one embedder for every round."""

    def __init__(self, url: str, *, model: str | None, batch_size: int) -> None:
        from resources.blob_store import BlobStore
        from resources.database import Database
        from resources.embedder import embedder_for_model
        from resources.publisher import Publisher
        from resources.task_queue import TaskQueue

        if model is not None:  # e.g. fake-384: the same counts without the model's cost
            self._set_model(url, model)
        self.db = Database(url, max_size=4)
        self.profile = self.db.fetch_one("index_profile_active")
        self.embedder = embedder_for_model(self.profile["model"], batch_size=batch_size)
        self.embedder.embed(["warm up"])  # load the model before timing anything
        self.blob_dir = tempfile.mkdtemp(prefix="kbindex-bench-peers-")
        self.blobs = BlobStore(self.blob_dir)
        self.publisher = Publisher(self.db, self.blobs)
        self.queue = TaskQueue(self.db, lease_seconds=600)
        self.batch_size = batch_size

    @staticmethod
    def _set_model(url: str, model: str) -> None:
        import psycopg

        from sql import queries

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(queries["bench_set_active_model"], {"model": model})

    def close(self) -> None:
        self.db.close()
        shutil.rmtree(self.blob_dir, ignore_errors=True)

    def round(self, documents: list[tuple[str, bytes]]) -> dict[str, Any]:
        """Publish ``documents`` and index every task that created; counts summed over the tasks."""
        from resources.indexing_run import IndexingRun
        from resources.lease_keeper import LeaseKeeper

        started = time.perf_counter()
        for name, data in documents:
            self.publisher.publish(TENANT, name, data, name)
        claimed = self.queue.claim(OWNER, limit=max(1, len(documents)))
        totals = {"tasks": len(claimed), "chunks": 0, "embedded": 0, "reused": 0, "shared": 0}
        if claimed:
            leases = [(t.lease.task_id, t.lease.attempt) for t in claimed]
            keys = sorted({r["partition_key"] for r in self.db.fetch_all(
                "document_version_partition_keys", {"task_ids": [task_id for task_id, _ in leases]})})
            run = IndexingRun(db=self.db, queue=self.queue, keeper=LeaseKeeper(self.queue), owner=OWNER,
                              blobs=self.blobs, embedder_for=lambda _model: self.embedder, tagged=leases,
                              batch_size=self.batch_size)
            run.parse(keys)
            run.chunk(keys)
            embedded = run.embed(keys)
            published = run.publish(keys)
            failed = [r for rs in published.values() for r in rs if r.outcome != "ok"]
            if failed:
                raise RuntimeError(f"kbindex round: {len(failed)} task(s) did not publish: {failed[0]}")
            for result in (r for rs in embedded.values() for r in rs):
                totals["chunks"] += int(result.details["vectors"])
                for name in ("embedded", "reused", "shared"):
                    totals[name] += int(result.details[name])
        totals["seconds"] = round(time.perf_counter() - started, 2)
        return totals
