"""A kbindex worker on the client host (run by the tests inside namespace B): real TaskQueue, IndexSink and
LeaseKeeper code over TCP to PostgreSQL on the other host.

It talks to the test over stdout (one line per event) and stdin (one line per go-ahead):

``publish <url> <point> <lease_seconds>``
    claim one task as owner ``old``, chunk and embed it, and publish it. At ``point`` it prints ``AT`` and,
    for ``idle_in_tx`` (before the transaction's last statement) and ``commit`` (before COMMIT), waits for a
    line; for ``mid_statement`` it prints ``AT`` and goes straight into the statement that locks the task
    row (the test holds that lock). Prints ``ERR <code>`` or ``OK``, then waits for a line and publishes
    the same lease again (``LATE <code>`` or ``LATE OK``).
``ticks <url>``
    as the claiming sensor does, every 0.5 s: claim due work (limit 1) through one long-lived pool (role
    ``run``, min 1, max 4) and print ``TICK OK <claimed>`` or ``TICK ERR <code>``, forever.
``sensors <url>``
    the claiming sensors' ticks (pipelines/sensors.py ``claim_tick``, on a throwaway Dagster instance: only
    kbindex's statements cross the link), one after another as Dagster's sensor daemon evaluates them, a loop at
    most every 5 s; prints ``LOOP <n>`` as a loop starts and ``TICK <sensor> <seconds> <OK runs|SKIP|ERR code>``
    as each tick ends, forever.
``keeper <url> <lease_seconds> <join_seconds>``
    claim one task and keep its lease with a LeaseKeeper (interval 0.5 s); every 0.25 s prints
    ``STATE <failed_beats> <heartbeats> <lost code or ->``; on a line from stdin stops the keeper, waits up to
    ``join_seconds`` for its thread to end and prints ``STOPPED <seconds> <thread still alive>``.

Both use a pool wait (``Database(timeout=...)``) of 5 s, the tests' tenth of the default 30 s.
"""

from __future__ import annotations

import select
import sys
import threading
import time

from pipelines.domain.chunking import Chunk, VersionIdentity, chunk_id, content_digest
from pipelines.domain.errors import KbindexError
from resources.database import Database
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder, checked_embed
from resources.index_sink import IndexSink
from resources.lease_keeper import LeaseKeeper
from resources.task_queue import TaskQueue

PROFILE = "minilm-v1"


def say(*words: object) -> None:
    print(*words, flush=True)


def wait_line() -> None:
    sys.stdin.readline()


def chunks_of(task, n: int = 12) -> list[Chunk]:
    identity = VersionIdentity(task.tenant_id, task.document_id, task.version_number, task.profile)
    out = []
    for i in range(n):
        text = f"Refunds for order type {i} are paid within {i + 3} days."
        heading = ("Policy", f"Section {i}")
        digest = content_digest(text)
        out.append(Chunk(chunk_id(identity, i, heading, digest), i, heading, None, text, text, len(text.split()),
                         digest))
    return out


def publish(url: str, point: str, lease_seconds: float) -> None:
    db = Database(url, max_size=2, timeout=5.0, role="run")
    queue = TaskQueue(db, lease_seconds=lease_seconds)
    sink = IndexSink(db, queue)
    (task,) = queue.claim("old", limit=1)
    chunks = chunks_of(task)
    vectors = checked_embed(FakeEmbedder(model_name=DEFAULT_MODEL_NAME), [c.text for c in chunks],
                            expected_model=DEFAULT_MODEL_NAME, expected_dim=384, batch_size=8)
    say("CLAIMED", task.lease.task_id, task.lease.attempt)
    wait_line()
    original_lock, original_complete = queue.send_lock_fenced, queue.complete_published

    def send_lock_fenced(session, leases):
        if point == "mid_statement":
            say("AT")
        return original_lock(session, leases)

    def complete_published(session, leases, counts):
        if point == "idle_in_tx":
            say("AT")
            wait_line()
        original_complete(session, leases, counts)
        if point == "commit":
            say("AT")
            wait_line()

    queue.send_lock_fenced, queue.complete_published = send_lock_fenced, complete_published
    try:
        sink.publish(task.lease, chunks, vectors)
        say("OK")
    except KbindexError as exc:
        say("ERR", exc.code)
    queue.send_lock_fenced, queue.complete_published = original_lock, original_complete
    wait_line()
    try:
        sink.publish(task.lease, chunks, vectors)
        say("LATE OK")
    except KbindexError as exc:
        say("LATE", exc.code)
    db.close()


def sensors(url: str) -> None:
    import dagster as dg

    from pipelines.sensors import CLAIMING_SENSORS, claim_tick
    from resources.dagster_resources import DatabaseResource

    with dg.instance_for_test() as instance:
        loop = 0
        while True:
            loop += 1
            started_loop = time.monotonic()
            say("LOOP", loop)
            for sensor in CLAIMING_SENSORS:
                started = time.monotonic()
                try:
                    with dg.build_sensor_context(instance=instance,
                                                 resources={"database": DatabaseResource(url=url)}) as context:
                        result = claim_tick(context, sensor.name)
                    outcome = f"OK {len(result.run_requests or [])}" if isinstance(result, dg.SensorResult) else "SKIP"
                except KbindexError as exc:
                    outcome = f"ERR {exc.code}"
                except Exception as exc:  # noqa: BLE001 - the daemon logs a failed tick and goes on; so do we
                    outcome = f"ERR {type(exc).__name__}"
                say("TICK", sensor.name, f"{time.monotonic() - started:.2f}", outcome)
            time.sleep(max(0.0, started_loop + 5.0 - time.monotonic()))  # MIN_INTERVAL_LOOP_TIME


def keeper(url: str, lease_seconds: float, rest_join: str) -> None:
    db = Database(url, max_size=2, timeout=5.0, role="run")
    queue = TaskQueue(db, lease_seconds=lease_seconds)
    (task,) = queue.claim("old", limit=1)
    say("CLAIMED", task.lease.task_id, task.lease.attempt)
    k = LeaseKeeper(queue, interval=0.5)
    k.hold("v", task.lease)
    k.start()
    while not select.select([sys.stdin], [], [], 0.25)[0]:
        try:
            k.check("v")
            lost = "-"
        except KbindexError as exc:
            lost = exc.code
        say("STATE", k.failed_beats, k.heartbeats, lost)
    thread = k._thread
    started = time.monotonic()
    k.stop()
    if thread is not None:
        thread.join(timeout=float(rest_join))
    say("STOPPED", round(time.monotonic() - started, 2), bool(thread and thread.is_alive()))
    if not (thread and thread.is_alive()):
        db.close()


def ticks(url: str) -> None:
    db = Database(url, min_size=1, max_size=4, timeout=5.0, role="run")
    queue = TaskQueue(db)
    while True:
        try:
            say("TICK OK", len(queue.claim("sensor", limit=1)))
        except KbindexError as exc:
            say("TICK ERR", exc.code)
        time.sleep(0.5)


if __name__ == "__main__":
    threading.current_thread().name = "client"
    mode, url, *rest = sys.argv[1:]
    if mode == "publish":
        publish(url, rest[0], float(rest[1]))
    elif mode == "ticks":
        ticks(url)
    elif mode == "sensors":
        sensors(url)
    else:
        keeper(url, float(rest[0]), rest[1])
