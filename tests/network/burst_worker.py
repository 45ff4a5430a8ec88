"""A kbindex worker for the burst over a slow, lossy link (tests/network/burst.py runs several in namespace B).

``burst_worker.py URL OWNER LEASE_SECONDS BATCH EMBED_SECONDS [freeze]`` loops until a line arrives on stdin: claim up to
BATCH due or lease-expired tasks (the real ``TaskQueue.claim``), keep their leases with a ``LeaseKeeper``
(its heartbeat thread), chunk and embed each with the fake embedder (taking EMBED_SECONDS per version, as a real model would take
some: the time the heartbeats must bridge), check each lease, and publish them
with ``IndexSink.publish_many`` (the fenced publish transaction, a batch per transaction). One line per event:

``DONE <task> <attempt> <claim-to-publish seconds> <superseded 0|1>``
    the version was published and its task SUCCEEDED, in that transaction.
``LOST <task> <attempt> <code>``
    the lease was lost (the keeper's deadline or the fence said so): nothing of it was written.
``FAIL <task> <attempt> <code>``
    the publish failed and the task went to RETRY_WAIT (``TaskQueue.fail``).
``ABANDONED <task> <attempt> <code>``
    the publish failed and so did recording it: the lease will expire and be taken over.
``CLAIMERR <code>``
    a claim failed (the database was unreachable); tried again.

With ``freeze`` the worker stops itself (SIGSTOP) right after its first claim, its heartbeat thread too,
as a host that froze: whoever runs it sends SIGCONT later. Every lease it held then must be taken over,
and reported ``LOST`` by it when it wakes.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from pipelines.domain.errors import FenceRejected, KbindexError
from resources.database import Database
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder, checked_embed
from resources.index_sink import IndexSink, PublishItem, PublishOutcome
from resources.lease_keeper import LeaseKeeper
from resources.task_queue import TaskQueue
from tests.network.client import chunks_of


def say(*words: object) -> None:
    print(*words, flush=True)


def stopped() -> bool:
    return bool(select.select([sys.stdin], [], [], 0)[0])


def main(url: str, owner: str, lease_seconds: float, batch: int, embed_seconds: float, freeze: bool) -> None:
    db = Database(url, min_size=1, max_size=3, timeout=10.0, role="run")
    queue = TaskQueue(db, lease_seconds=lease_seconds, backoff_base=0.25, backoff_cap=1.0)
    sink = IndexSink(db, queue)
    keeper = LeaseKeeper(queue)
    keeper.start()
    embedder = FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    while not stopped():
        try:
            claimed = queue.claim(owner, limit=batch)
        except KbindexError as exc:
            say("CLAIMERR", exc.code)
            time.sleep(0.5)
            continue
        if not claimed:
            time.sleep(0.3)
            continue
        started = time.monotonic()
        for task in claimed:
            keeper.hold(str(task.lease.task_id), task.lease)
        if freeze:
            freeze = False
            say("FROZEN", *(task.lease.task_id for task in claimed))
            os.kill(os.getpid(), signal.SIGSTOP)
        items, tasks = [], []
        for task in claimed:
            key = str(task.lease.task_id)
            chunks = chunks_of(task)
            vectors = checked_embed(embedder, [c.text for c in chunks], expected_model=DEFAULT_MODEL_NAME,
                                    expected_dim=384, batch_size=8)
            time.sleep(embed_seconds)
            try:
                lease = keeper.check(key)
            except FenceRejected as exc:
                say("LOST", task.lease.task_id, task.lease.attempt, exc.code)
                keeper.release(key)
                continue
            items.append(PublishItem(lease, chunks, vectors, work=task))
            tasks.append(task)
        for task, item, result in zip(tasks, items, sink.publish_many(items), strict=True):
            lease = item.lease
            keeper.release(str(lease.task_id))
            if isinstance(result, PublishOutcome):
                say("DONE", lease.task_id, lease.attempt, round(time.monotonic() - started, 3),
                    int(result.superseded))
            elif isinstance(result, FenceRejected):
                say("LOST", lease.task_id, lease.attempt, result.code)
            else:
                code = getattr(result, "code", "INTERNAL_ERROR")
                try:
                    queue.fail(lease, code, str(result))
                    say("FAIL", lease.task_id, lease.attempt, code)
                except KbindexError:
                    say("ABANDONED", lease.task_id, lease.attempt, code)
    keeper.stop()
    db.close()


if __name__ == "__main__":
    url, owner, lease_s, batch, embed_s, *flags = sys.argv[1:]
    main(url, owner, float(lease_s), int(batch), float(embed_s), "freeze" in flags)
