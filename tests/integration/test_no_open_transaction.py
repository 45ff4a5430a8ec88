"""Invariant 1, second half: no transaction stays open while a run parses, chunks or embeds.

A run's slow steps (fetching and parsing bytes, the embedding model) hold no database transaction:
every write before the publish is a short autocommit statement, so a slow or stuck model never
pins row locks, blocks vacuum or holds back a batch-mate's publish. A watcher thread polls
``pg_stat_activity`` of the test database every 50 ms while an ``IndexingRun`` works through slow
steps (a blob store that takes a second per read, an embedder that takes a second per batch) and
records any client connection that has sat ``idle in transaction`` for half a second or whose
transaction started more than a second ago. The publish step is the one place a transaction is expected (the fenced publish).

The last test holds a transaction across the embed step on purpose and checks the watcher sees it,
so the assertion can fail.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import psycopg
import pytest

from resources.blob_store import BlobStore
from resources.embedder import FakeEmbedder
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.publisher import Publisher
from resources.run_state import RunState
from resources.task_queue import TaskQueue

READ_SECONDS = 1.0  # per blob read: the parse step takes at least this long per version
BATCH_SECONDS = 1.0  # per embedding batch
OLD_TRANSACTION_SECONDS = 1.0
IDLE_IN_TRANSACTION_SECONDS = 0.5  # a new pooled connection's type lookup idles in its transaction for ms
SLOW_STEPS = ("parse", "chunk", "embed")

BODY = "\n\n".join(
    f"Clause {i}. Invoices of supplier class {i} are paid within {i % 9 + 10} days after the goods arrive."
    for i in range(60)
)


class SlowBlobs(BlobStore):
    """Object storage far away: each read takes READ_SECONDS."""

    def get(self, digest: str) -> bytes:
        time.sleep(READ_SECONDS)
        return super().get(digest)


class SlowEmbedder(FakeEmbedder):
    """A model that takes BATCH_SECONDS per batch."""

    def respond(self, texts: list[str]):
        time.sleep(BATCH_SECONDS)
        return super().respond(texts)


class TransactionWatcher:
    """Polls pg_stat_activity of one database from its own connection and records open transactions,
    tagged with the run's step at the time (``phase``)."""

    QUERY = """
        SELECT pid, state, round(extract(epoch FROM clock_timestamp() - xact_start)::numeric, 2)::float AS age,
               left(query, 120) AS query
        FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
          AND ((state LIKE 'idle in transaction%%' AND state_change < clock_timestamp() - make_interval(secs => %s))
               OR xact_start < clock_timestamp() - make_interval(secs => %s))
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.phase = "setup"
        self.samples: dict[str, int] = {}
        self.seen: list[tuple[str, int, str, float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="pg-activity-watcher", daemon=True)

    def _poll(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                phase = self.phase
                rows = conn.execute(self.QUERY, [IDLE_IN_TRANSACTION_SECONDS, OLD_TRANSACTION_SECONDS]).fetchall()
                self.samples[phase] = self.samples.get(phase, 0) + 1
                self.seen.extend((phase, *row) for row in rows)
                time.sleep(0.05)

    def open_in(self, phases: tuple[str, ...]) -> list[tuple]:
        return [s for s in self.seen if s[0] in phases]

    @contextmanager
    def watching(self):
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(10)


@pytest.fixture
def run_of(db, db_url, tmp_path):
    """Factory: ``n`` published versions under the active profile (fake model), claimed like the sensor
    claims them, and an IndexingRun over them with its heartbeat thread running."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    blobs = SlowBlobs(str(tmp_path / "blobs"))
    queue = TaskQueue(db, lease_seconds=30)
    keepers: list[LeaseKeeper] = []

    def make(n: int) -> tuple[IndexingRun, list[str]]:
        publisher = Publisher(db, blobs)
        ids = [publisher.publish("acme", f"terms-{i}.txt", f"{BODY}\n\nEdition {i}.".encode(), f"terms-{i}.txt").task_id
               for i in range(n)]
        claimed = queue.claim("batch-slow", limit=n)
        assert sorted(c.lease.task_id for c in claimed) == sorted(ids)
        keeper = LeaseKeeper(queue, interval=0.5)  # heartbeats all through the slow steps
        keeper.start()
        keepers.append(keeper)
        run = IndexingRun(db=db, queue=queue, keeper=keeper, owner="batch-slow", blobs=blobs,
                          embedder_for=lambda model: SlowEmbedder(model_name=model), state=RunState(),
                          tagged=[(c.lease.task_id, c.lease.attempt) for c in claimed], batch_size=4)
        keys = [r["partition_key"] for r in db.fetch_all("document_version_partition_keys", {"task_ids": ids})]
        return run, keys

    yield make
    for keeper in keepers:
        keeper.stop()


def _run_steps(run: IndexingRun, keys: list[str], watcher: TransactionWatcher, *, hold_during_embed=None) -> None:
    for name, step in (("parse", run.parse), ("chunk", run.chunk), ("embed", run.embed), ("publish", run.publish)):
        watcher.phase = name
        if name == "embed" and hold_during_embed is not None:
            with hold_during_embed():
                results = step(keys)
        else:
            results = step(keys)
        outcomes = {r.outcome for rs in results.values() for r in rs}
        assert outcomes == {"ok"}, results
    watcher.phase = "done"


@pytest.mark.parametrize("versions", [1, 3], ids=["one-version-own-embed", "three-versions-shared-pass"])
def test_no_transaction_is_open_while_a_run_parses_chunks_or_embeds(db, db_url, run_of, versions):
    run, keys = run_of(versions)
    with TransactionWatcher(db_url).watching() as watcher:
        _run_steps(run, keys, watcher)
    # The watcher really watched the slow steps (a vacuous pass would sample nothing).
    assert watcher.samples.get("parse", 0) >= 10 and watcher.samples.get("embed", 0) >= 10, watcher.samples
    assert watcher.open_in(SLOW_STEPS) == [], watcher.open_in(SLOW_STEPS)
    statuses = {r[0] for r in psycopg.connect(db_url).execute("SELECT status FROM index_task").fetchall()}
    assert statuses == {"SUCCEEDED"}


def test_the_watcher_sees_a_transaction_held_across_the_embed_step(db, db_url, run_of):
    """The failure the test above guards against: a transaction opened around the model call."""
    run, keys = run_of(1)

    @contextmanager
    def held():
        with db.transaction() as tx:
            tx.fetch_one("index_profile_active")
            yield

    with TransactionWatcher(db_url).watching() as watcher:
        _run_steps(run, keys, watcher, hold_during_embed=held)
    caught = watcher.open_in(("embed",))
    assert caught, watcher.samples
    assert any(state.startswith("idle in transaction") for _, _, state, _, _ in caught)
    assert max(age for _, _, _, age, _ in caught) > OLD_TRANSACTION_SECONDS
