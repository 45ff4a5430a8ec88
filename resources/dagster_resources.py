"""The Dagster face of resources/: ``ConfigurableResource`` wrappers around the plain clients.

Clients and pools are built in ``setup_for_execution`` into private attributes, so a run (in-process
executor) builds each once and tears it down after its last step. ``IndexingRunResource`` holds the
run's ``IndexingRun``: the leases it adopted (run tags) or claimed (UI backfills, ``dagster asset
materialize``), heartbeated on one thread for the whole run, and the per-task run state.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import threading
from collections.abc import Mapping
from typing import Annotated, Any

import dagster as dg
from pydantic import PrivateAttr

from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.database import Database
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.run_state import RunState
from resources.settings import Settings, resolve_database_url
from resources.task_queue import TaskQueue

# Run tags written by the claiming sensor and read by the run. The leases and the claiming tick are machinery,
# not something an operator reads: under Dagster's hidden-tag prefix they stay out of the UI's runs list (its
# GraphQL leaves ".dagster/" tags out) and are still copied to re-executions. Runs created before carry them
# under the old visible keys (LEGACY_*), which are still read.
LEASES_TAG = ".dagster/kbindex/leases"  # the run's leases, encode_leases(); long sets go on in .2, .3, ...
OWNER_TAG = ".dagster/kbindex/owner"
WINDOW_TAG = ".dagster/kbindex/claim_window"
"""How the claiming tick came to claim (pipelines/claim_window.py): "opened" (the loop's first claiming tick, or
one that opened a new window) or "handed" (a later claiming sensor of the same loop, in the rest of the window a
claim handed on)."""
LEGACY_LEASES_TAG = "kbindex/leases"
LEGACY_OWNER_TAG = "kbindex/owner"
TENANT_TAG = "kbindex/tenant"
PROFILE_TAG = "kbindex/profile"
MODELS_TAG = "kbindex/models"  # comma-separated models of the run's tasks: loaded from the run's start
TAG_VALUE_MAX = 2000
"""Longest run tag value kbindex writes. Dagster indexes run tags as (key, value) in a PostgreSQL B-tree,
whose entries stop at ~2.7 KB after compression: a longer value fails the run's creation
(ProgramLimitExceeded). A JSON list of 1,000 leases was 9-12 KB, and so was a run key naming them all;
320 seven-digit leases (~3.8 KB) passed only because digits compress."""
RUN_KEY_PAIRS_MAX = 200
"""A run key lists its ``task_id:attempt`` pairs in full up to this many characters (DESIGN: run_key =
task_id:attempt), else names the set by its ends, size and digest (same set, same key)."""


def run_owner(run_id: str) -> str:
    """The lease owner of a Dagster run once it has adopted its leases (or claimed them itself)."""
    return f"run-{run_id}"


def encode_leases(pairs: list[tuple[int, int]]) -> str:
    """``b36:`` then, by ascending task id, each id's distance from the previous one in base 36 and, when
    not 1, ``.attempt``: a burst of consecutive ids costs two characters a lease."""
    items, prev = [], 0
    for task_id, attempt in sorted((int(t), int(a)) for t, a in pairs):
        items.append(_b36(task_id - prev) + ("" if attempt == 1 else "." + _b36(attempt)))
        prev = task_id
    return "b36:" + ",".join(items)


def decode_leases(value: str | None) -> list[tuple[int, int]]:
    """The (task_id, attempt) pairs of ``encode_leases`` (or of the JSON list older runs carry)."""
    if not value:
        return []
    if value.startswith("["):
        return [(int(t), int(a)) for t, a in json.loads(value)]
    if not value.startswith("b36:"):
        raise ValueError("not a kbindex lease tag")
    out, prev = [], 0
    for item in value[4:].split(","):
        delta, _, attempt = item.partition(".")
        prev += int(delta, 36)
        out.append((prev, int(attempt, 36) if attempt else 1))
    return out


def lease_tags(pairs: list[tuple[int, int]]) -> dict[str, str]:
    """The run tags that carry ``pairs``: ``kbindex/leases``, then ``.2``, ``.3``... each <= TAG_VALUE_MAX."""
    text = encode_leases(pairs)
    parts = [text[i:i + TAG_VALUE_MAX] for i in range(0, len(text), TAG_VALUE_MAX)]
    return {LEASES_TAG if n == 1 else f"{LEASES_TAG}.{n}": part for n, part in enumerate(parts, start=1)}


def leases_of(tags: Mapping[str, str] | None) -> list[tuple[int, int]]:
    """The leases a run's tags carry (``lease_tags``), [] for a run without any."""
    tags = tags or {}
    key = LEASES_TAG if tags.get(LEASES_TAG) else LEGACY_LEASES_TAG
    first = tags.get(key)
    if not first:
        return []
    parts, n = [first], 2
    while f"{key}.{n}" in tags:
        parts.append(tags[f"{key}.{n}"])
        n += 1
    return decode_leases("".join(parts))


def claim_owner_of(tags: Mapping[str, str] | None) -> str | None:
    """The claiming tick that reserved a run's leases (its ``OWNER_TAG``), None for a run without leases."""
    tags = tags or {}
    return tags.get(OWNER_TAG) or tags.get(LEGACY_OWNER_TAG)


def run_key_of(pairs: list[tuple[int, int]]) -> str:
    """The sensor's run key for a lease set: ``task_id:attempt,...`` when short, else a bounded name of the set."""
    items = sorted((int(t), int(a)) for t, a in pairs)
    full = ",".join(f"{t}:{a}" for t, a in items)
    if len(full) <= RUN_KEY_PAIRS_MAX:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:24]
    return f"{items[0][0]}:{items[0][1]}..{items[-1][0]}:{items[-1][1]} ({len(items)} leases, sha256 {digest})"


def _b36(n: int) -> str:
    if n < 0:
        raise ValueError("lease pairs must be sorted by task id")
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


# Pinned fields (issue #31, finding 2). Dagster turns the values a resource is built with into config
# *defaults* that anyone at the launchpad may override: that let a UI user point a run at another
# database, blob store, artifact folder (pickles: code execution) or embedding service. A field annotated
# ``Pinned`` is a value the code location passes in (``default_resources()`` from the KBINDEX_* settings;
# tests by constructor) and is not in the config schema at all: a run config that names it is refused
# before the run starts (DagsterInvalidConfigError), and the launchpad does not offer it. ``Pinned`` is
# Dagster's own marker for a resource dependency (what ``dg.ResourceDependency[str]`` becomes), spelled out
# because this module's annotations are strings, which Dagster's metaclass does not rewrite.
Pinned = Annotated[str, "resource_dependency"]
PINNED_FIELDS = {"database": ("url",), "blobs": ("url",), "indexing_run": ("artifacts",), "embedder": ("service_home",)}


_TICK_DATABASES: dict[tuple[int, str, int], Database] = {}
_TICK_DATABASES_LOCK = threading.Lock()


def tick_database(url: str, pool_size: int) -> Database:
    """This process's pool for resources set up outside a run (sensor ticks), one per URL and size, kept.

    Dagster sets a sensor's resources up before each tick and tears them down after it: a pool per tick
    opened a new PostgreSQL connection (a server process, and over a slow link several round trips) on
    every tick of every sensor with the database resource, idle or not. Keyed by pid too, so a forked
    process never uses its parent's connections; closed when the process exits.
    """
    key = (os.getpid(), url, pool_size)
    with _TICK_DATABASES_LOCK:
        db = _TICK_DATABASES.get(key)
        if db is None:
            if not _TICK_DATABASES:
                atexit.register(_close_tick_databases)
            db = _TICK_DATABASES[key] = Database(url, min_size=1, max_size=pool_size, role="run")
        return db


def _close_tick_databases() -> None:
    with _TICK_DATABASES_LOCK:
        for (pid, _url, _size), db in list(_TICK_DATABASES.items()):
            if pid == os.getpid():
                db.close()
        _TICK_DATABASES.clear()


def kept_database_resource(url: str = "") -> DatabaseResource:
    """A DatabaseResource on ``url`` (default KBINDEX_DATABASE_URL, as the code location's) already holding this
    process's kept pool: for code that runs on every sensor tick without declaring the resource."""
    return DatabaseResource(url=url or os.environ.get("KBINDEX_DATABASE_URL", "")).on_kept_pool()


class DatabaseResource(dg.ConfigurableResource):
    """PostgreSQL for kbindex data (KBINDEX_DATABASE_URL, or the embedded server when empty).

    A run gets a pool of its own, closed at its end; a sensor tick (no run) the process's kept pool
    (:func:`tick_database`)."""

    url: Pinned = ""  # pinned: not run config (PINNED_FIELDS)
    pool_size: int = 4

    _db: Database | None = PrivateAttr(default=None)
    _kept: bool = PrivateAttr(default=False)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        url = self.url or resolve_database_url()
        self._kept = getattr(context, "dagster_run", None) is None
        if self._kept:
            self._db = tick_database(url, self.pool_size)
        else:
            self._db = Database(url, min_size=1, max_size=self.pool_size, role="run")

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._db is not None and not self._kept:
            self._db.close()

    def on_kept_pool(self) -> DatabaseResource:
        """This resource on the process's kept pool (:func:`tick_database`) without a set-up, returned."""
        self._db = tick_database(self.url or resolve_database_url(), self.pool_size)
        self._kept = True
        return self

    @property
    def db(self) -> Database:
        if self._db is None:  # used outside a run (e.g. a sensor built per evaluation)
            self._db = Database(self.url or resolve_database_url(), min_size=1, max_size=self.pool_size, role="run")
        return self._db


class BlobStoreResource(dg.ConfigurableResource):
    """Document bytes by content hash: a folder or any fsspec URL (KBINDEX_BLOB_URL)."""

    url: Pinned = ""  # pinned: not run config (PINNED_FIELDS)

    def get_store(self) -> BlobStore:
        return BlobStore(self.url or Settings.from_env().blob_url)


class EmbedderResource(dg.ConfigurableResource):
    """sentence-transformers models by profile: the warm embedding service's when one answers, else
    loaded once in this process.

    A run that finds the service (``service_home``) at setup embeds every batch there and never
    imports torch; it loads its own model only if the service fails mid-run (``ServiceOrLocal``), unless
    fallback is ``none`` (a ``tcp://`` service by default): then the embed step fails retryably
    (``served_embedder``).
    A profile whose model is ``fake-384`` gets the deterministic FakeEmbedder (tests and fault
    injection only; faults from KBINDEX_FAKE_FAULTS, e.g. ``timeout=0.1,wrong_dimension=0.05``), in the run,
    or in the service when that is on another host (``tcp://``).
    """

    batch_size: int = 64
    torch_threads: int = 0  # 0: run_torch_threads() (cores divided among the runs that embed at once)
    service_home: Pinned = ""
    """KBINDEX_EMBED_SERVICE: the folder of a running embedding service (``kbindex embed-service``), or
    ``tcp://HOST:PORT`` for one on another host; "" for none. Pinned: not run config (PINNED_FIELDS)."""
    service_max_versions: int = 0
    """0: every run embeds through the service; n: only runs of at most n leased versions (bigger ones,
    and backfills of unknown size, load their own model)."""

    _preloads: dict[str, threading.Thread] = PrivateAttr(default_factory=dict)
    _use_service: bool = PrivateAttr(default=False)
    _served: dict[str, Any] = PrivateAttr(default_factory=dict)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Runs use the warm embedding service if one answers; without it, a run starts loading the
        models the claiming sensor named (run tag) before the first step runs."""
        run = context.dagster_run
        tags = run.tags if run else {}
        self._use_service = self._service_fits(leases_of(tags))
        tagged = tags.get(MODELS_TAG) or ""
        self.preload({m for m in tagged.split(",") if m})

    def _service_fits(self, leases: list[tuple[int, int]]) -> bool:
        """Whether this run embeds through the service: it answers now, or it must (fallback ``none``, the
        default for a ``tcp://`` service: the run then fails its embed steps retryably if it does not)."""
        from resources.embedding_service import service_address, service_available
        from resources.settings import embed_service_fallback

        if not self.service_home:
            return False
        if self.service_max_versions and (not leases or len(leases) > self.service_max_versions):
            return False
        if embed_service_fallback(service_address(self.service_home).is_tcp) == "none":
            return True
        return service_available(self.service_home)

    def preload(self, models: set[str]) -> None:
        """Start loading these models on a background thread (at run setup from the tag; again in parse).

        A fresh run process pays for importing torch and loading the model; started early, that
        overlaps the parse and chunk steps. A failure here is ignored: the embed step loads again
        and classifies the error for each version.
        """
        if self._use_service:
            return
        for model in sorted(models):
            if model.startswith(("fake-", "http:")) or model in self._preloads:
                continue

            def load(name: str = model) -> None:
                try:
                    self._set_threads()
                    self.for_model(name).dimension
                except Exception:  # noqa: BLE001 - reported by the embed step, per version
                    pass

            thread = threading.Thread(target=load, name=f"kbindex-preload-{model}", daemon=True)
            self._preloads[model] = thread
            thread.start()

    def _set_threads(self) -> None:
        import torch

        torch.set_num_threads(self.torch_threads if self.torch_threads > 0 else run_torch_threads())

    def for_model(self, model: str) -> Any:
        """The profile model's embedder, chosen exactly as search chooses it (``embedder_for_model``)."""
        from resources.embedder import fake_embedder_from_env

        if model.startswith("fake-") and not self._remote_service():
            # One fake per model and process: faults are drawn per call, not replayed for every version.
            fake = _FAKES.setdefault(model, fake_embedder_from_env(model))
            delay = float(os.environ.get("KBINDEX_FAKE_DELAY", "0") or 0)
            return _Slowed(fake, delay) if delay > 0 else fake
        if model.startswith("http:"):  # an HTTP provider: nothing to load, no embedding service in between
            from resources.embedder import embedder_for_model

            return embedder_for_model(model)
        if self._use_service:
            if model not in self._served:  # one connection per model and run, not one per version
                from resources.embedding_service import served_embedder

                def fall_back(exc: Exception) -> None:
                    logging.getLogger("kbindex").warning(f"embedding service unusable ({exc}); loading {model} in this run")

                self._served[model] = served_embedder(model, self.service_home, lambda: self._local(model), fall_back)
            return self._served[model]
        return self._local(model)

    def _remote_service(self) -> bool:
        """This run embeds through a service on another host (``tcp://``): then every model goes there, the fake
        included (the service applies its delay and faults), so a fault on that link reaches the fake's runs as it
        would a real model's. A service on this machine leaves the fake in the run, as before."""
        from resources.embedding_service import service_address

        return self._use_service and service_address(self.service_home).is_tcp

    def _local(self, model: str) -> Any:
        from resources.embedder import embedder_for_model

        self._set_threads()
        return embedder_for_model(model, batch_size=self.batch_size)


_FAKES: dict[str, Any] = {}


class _Slowed:
    """Fault injection: a fake embedder that takes ``delay`` seconds per batch (to kill runs mid-embed)."""

    def __init__(self, inner: Any, delay: float) -> None:
        self.inner, self.delay = inner, delay
        self.model_name, self.dimension = inner.model_name, inner.dimension

    def respond(self, texts: list[str]) -> Any:
        import time

        time.sleep(self.delay)
        return self.inner.respond(texts)

    def embed(self, texts: list[str]) -> Any:
        return self.respond(texts).vectors


class IndexingRunResource(dg.ConfigurableResource):
    """The run's ``IndexingRun`` (resources/indexing_run.py): its leases, run state and step verbs.

    Built once per run (in-process executor): it adopts every lease the claiming sensor tagged the
    run with, or creates-or-claims the tasks of a UI backfill under ``kbindex/profile`` (or the one
    building profile, else the active one), and heartbeats all of them on one thread until teardown.
    """

    database: DatabaseResource
    blobs: BlobStoreResource
    lease_seconds: float = 60.0
    heartbeat_seconds: float = 0.0  # 0: a third of the lease
    artifacts: Pinned = ""
    """Where per-task outputs are kept for re-execution (KBINDEX_ARTIFACTS; default KBINDEX_HOME/artifacts).
    Pinned: not run config (PINNED_FIELDS)."""

    _run: IndexingRun | None = PrivateAttr(default=None)
    _keeper: LeaseKeeper | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        run = context.dagster_run
        tags = dict(run.tags) if run else {}
        queue = TaskQueue(self.database.db, lease_seconds=self.lease_seconds)
        self._keeper = LeaseKeeper(queue, interval=self.heartbeat_seconds or None)
        self._keeper.start()
        self._run = IndexingRun(
            db=self.database.db,
            queue=queue,
            keeper=self._keeper,
            owner=run_owner(run.run_id if run else str(os.getpid())),
            granted_by=claim_owner_of(tags),
            blobs=self.blobs.get_store(),
            embedder_for=_no_embedder,
            state=RunState(ArtifactStore(self.artifacts or Settings.from_env().artifacts_dir)),
            tagged=leases_of(tags),
            profile=tags.get(PROFILE_TAG),
        )
        # Adopt the reservations now, before the first step: the run holds them from its start.
        adopted = self._run.adopt_tagged()
        if self._run.tagged and context.log is not None:
            context.log.info(f"adopted {adopted} of the run's {len(self._run.tagged)} reserved task(s)")

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._run is not None:
            self._run.close()
        if self._keeper is not None:
            self._keeper.stop()

    def run(self, embedder: EmbedderResource | None = None) -> IndexingRun:
        """The run, embedding through ``embedder`` (the run's EmbedderResource) when given."""
        assert self._run is not None, "IndexingRunResource used outside a run"
        if embedder is not None:
            self._run.embedder_for = embedder.for_model
            self._run.batch_size = embedder.batch_size
        return self._run


def _no_embedder(model: str) -> Any:
    raise RuntimeError("the run was given no embedder")


def run_torch_threads(concurrent_runs: int | None = None) -> int:
    """torch threads for one run: the cores divided among the runs that embed at the same time.

    Parallelism comes from runs (processes), not from torch's intra-op threads: a deep queue is
    spread over KBINDEX_RUN_SPREAD runs (the per-tenant run limit in dagster.yaml). Measured on a
    2-core machine with all-MiniLM-L6-v2 (3,000 corpus chunks): one process with 2 threads 29.2
    chunks/s; two with 1 thread each 32.5 chunks/s together; two with 2 threads each 27.5 chunks/s
    (oversubscribed OpenMP threads spin in the kernel). A run's own parse, chunk and publish are
    single-threaded too, so one thread per run also keeps both cores busy through those steps.
    """
    runs = concurrent_runs if concurrent_runs is not None else int(os.environ.get("KBINDEX_RUN_SPREAD", "2"))
    return max(1, (os.cpu_count() or 1) // max(1, runs))


def default_resources() -> dict[str, Any]:
    """The resources of the code location, configured from the environment."""
    database = DatabaseResource(url=os.environ.get("KBINDEX_DATABASE_URL", ""))
    blobs = BlobStoreResource(url=os.environ.get("KBINDEX_BLOB_URL", ""))
    return {
        "database": database,
        "indexing_run": IndexingRunResource(
            database=database,
            blobs=blobs,
            lease_seconds=float(os.environ.get("KBINDEX_LEASE_SECONDS", "60")),
            artifacts=os.environ.get("KBINDEX_ARTIFACTS", ""),
        ),
        "blobs": blobs,
        "embedder": EmbedderResource(
            batch_size=int(os.environ.get("KBINDEX_EMBED_BATCH", "64")),
            torch_threads=int(os.environ.get("KBINDEX_TORCH_THREADS", "0")),
            service_home=os.environ.get("KBINDEX_EMBED_SERVICE", ""),
        ),
    }
