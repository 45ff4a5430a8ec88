"""A run host that embeds through the embedding service on another host (run by test_embed_partition.py in
namespace B): the real ``IndexingRun`` steps (parse, chunk, embed, publish), its embedder the one a Dagster run
gets for a ``tcp://`` service (``served_embedder``: the bare client, no local fallback), PostgreSQL over TCP.

``embed_worker.py DB_URL SERVICE_ADDRESS BLOBS ARTIFACTS LEASE_SECONDS BATCH`` runs one round per line read
on stdin: claim the due task (retrying for up to 20 s while it waits out its backoff), then the four steps.
One line per event:

``CLAIMED <task> <attempt>``, ``EMBEDDING <chunks>`` (the embed step starts),
``EMBED <outcome> <code or -> <seconds> <task status or ->`` (the step's result; a failure is recorded by the
run's fenced ``fail``, whose resulting status is the last word), ``PUBLISH <outcome> <code or -> <chunks>``.
"""

from __future__ import annotations

import sys
import time

from pipelines.domain.partition_keys import version_partition_key
from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.database import Database
from resources.embedding_service import served_embedder
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.run_state import RunState
from resources.task_queue import TaskQueue

OWNER = "run-host"


def say(*words: object) -> None:
    print(*words, flush=True)


def no_local_model() -> None:
    raise AssertionError("a run with a tcp:// service must not load the model itself")


def main(url: str, address: str, blobs: str, artifacts: str, lease_seconds: float, batch: int) -> None:
    db = Database(url, min_size=1, max_size=3, timeout=5.0, role="run")
    queue = TaskQueue(db, lease_seconds=lease_seconds, backoff_base=0.25, backoff_cap=1.0)
    keeper = LeaseKeeper(queue, interval=1.0)
    keeper.start()
    embedders: dict[str, object] = {}

    def embedder_for(model: str) -> object:  # one client per model and process, as EmbedderResource keeps it
        if model not in embedders:
            embedders[model] = served_embedder(model, address, no_local_model)
        return embedders[model]

    while sys.stdin.readline():
        deadline = time.monotonic() + 20
        claimed = []
        while not claimed and time.monotonic() < deadline:
            claimed = queue.claim(OWNER, limit=1)
            if not claimed:
                time.sleep(0.2)
        if not claimed:
            say("NOTHING")
            continue
        (task,) = claimed
        say("CLAIMED", task.lease.task_id, task.lease.attempt)
        run = IndexingRun(db=db, queue=queue, keeper=keeper, owner=OWNER, blobs=BlobStore(blobs),
                          embedder_for=embedder_for, state=RunState(ArtifactStore(artifacts)),
                          tagged=[(task.lease.task_id, task.lease.attempt)], batch_size=batch)
        key = version_partition_key(task.tenant_id, task.document_id, task.version_number)
        run.parse([key])
        (chunked,) = run.chunk([key])[key]
        say("EMBEDDING", chunked.details.get("chunks", "-"))
        started = time.monotonic()
        (embedded,) = run.embed([key])[key]
        say("EMBED", embedded.outcome, embedded.error_code or "-", round(time.monotonic() - started, 2),
            embedded.details.get("task_status", "-"))
        if embedded.outcome == "ok":
            (published,) = run.publish([key])[key]
            say("PUBLISH", published.outcome, published.error_code or "-", published.details.get("chunk_count", "-"))
        run.close()
    keeper.stop()
    db.close()


if __name__ == "__main__":
    url, address, blobs, artifacts, lease_s, batch = sys.argv[1:]
    main(url, address, blobs, artifacts, float(lease_s), int(batch))
