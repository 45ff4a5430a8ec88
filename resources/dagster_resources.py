"""The Dagster face of resources/: ``ConfigurableResource`` wrappers around the plain clients.

Clients and pools are built in ``setup_for_execution`` into private attributes, so a run (in-process
executor) builds each once and tears it down after its last step. ``LeaseResource`` is the run's
hold on its tasks: it adopts the leases the claiming sensor granted (run tags), claims the task of
any partition it was launched for without one (UI backfills, ``dagster asset materialize``), and
heartbeats all of them on one thread for the whole run.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from pipelines.domain.errors import FenceRejected, KbindexError
from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.database import Database
from resources.lease_keeper import LeaseKeeper
from resources.settings import Settings, resolve_database_url
from resources.task_queue import Lease, TaskQueue

# Run tags written by the claiming sensor and read by LeaseResource.
LEASES_TAG = "kbindex/leases"  # JSON [[task_id, attempt], ...]
OWNER_TAG = "kbindex/owner"
TENANT_TAG = "kbindex/tenant"
PROFILE_TAG = "kbindex/profile"
MODELS_TAG = "kbindex/models"  # comma-separated models of the run's tasks: loaded from the run's start


def encode_leases(pairs: list[tuple[int, int]]) -> str:
    return json.dumps([[int(t), int(a)] for t, a in pairs], separators=(",", ":"))


def decode_leases(value: str | None) -> list[tuple[int, int]]:
    if not value:
        return []
    return [(int(t), int(a)) for t, a in json.loads(value)]


class DatabaseResource(dg.ConfigurableResource):
    """PostgreSQL for kbindex data (KBINDEX_DATABASE_URL, or the embedded server when empty)."""

    url: str = ""
    pool_size: int = 4

    _db: Database | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._db = Database(self.url or resolve_database_url(), min_size=1, max_size=self.pool_size)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._db is not None:
            self._db.close()

    @property
    def db(self) -> Database:
        if self._db is None:  # used outside a run (e.g. a sensor built per evaluation)
            self._db = Database(self.url or resolve_database_url(), min_size=1, max_size=self.pool_size)
        return self._db


class BlobStoreResource(dg.ConfigurableResource):
    """Document bytes by content hash: a folder or any fsspec URL (KBINDEX_BLOB_URL)."""

    url: str = ""

    def get_store(self) -> BlobStore:
        return BlobStore(self.url or Settings.from_env().blob_url)


class EmbedderResource(dg.ConfigurableResource):
    """sentence-transformers models by profile (loaded once per process).

    A profile whose model is ``fake-384`` gets the deterministic FakeEmbedder (tests and fault
    injection only; faults from KBINDEX_FAKE_FAULTS, e.g. ``timeout=0.1,wrong_dimension=0.05``).
    """

    batch_size: int = 64
    torch_threads: int = 0  # 0: run_torch_threads() (cores divided among the runs that embed at once)
    service_home: str = ""
    """KBINDEX_EMBED_SERVICE: the folder of a running embedding service (``kbindex embed-service``); "" for none."""
    service_max_versions: int = 8
    """Runs of at most this many versions embed through the service; bigger ones load their own model."""

    _preloads: dict[str, threading.Thread] = PrivateAttr(default_factory=dict)
    _use_service: bool = PrivateAttr(default=False)
    _served: dict[str, Any] = PrivateAttr(default_factory=dict)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Small runs use the warm embedding service if one answers; the others start loading the
        models the claiming sensor named (run tag) before the first step runs."""
        run = context.dagster_run
        tags = run.tags if run else {}
        self._use_service = self._service_fits(decode_leases(tags.get(LEASES_TAG)))
        tagged = tags.get(MODELS_TAG) or ""
        self.preload({m for m in tagged.split(",") if m})

    def _service_fits(self, leases: list[tuple[int, int]]) -> bool:
        from resources.embedding_service import service_available

        if not self.service_home or not leases or len(leases) > self.service_max_versions:
            return False
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
            if model.startswith("fake-") or model in self._preloads:
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
        from resources.embedder import FakeEmbedder

        if model.startswith("fake-"):
            rates = {}
            for part in filter(None, os.environ.get("KBINDEX_FAKE_FAULTS", "").split(",")):
                name, _, rate = part.partition("=")
                rates[name.strip()] = float(rate)
            seed = int(os.environ.get("KBINDEX_FAKE_SEED", "0")) + os.getpid()
            # One fake per model and process: faults are drawn per call, not replayed for every version.
            fake = _FAKES.setdefault(model, FakeEmbedder(model_name=model, rates=rates, seed=seed))
            delay = float(os.environ.get("KBINDEX_FAKE_DELAY", "0") or 0)
            return _Slowed(fake, delay) if delay > 0 else fake
        if self._use_service:
            if model not in self._served:  # one connection per model and run, not one per version
                from resources.embedding_service import ServiceEmbedder, ServiceOrLocal

                def fall_back(exc: Exception) -> None:
                    logging.getLogger("kbindex").warning(f"embedding service unusable ({exc}); loading {model} in this run")

                self._served[model] = ServiceOrLocal(ServiceEmbedder(model, self.service_home),
                                                     lambda: self._local(model), fall_back)
            return self._served[model]
        return self._local(model)

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


class ArtifactIOManager(dg.ConfigurableIOManager):
    """Stores ``{partition_key: value}`` outputs one file per key (KBINDEX_HOME/artifacts by default)."""

    root: str = ""

    def _store(self) -> ArtifactStore:
        return ArtifactStore(self.root or (Settings.from_env().home / "artifacts"))

    @staticmethod
    def _asset(context: dg.OutputContext | dg.InputContext) -> str:
        return "/".join(context.asset_key.path)

    def handle_output(self, context: dg.OutputContext, obj: dict[str, Any]) -> None:
        store = self._store()
        for key, value in obj.items():
            store.put(self._asset(context), key, value)

    def load_input(self, context: dg.InputContext) -> dict[str, Any]:
        store = self._store()
        out: dict[str, Any] = {}
        for key in context.asset_partition_keys:
            try:
                out[key] = store.get(self._asset(context), key)
            except KeyError:
                out[key] = None  # never materialized for this key: the step treats it as missing
        return out


@dataclass(frozen=True)
class VersionWork:
    """Everything a step needs about one leased version."""

    key: str
    lease: Lease
    tenant_id: str
    document_id: str
    version_number: int
    profile: str
    model: str
    dimension: int
    chunk_tokens: int
    chunk_overlap: int
    content_hash: str
    filename: str
    media_type: str


class LeaseResource(dg.ConfigurableResource):
    """The run's leases: adopt (sensor runs) or claim (UI runs), heartbeat, check, release."""

    database: DatabaseResource
    lease_seconds: float = 60.0
    heartbeat_seconds: float = 0.0  # 0: a third of the lease

    _queue: TaskQueue | None = PrivateAttr(default=None)
    _keeper: LeaseKeeper | None = PrivateAttr(default=None)
    _owner: str = PrivateAttr(default="")
    _tagged: list[tuple[int, int]] = PrivateAttr(default_factory=list)
    _tagged_index: dict[tuple[str, str, int], list[tuple[int, int, Any]]] | None = PrivateAttr(default=None)
    _profile_tag: str | None = PrivateAttr(default=None)
    _work: dict[str, VersionWork | None] = PrivateAttr(default_factory=dict)
    _why: dict[str, str] = PrivateAttr(default_factory=dict)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        run = context.dagster_run
        tags = dict(run.tags) if run else {}
        self._queue = TaskQueue(self.database.db, lease_seconds=self.lease_seconds)
        self._owner = tags.get(OWNER_TAG) or f"run-{run.run_id if run else os.getpid()}"
        self._tagged = decode_leases(tags.get(LEASES_TAG))
        self._profile_tag = tags.get(PROFILE_TAG)
        self._keeper = LeaseKeeper(self._queue, interval=self.heartbeat_seconds or None)
        self._keeper.start()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._keeper is not None:
            self._keeper.stop()

    @property
    def queue(self) -> TaskQueue:
        assert self._queue is not None, "LeaseResource used outside a run"
        return self._queue

    @property
    def keeper(self) -> LeaseKeeper:
        assert self._keeper is not None, "LeaseResource used outside a run"
        return self._keeper

    @property
    def owner(self) -> str:
        return self._owner

    def why_skipped(self, key: str) -> str:
        return self._why.get(key, "")

    def acquire(self, keys: list[str]) -> dict[str, VersionWork | None]:
        """Leased work for each partition key (None where this run may not touch the version).

        Idempotent: every asset calls it, so a re-execution that starts at a later step acquires too.
        """
        for key in keys:
            if key not in self._work:
                self._work[key] = self._acquire_one(key)
        return {key: self._work[key] for key in keys}

    def _skip(self, key: str, why: str) -> None:
        self._why[key] = why
        return None

    def _acquire_one(self, key: str) -> VersionWork | None:
        db = self.database.db
        version = db.fetch_one("document_version_by_partition_key", {"partition_key": key})
        if version is None:
            return self._skip(key, "no document version has this partition key")
        lease = self._adopt_tagged(version)
        if lease is None:
            lease = self._claim_for(version)
        if lease is None:
            return None
        task = self.queue.get(lease.task_id)
        profile = db.fetch_one("index_profile_get", {"name": task["profile"]})
        return VersionWork(
            key=key,
            lease=lease,
            tenant_id=version["tenant_id"],
            document_id=version["document_id"],
            version_number=version["version_number"],
            profile=profile["name"],
            model=profile["model"],
            dimension=profile["dimension"],
            chunk_tokens=profile["chunk_tokens"],
            chunk_overlap=profile["chunk_overlap"],
            content_hash=version["content_hash"],
            filename=version["filename"],
            media_type=version["media_type"],
        )

    def _tagged_by_version(self) -> dict[tuple[str, str, int], list[tuple[int, int, Any]]]:
        """The run's tagged leases by (tenant, document, version), read once per run (not once per version:
        a 150-version run would otherwise read 11,000 task rows before its first parse)."""
        if self._tagged_index is None:
            self._tagged_index = {}
            for task_id, attempt in self._tagged:
                task = self.queue.get(task_id)
                version = (task["tenant_id"], task["document_id"], task["version_number"])
                self._tagged_index.setdefault(version, []).append((task_id, attempt, task["lease_until"]))
        return self._tagged_index

    def _adopt_tagged(self, version: dict[str, Any]) -> Lease | None:
        """The sensor's lease for this version, if the run was tagged with one and it still holds."""
        wanted = (version["tenant_id"], version["document_id"], version["version_number"])
        for task_id, attempt, lease_until in self._tagged_by_version().get(wanted, []):
            lease = Lease(task_id=task_id, attempt=attempt, owner=self.owner, lease_until=lease_until)
            if self.keeper.adopt(version["partition_key"], lease):
                return self.keeper.lease(version["partition_key"])
            # Lost already (taken over, expired, cancelled, or a re-execution of an old run):
            # fall through to a fresh claim, which succeeds only if the task is claimable now.
        return None

    def _claim_for(self, version: dict[str, Any]) -> Lease | None:
        """Create-or-claim the task of this version (UI backfills, manual materializations)."""
        key = version["partition_key"]
        profile = self._profile_tag or self._default_profile()
        try:
            task_id = self.queue.ensure_task(
                version["tenant_id"], version["document_id"], version["version_number"], profile
            )
            claimed = self.queue.claim_task(task_id, self.owner)
        except KbindexError as exc:
            return self._skip(key, f"{exc.code}: {exc.message}")
        if claimed is None:
            status = self.queue.get(task_id)["status"]
            return self._skip(key, f"task {task_id} is {status} and not claimable now")
        self.keeper.hold(key, claimed.lease)
        return claimed.lease

    def _default_profile(self) -> str:
        building = self.database.db.fetch_all("index_profile_building")
        if len(building) == 1:
            return building[0]["name"]
        active = self.database.db.fetch_one("index_profile_active")
        return active["name"] if active else "minilm-v1"

    def check(self, key: str) -> Lease:
        return self.keeper.check(key)

    def lost(self, key: str, exc: FenceRejected) -> None:
        self.keeper.mark_lost(key, exc)

    def release(self, key: str) -> None:
        self.keeper.release(key)


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
    return {
        "database": database,
        "leases": LeaseResource(
            database=database,
            lease_seconds=float(os.environ.get("KBINDEX_LEASE_SECONDS", "60")),
        ),
        "blobs": BlobStoreResource(url=os.environ.get("KBINDEX_BLOB_URL", "")),
        "embedder": EmbedderResource(
            batch_size=int(os.environ.get("KBINDEX_EMBED_BATCH", "64")),
            torch_threads=int(os.environ.get("KBINDEX_TORCH_THREADS", "0")),
            service_home=os.environ.get("KBINDEX_EMBED_SERVICE", ""),
        ),
        "io_manager": ArtifactIOManager(root=str(Path(os.environ["KBINDEX_ARTIFACTS"])) if os.environ.get("KBINDEX_ARTIFACTS") else ""),
    }
