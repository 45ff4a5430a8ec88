"""The embedding service's host cut off mid-batch (issue #32), on a real link that drops every packet.

Three hosts (bench/netns.py): PostgreSQL in A, the run host in B (embed_worker.py: the real
IndexingRun steps with the embedder a run gets for a ``tcp://`` service), the real embedding service in C
(``python -m resources.embedding_service`` listening on C's veth address; its workers serve the deterministic
fake model, each request held 1 s so that a batch is in flight when the link is cut). The link B <-> C is
silenced mid-batch (nftables DROP, no RST) while B <-> A keeps working: the run's client gives up within its
bound (keepalives + tcp_user_timeout, EmbedServiceBounds) with the retryable EMBEDDING_UNAVAILABLE, and its
fenced fail puts the task in RETRY_WAIT with nothing written. After healing, the same worker claims the task
again and it is published exactly once: the version's chunks once each, one SUCCEEDED transition, verify clean,
search finds it. The control runs the same cut with the client's network bounds off: the client is still
waiting when the bounded one has long given up (the 30 s read deadline would be next), so the test can fail.

The bounds are scaled down as in conftest.FAST_BOUNDS (silent link -> error in ~4 s); each test asserts a
generous ceiling (liveness, not speed).
"""

from __future__ import annotations

import queue as queues
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from resources.blob_store import BlobStore
from resources.database import Database
from resources.embedder import FakeEmbedder
from resources.publisher import Publisher
from resources.search import search
from resources.settings import EmbedServiceBounds
from resources.verifier import verify
from tests.network.conftest import FAST_BOUNDS
from bench.net_services import embed_address, requests_served, start_embed_service, stop
from bench.netns import Hosts
from tests.network.test_partition import Client, wait_for

WORKER = str(Path(__file__).with_name("embed_worker.py"))
SERVICE_PORT = 7311
ADDRESS = embed_address(SERVICE_PORT)
FAST_EMBED_BOUNDS = {
    "KBINDEX_EMBED_SERVICE_CONNECT_TIMEOUT_S": "2",
    "KBINDEX_EMBED_SERVICE_KEEPALIVES_IDLE_S": "1",
    "KBINDEX_EMBED_SERVICE_KEEPALIVES_INTERVAL_S": "1",
    "KBINDEX_EMBED_SERVICE_KEEPALIVES_COUNT": "2",
    "KBINDEX_EMBED_SERVICE_TCP_USER_TIMEOUT_MS": "3000",
    "KBINDEX_EMBED_SERVICE_TIMEOUT": "30",  # the per-batch read deadline: not what ends a silent link here
}
NO_EMBED_BOUNDS = {**FAST_EMBED_BOUNDS, "KBINDEX_EMBED_SERVICE_KEEPALIVES_IDLE_S": "0",
                   "KBINDEX_EMBED_SERVICE_TCP_USER_TIMEOUT_MS": "0"}
BOUND_S = EmbedServiceBounds.from_env(FAST_EMBED_BOUNDS).silent_bound_s()  # 4 s
CEILING_S = BOUND_S + 8.0
BATCH = 4
DELAY_S = 1.0
LEASE_S = 10.0
SECTIONS = 14


@pytest.fixture(scope="module")
def embed_service(hosts: Hosts) -> Iterator[Path]:
    """The real service in namespace C on TCP (and its Unix socket, which the test uses to watch it)."""
    home = Path(tempfile.mkdtemp(prefix="kbes-net-"))  # short: a Unix socket path is limited to ~100 bytes
    proc = start_embed_service(hosts, home, {"KBINDEX_EMBED_WORKERS": "1", "KBINDEX_FAKE_DELAY": str(DELAY_S),
                                             **FAST_EMBED_BOUNDS}, port=SERVICE_PORT)
    try:
        yield home
    finally:
        stop(proc)
        shutil.rmtree(home, ignore_errors=True)


def document() -> bytes:
    sections = [f"# Refund rule {i}\n\n" + " ".join(
        f"Refunds of order class {i} are paid within {i + 3} days of the request, step {j}." for j in range(20))
        for i in range(SECTIONS)]
    return "\n\n".join(sections).encode()


def rows(hosts: Hosts, net_db: str, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(hosts.local_url(net_db), autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.fixture
def published(hosts: Hosts, net_db: str, tmp_path: Path) -> int:
    """One version under the active profile, whose model is switched to the fake the service serves."""
    with psycopg.connect(hosts.local_url(net_db), autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    with Database(hosts.local_url(net_db), max_size=1) as db:
        return Publisher(db, BlobStore(str(tmp_path / "blobs"))).publish(
            "acme", "refunds.md", document(), "refunds.md").task_id


class Worker(Client):
    """embed_worker.py in namespace B, its stdout lines read into a queue (test_partition.Client's verbs)."""

    def __init__(self, hosts: Hosts, *args: str, env: dict[str, str]) -> None:
        self.proc = hosts.client(WORKER, *args, env=env)
        self.lines: queues.Queue[str] = queues.Queue()
        threading.Thread(target=self._read, daemon=True).start()


def start_worker(hosts: Hosts, net_db: str, home: Path, tmp_path: Path, bounds: dict[str, str]) -> Worker:
    """The run host's key is a copy of the service's key file (here the same file: one machine)."""
    return Worker(hosts, hosts.remote_url(net_db), ADDRESS, str(tmp_path / "blobs"), str(tmp_path / "artifacts"),
                  str(LEASE_S), str(BATCH),
                  env={**FAST_BOUNDS, **bounds, "KBINDEX_EMBED_SERVICE_KEY_FILE": str(home / "embedder.key")})


def cut_mid_batch(hosts: Hosts, home: Path, client: Worker) -> float:
    """Start a round, wait until its third batch is in the service's worker, cut B <-> C; the cut's time."""
    before = requests_served(home)
    client.send()
    client.expect("CLAIMED", 30)
    chunks = int(client.expect("EMBEDDING", 30).split()[1])
    assert chunks >= 3 * BATCH, chunks  # several batches, so the cut lands in the middle of the step
    assert wait_for(lambda: requests_served(home) >= before + 3, 30)
    hosts.cut_embed()
    return time.monotonic()


def test_the_embedding_host_cut_mid_batch_fails_the_step_retryably_within_the_bound_and_the_retry_publishes_once(
        hosts, net_db, embed_service, published, tmp_path):
    started = time.monotonic()
    client = start_worker(hosts, net_db, embed_service, tmp_path, FAST_EMBED_BOUNDS)
    try:
        cut_at = cut_mid_batch(hosts, embed_service, client)
        _, outcome, code, step_s, status = client.expect("EMBED ", CEILING_S).split()
        gave_up_after = time.monotonic() - cut_at
        print(f"embed host cut mid-batch: the run's client gave up {gave_up_after:.1f} s after the cut "
              f"(bound {BOUND_S:g} s, read deadline 30 s); the embed step took {step_s} s")
        assert (outcome, code, status) == ("failed", "EMBEDDING_UNAVAILABLE", "RETRY_WAIT")
        assert gave_up_after < CEILING_S
        ((task_status, attempts, error_code, chunks),) = rows(
            hosts, net_db, "SELECT status, attempts, error_code, (SELECT count(*) FROM chunk) FROM index_task "
                           "WHERE task_id = %s", (published,))
        assert (task_status, attempts, error_code, chunks) == ("RETRY_WAIT", 1, "EMBEDDING_UNAVAILABLE", 0)

        hosts.heal()  # the same worker, the same client object: it connects again and the retry goes through
        client.send()
        assert client.expect("CLAIMED", 30).split()[1:] == [str(published), "2"]
        expected = int(client.expect("EMBEDDING", 30).split()[1])
        assert client.expect("EMBED ", 60).split()[1:3] == ["ok", "-"]
        _, outcome, code, written = client.expect("PUBLISH", 30).split()
        assert (outcome, code, int(written)) == ("ok", "-", expected)
        print(f"after healing: published {expected} chunks on attempt 2; test wall {time.monotonic() - started:.1f} s")
    finally:
        hosts.heal()
        client.close()

    # Exactly once: each chunk of the version once, one SUCCEEDED transition, the pointer on it.
    ((status, attempts),) = rows(hosts, net_db, "SELECT status, attempts FROM index_task WHERE task_id = %s",
                                 (published,))
    assert (status, attempts) == ("SUCCEEDED", 2)
    ((total, distinct),) = rows(hosts, net_db, "SELECT count(*), count(DISTINCT chunk_id) FROM chunk")
    assert total == distinct == expected
    assert rows(hosts, net_db, "SELECT count(*) FROM task_event WHERE task_id = %s AND to_status = 'SUCCEEDED'",
                (published,)) == [(1,)]
    assert rows(hosts, net_db, "SELECT error_code FROM task_event WHERE task_id = %s AND to_status = 'RETRY_WAIT'",
                (published,)) == [("EMBEDDING_UNAVAILABLE",)]
    with Database(hosts.local_url(net_db), max_size=1) as db:
        report = verify(db)
        assert report.ok, report.violations
        hits = search(db, FakeEmbedder(model_name="fake-384"), "Refunds of order class 7", tenant_id="acme", k=3)
    assert hits and hits[0].document_id == "refunds.md"


def test_control_without_the_client_bounds_the_same_cut_leaves_the_client_waiting(
        hosts, net_db, embed_service, published, tmp_path):
    """What a run's client had before issue #32 (no keepalives, no tcp_user_timeout): no answer, no error, when
    the bounded client has long given up; only the per-batch read deadline (30 s here, 60 s by default) or the
    kernel (~15 min for unacknowledged data, ~2 h idle) would end it."""
    client = start_worker(hosts, net_db, embed_service, tmp_path, NO_EMBED_BOUNDS)
    try:
        cut_mid_batch(hosts, embed_service, client)
        with pytest.raises(TimeoutError):
            client.expect("EMBED ", CEILING_S)
        assert client.proc.poll() is None
    finally:
        hosts.heal()
        client.close()
