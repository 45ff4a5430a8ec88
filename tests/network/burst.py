"""A burst of versions indexed by several workers over a slow, lossy link (issue #32), and what it left.

``run_burst`` publishes ``versions`` versions (``documents`` documents, several versions each, so some are
superseded), puts the relay (bench/relay.py: added delay) in front of PostgreSQL and drops a share of the link's
packets, and starts ``workers`` worker processes in namespace B (burst_worker.py: the real claim, heartbeat
and fenced publish code; ``embed_s`` per version stands for the embedding's time). Optionally the first worker freezes right after its first claim for longer than a
lease, so at least one takeover must happen. When every task has ended (or ``timeout`` has passed) it stops
them and reads the result through the Unix socket, which never crosses the link:

* every task's status, and how many SUCCEEDED transitions each has (more than one would be a double publish);
* the takeovers, from task_event (a RUNNING -> RUNNING transition: a claim took over an expired lease),
  against the leases the workers said they lost (``LOST``) or gave up (``ABANDONED``): a takeover nobody
  reported is a silent one;
* the chunk rows per version and per pointer, and ``kbindex verify``'s checks (resources/verifier.py);
* claim -> publish seconds of each published version, wall time, packets dropped.

Used by tests/network/test_slow_link.py (a small burst) and ``python -m bench.hosts`` (the issue's 200).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from resources.blob_store import BlobStore
from resources.database import Database
from resources.publisher import Publisher
from resources.verifier import verify
from bench.netns import Hosts
from bench.relay import relay_url, start_relay

WORKER = str(Path(__file__).with_name("burst_worker.py"))
CHUNKS_PER_VERSION = 12  # tests/network/client.chunks_of


@dataclass
class BurstReport:
    tasks: int
    done_s: float
    """Until every task had ended (set by run_burst; until the end of the wait before that)."""
    statuses: Counter
    succeeded_events: dict[int, int]
    """Task id -> its SUCCEEDED transitions (exactly 1 each when nothing was published twice)."""
    done_lines: Counter
    """Task id -> the workers' DONE lines for it (exactly 1 each)."""
    takeovers: set[tuple[int, int]]
    """(task, attempt taken over) from task_event."""
    reported: set[tuple[int, int]]
    """(task, attempt) a worker said it lost or abandoned."""
    failed: int
    """FAIL lines: publishes that failed and were retried (RETRY_WAIT)."""
    claim_errors: int
    chunk_rows: dict[tuple[str, int], int]
    """(document, version) -> chunk rows."""
    pointers: dict[str, tuple[int, int]]
    """document -> (pointed version, its chunk rows)."""
    newest: dict[str, int]
    verify_ok: bool
    violations: list[str]
    latencies: list[float] = field(default_factory=list)
    dropped: int = 0
    frozen: list[int] = field(default_factory=list)
    """Tasks the frozen worker held when it froze."""
    errors: list[str] = field(default_factory=list)
    """The last lines each worker wrote to stderr."""

    @property
    def silent_takeovers(self) -> set[tuple[int, int]]:
        return self.takeovers - self.reported

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    def lines(self) -> list[str]:
        return [
            f"versions {self.tasks}: {dict(self.statuses)} in {self.done_s:.1f} s",
            f"takeovers {len(self.takeovers)} (of the frozen worker's leases {len(self.frozen)}; reported "
            f"{len(self.takeovers & self.reported)}, silent "
            f"{len(self.silent_takeovers)}), publishes failed and retried {self.failed}, claim errors "
            f"{self.claim_errors}, packets dropped {self.dropped}",
            f"claim -> publish p50 {self.percentile(0.5):.2f} s, p95 {self.percentile(0.95):.2f} s, "
            f"max {max(self.latencies, default=float('nan')):.2f} s",
            f"double publishes {sum(1 for n in self.succeeded_events.values() if n > 1)}, verify "
            f"{'ok' if self.verify_ok else 'FAILED: ' + ', '.join(self.violations)}",
        ]


class _Worker:
    def __init__(self, hosts: Hosts, url: str, owner: str, lease_s: float, batch: int, embed_s: float,
                 freeze: bool, env: dict[str, str]) -> None:
        args = [url, owner, str(lease_s), str(batch), str(embed_s)] + (["freeze"] if freeze else [])
        self.proc = hosts.client(WORKER, *args, env=env)
        self.lines: list[str] = []
        self.errors: list[str] = []
        self.frozen = threading.Event()
        self.readers = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._read_errors, daemon=True)]  # a full pipe would block it
        for reader in self.readers:
            reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            if line.startswith("FROZEN"):
                self.frozen.set()

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors.append(line.rstrip())

    def stop(self) -> str:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a worker that does not stop is killed
            self.proc.kill()
            self.proc.wait(timeout=30)
        for reader in self.readers:
            reader.join(timeout=5)
        return "\n".join(self.errors[-20:])


def publish_versions(url: str, blobs: Path, versions: int, documents: int) -> list[int]:
    """``versions`` versions over ``documents`` documents of tenant acme, round robin; their task ids."""
    with Database(url, max_size=1) as db:
        publisher = Publisher(db, BlobStore(str(blobs)))
        return [publisher.publish("acme", f"doc-{i % documents}", f"version {i}".encode(), "p.txt").task_id
                for i in range(versions)]


def run_burst(hosts: Hosts, database: str, blobs: Path, *, versions: int, documents: int, workers: int,
              delay_ms: float, loss_percent: int, lease_s: float, batch: int = 2, embed_s: float = 0.0,
              freeze: bool = True,
              timeout: float = 120.0, env: dict[str, str] | None = None) -> BurstReport:
    local = hosts.local_url(database)
    task_ids = publish_versions(local, blobs, versions, documents)
    relay = start_relay(hosts, delay_ms)
    started = time.monotonic()
    done: float | None = None
    running: list[_Worker] = []
    try:
        if loss_percent:
            hosts.lose(loss_percent)
        url = relay_url(database)
        running = [_Worker(hosts, url, f"w{i}", lease_s, batch, embed_s, freeze and i == 0, env or {})
                   for i in range(workers)]
        if freeze:
            def thaw() -> None:  # frozen past its lease (and the keeper's beats), then it wakes up
                if running[0].frozen.wait(timeout):
                    time.sleep(lease_s + 3)
                    os.kill(running[0].proc.pid, signal.SIGCONT)
            threading.Thread(target=thaw, daemon=True).start()
        with psycopg.connect(local, autocommit=True) as conn:
            while time.monotonic() - started < timeout:
                left = conn.execute("SELECT count(*) FROM index_task WHERE status NOT IN ('SUCCEEDED', 'DEAD', 'CANCELLED')"
                                    ).fetchone()[0]
                woke = not running[0].frozen.is_set() or any(line.startswith("LOST") for line in running[0].lines)
                if left == 0 and done is None:
                    done = time.monotonic() - started
                if left == 0 and woke:  # and a frozen worker has woken and said what it lost
                    break
                time.sleep(0.5)
        wall = time.monotonic() - started
        dropped = hosts.dropped_packets() if loss_percent else 0
    finally:
        for w in running:
            if w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGCONT)
        errors = [w.stop() for w in running]
        relay.kill()
        hosts.stop_losing()
    report = _read_result(local, task_ids, [line for w in running for line in w.lines], wall, dropped)
    report.done_s = wall if done is None else done
    if freeze and running:
        report.frozen = [int(t) for line in running[0].lines if line.startswith("FROZEN")
                         for t in line.split()[1:]]
    report.errors = errors
    return report


def _read_result(local: str, task_ids: list[int], lines: list[str], wall: float, dropped: int) -> BurstReport:
    done: Counter = Counter()
    reported: set[tuple[int, int]] = set()
    latencies, failed, claim_errors = [], 0, 0
    for line in lines:
        kind, *rest = line.split()
        if kind == "DONE":
            done[int(rest[0])] += 1
            latencies.append(float(rest[2]))
        elif kind in ("LOST", "ABANDONED"):
            reported.add((int(rest[0]), int(rest[1])))
        elif kind == "FAIL":
            failed += 1
        elif kind == "CLAIMERR":
            claim_errors += 1
    with psycopg.connect(local, autocommit=True) as conn:
        statuses = Counter(dict(conn.execute("SELECT status, count(*) FROM index_task GROUP BY status").fetchall()))
        succeeded = dict(conn.execute(
            "SELECT t.task_id, count(e.event_id) FROM index_task t LEFT JOIN task_event e ON e.task_id = t.task_id "
            "AND e.kind = 'transition' AND e.to_status = 'SUCCEEDED' GROUP BY t.task_id").fetchall())
        takeovers = {(t, a - 1) for t, a in conn.execute(
            "SELECT task_id, attempt FROM task_event WHERE kind = 'transition' AND from_status = 'RUNNING' "
            "AND to_status = 'RUNNING'").fetchall()}
        chunk_rows = {(d, v): n for d, v, n in conn.execute(
            "SELECT document_id, version_number, count(*) FROM chunk GROUP BY 1, 2").fetchall()}
        pointers = {d: (v, n) for d, v, n in conn.execute(
            "SELECT p.document_id, p.version_number, (SELECT count(*) FROM chunk c WHERE c.tenant_id = "
            "p.tenant_id AND c.document_id = p.document_id AND c.version_number = p.version_number) "
            "FROM search_pointer p").fetchall()}
        newest = dict(conn.execute("SELECT document_id, max(version_number) FROM document_version GROUP BY 1"
                                   ).fetchall())
    with Database(local, max_size=1) as db:
        result = verify(db)
    return BurstReport(
        tasks=len(task_ids), done_s=wall, statuses=statuses, succeeded_events=succeeded, done_lines=done,
        takeovers=takeovers, reported=reported, failed=failed, claim_errors=claim_errors, chunk_rows=chunk_rows,
        pointers=pointers, newest=newest, verify_ok=result.ok, violations=[v.check for v in result.violations],
        latencies=latencies, dropped=dropped)


def summary(report: BurstReport) -> dict[str, Any]:
    return {
        "versions": report.tasks, "wall_s": round(report.done_s, 1), "statuses": dict(report.statuses),
        "takeovers": len(report.takeovers), "silent_takeovers": len(report.silent_takeovers),
        "failed_and_retried": report.failed, "claim_errors": report.claim_errors,
        "p50_claim_to_publish_s": round(report.percentile(0.5), 2),
        "p95_claim_to_publish_s": round(report.percentile(0.95), 2),
        "double_publishes": sum(1 for n in report.succeeded_events.values() if n > 1),
        "verify_ok": report.verify_ok, "violations": report.violations, "packets_dropped": report.dropped,
    }
