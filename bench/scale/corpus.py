"""Shared set-up of bench/scale/ui.py and bench/scale/migration.py: a large indexed corpus and a UI.

``seed_corpus`` bulk-loads N indexed versions with set-based SQL (sql/queries/bench_scale_corpus.sql):
document, document_version, a SUCCEEDED INDEX task and a search pointer each (``seed_chunks`` adds
a chunk each and the HNSW graph over them). Document i's
text is ``document_text(i)``; SQL computes the same bytes' SHA-256, and ``write_blobs`` stores them, so
a REINDEX run re-parses real bytes. ``DagsterUI`` starts ``dagster dev`` (webserver, daemon, code
server) on a Dagster instance stored in PostgreSQL, as ``kbindex dev`` and dagster.yaml set it up
(event batching included: pipelines/event_batching.py), and sends GraphQL to it as the UI does.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from psycopg import sql as pgsql

from bench.dagster_dev import PROJECT_ROOT, REPOSITORY, SENSOR_ID, STOP_SENSOR, DagsterDev

TENANT = "acme"
SEED_BATCH = 100_000


def document_text(i: int) -> bytes:
    """The bytes of seeded document ``corpus-i`` (the formula of ``bench_corpus_seed_versions``)."""
    return (f"Policy {i}: claims of class {i % 7} are reviewed by team {i % 13} within {i % 9 + 2} working days."
            f"\n\nRefunds above {i % 500} euros need a second approval, case {i}."
            f"\n\nTravel booked for case {i} is reimbursed in {i % 4 + 1} weeks.").encode()


def create_databases(admin_url: str, *names: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for name in names:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))


class ScaleRound(NamedTuple):
    db: Any  # resources.database.Database on kb_url
    kb_url: str
    dagster_url: str
    ui: DagsterUI


def open_round(admin_url: str, workdir: Path, name: str) -> ScaleRound:
    """Databases ``<name>_kb`` (migrated) and ``<name>_dg`` on the scratch server, the round's folders under
    ``workdir`` in this process's environment and dagster dev's, and a ``DagsterUI`` over them (not started)."""
    from resources.database import Database
    from resources.local_postgres import with_database
    from resources.migrations import migrate

    create_databases(admin_url, f"{name}_kb", f"{name}_dg")
    kb_url, dagster_url = with_database(admin_url, f"{name}_kb"), with_database(admin_url, f"{name}_dg")
    migrate(kb_url)
    env = {"KBINDEX_DATABASE_URL": kb_url, "KBINDEX_HOME": str(workdir / "home"),
           "KBINDEX_BLOB_URL": str(workdir / "blobs"), "KBINDEX_ARTIFACTS": str(workdir / "artifacts")}
    os.environ.update(env)
    return ScaleRound(Database(kb_url), kb_url, dagster_url, DagsterUI(workdir, dagster_url, env))


def seed_corpus(db: Any, count: int, *, first: int = 1, tenant: str = TENANT, progress: bool = False) -> float:
    """Documents corpus-FIRST.. with one indexed version each; returns the seconds it took."""
    started = time.perf_counter()
    for start in range(first, first + count, SEED_BATCH):
        params = {"tenant": tenant, "first": start, "count": min(SEED_BATCH, first + count - start)}
        with db.transaction() as tx:
            for name in ("bench_corpus_seed_documents", "bench_corpus_seed_versions", "bench_corpus_seed_tasks",
                         "bench_corpus_seed_pointers"):
                tx.execute(name, params)
        if progress:
            print(f"  seeded {start + params['count'] - first:,}/{count:,} versions "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    db.execute("bench_corpus_analyze")
    return time.perf_counter() - started


def seed_chunks(url: str, count: int, *, first: int = 1, tenant: str = TENANT) -> float:
    """One chunk with a random vector for each seeded version (``seed_corpus`` first), and the product's
    HNSW graph built once over them, as after a real index; returns the seconds it took.

    The graph then has the size of an indexed 100k corpus (its pages, its share of the cache) when both
    phases of bench.scale.migration insert into it. Random vectors share no neighbourhood with the fake
    models' vectors, so each phase's inserts still start a neighbourhood of their own and grow dearer as
    it fills; the migration bench compares the same number of versions for that reason.
    """
    from sql import queries

    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:  # VACUUM and CHECKPOINT run outside a transaction
        conn.execute(queries["bench_scale_drop_hnsw"])
        for start in range(first, first + count, SEED_BATCH):
            conn.execute(queries["bench_corpus_seed_chunks"],
                         {"tenant": tenant, "first": start, "count": min(SEED_BATCH, first + count - start)})
        rebuild_graph(conn)
    return time.perf_counter() - started


SETTLE = ("bench_scale_analyze", "bench_scale_checkpoint")


def rebuild_graph(conn: Any) -> None:
    """On an autocommit connection whose HNSW graph was dropped: build the product's graph in memory, then
    vacuum, analyze and checkpoint, so the phase measured next starts from settled tables."""
    from sql import queries

    for name in ("bench_scale_build_memory", "bench_scale_build_hnsw", *SETTLE):
        conn.execute(queries[name])


def settle(url: str) -> float:
    """Vacuum, analyze and checkpoint the database (outside any timed phase); returns the seconds."""
    from sql import queries

    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for name in SETTLE:
            conn.execute(queries[name])
    return time.perf_counter() - started


def reflect_vectors(url: str, profile: str) -> float:
    """Store ``profile``'s vectors reflected (``bench_migration_reflect_vectors`` says why) with the graph dropped,
    then rebuild it as the product's and settle the tables; returns the seconds."""
    from sql import queries

    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(queries["bench_scale_drop_hnsw"])
        conn.execute(queries["bench_migration_reflect_vectors"], {"profile": profile})
        rebuild_graph(conn)
    return time.perf_counter() - started


def corpus_keys(db: Any, first: int, count: int, tenant: str = TENANT) -> list[str]:
    rows = db.fetch_all("bench_corpus_keys", {"tenant": tenant, "first": first, "count": count})
    return [r["partition_key"] for r in rows]


def write_blobs(blob_url: str, first: int, count: int) -> float:
    """Store ``document_text(i)`` for the seeded documents in a local blob folder; returns the seconds.

    The store's own ``put`` fsyncs every blob (~7 ms here: 100k blobs would take 12 minutes); a bench
    corpus needs no durability, so the bytes go straight to the store's path for their hash.
    """
    from resources.blob_store import BlobStore, content_hash

    started = time.perf_counter()
    store = BlobStore(blob_url)
    made: set[str] = set()
    for i in range(first, first + count):
        data = document_text(i)
        path = store._path(content_hash(data))
        folder = os.path.dirname(path)
        if folder not in made:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            made.add(folder)
        with open(path, "wb") as fh:
            fh.write(data)
    return time.perf_counter() - started


class DagsterUI:
    """``dagster dev`` on a PostgreSQL-backed instance, GraphQL to its webserver, and a reader instance."""

    def __init__(self, root: Path, dagster_url: str, env: dict[str, str]) -> None:
        from pipelines.cli.dev_command import psycopg2_url

        self.root = root
        home, reader = root / "dagster_home", root / "reader_home"
        for folder in (home, reader):
            folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
        pg_url = psycopg2_url(dagster_url)
        (reader / "dagster.yaml").write_text(json.dumps({"storage": {"postgres": {"postgres_url": pg_url}},
                                                         "telemetry": {"enabled": False}}))
        # An embedding service inherited from the caller's shell is not this round's; one in ``env`` is.
        inherited = {k: v for k, v in os.environ.items() if k != "KBINDEX_EMBED_SERVICE"}
        full_env = {**inherited, "DAGSTER_HOME": str(home), "DAGSTER_PG_URL": pg_url,
                    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env}
        self.dev = DagsterDev(root, full_env)
        self.reader_home, self.home, self.pg_url = reader, home, pg_url
        self.instance: Any = None
        self.product: Any = None
        self._repository: dict[str, str] = {}

    def open_instance(self) -> Any:
        """The same Dagster storage, read and written from this process (creates its tables on first use)."""
        import dagster as dg

        if self.instance is None:
            self.instance = dg.DagsterInstance.from_config(str(self.reader_home))
        return self.instance

    def product_instance(self) -> Any:
        """The same Dagster storage through the project's dagster.yaml, as a run sees it (KbindexDagsterStorage:
        pooled connections, schema checks remembered). ``open_instance``'s is plain dagster_postgres storage,
        a new connection per call: what a bench writes through it is not what a run pays."""
        import dagster as dg

        if self.product is None:
            os.environ["DAGSTER_PG_URL"] = self.pg_url
            self.product = dg.DagsterInstance.from_config(str(self.home))
        return self.product

    def start(self) -> float:
        self.dev.start()
        return self.dev.wait_ready()

    def stop(self) -> None:
        for name in ("instance", "product"):
            if getattr(self, name) is not None:
                getattr(self, name).dispose()
                setattr(self, name, None)
        self.dev.stop()

    def post(self, query: str, variables: dict | None = None, timeout: float = 300) -> tuple[dict, int, float]:
        """One GraphQL request: (data, response bytes, seconds). Raises on GraphQL errors."""
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.dev.port}/graphql", data=body,
                                         headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
        seconds = time.perf_counter() - started
        out = json.loads(raw)
        if out.get("errors"):
            raise RuntimeError(f"GraphQL errors: {out['errors']}")
        return out["data"], len(raw), seconds

    def repository_selector(self) -> dict[str, str]:
        if not self._repository:
            (node,) = self.post(REPOSITORY)[0]["repositoriesOrError"]["nodes"]
            self._repository = {"repositoryLocationName": node["location"]["name"], "repositoryName": node["name"]}
        return self._repository

    def stop_sensor(self, name: str) -> str:
        """Stop one sensor through the UI's own mutation, as an operator would; returns its status after."""
        selector = {**self.repository_selector(), "sensorName": name}
        sensor = self.post(SENSOR_ID, {"selector": selector})[0]["sensorOrError"]
        stopped = self.post(STOP_SENSOR, {"id": sensor["id"]})[0]["stopSensor"]
        return stopped["instigationState"]["status"]
