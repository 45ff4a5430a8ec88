"""``python -m bench.pipeline``: end-to-end throughput and latency through Dagster (see bench/pipeline/__init__.py)."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

from bench import exit_on_sigterm, server_url, share_built_models
from bench.cpu import CpuMeter, postgres_pid
from bench.cpu import budget as cpu_budget
from bench.cpu import render as render_cpu
from bench.dagster_dev import DagsterDev
from bench.warm_service import warm_embedding_service
from resources.local_postgres import with_database
from sql import queries

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TENANT = "bench"
LATENCY_TENANT = "bench-latency"
WARMUP_TENANT = "bench-warmup"
TERMINAL = ("SUCCEEDED", "DEAD", "CANCELLED")
POLL_SECONDS = 0.05
SETTINGS = (
    "KBINDEX_RUN_BATCH",
    "KBINDEX_RUN_BATCH_MIN",
    "KBINDEX_MAX_WAITING_RUNS",
    "KBINDEX_EMBED_BATCH",
    "KBINDEX_TORCH_THREADS",
    "KBINDEX_LEASE_SECONDS",
)

Out = Callable[[str], None]


class BenchSkipped(Exception):
    """The bench cannot run here (e.g. the corpus is absent); not a failure."""


# --------------------------------------------------------------------------------------------------
# databases and Dagster


@contextmanager
def scratch_databases(admin_url: str) -> Iterator[tuple[str, str]]:
    """A migrated kbindex database and an empty one for Dagster's storage; both dropped afterwards."""
    from resources.migrations import migrate

    names = [f"kbindex_bench_pipe_{os.getpid()}", f"dagster_bench_pipe_{os.getpid()}"]

    def drop() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for name in names:
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))

    drop()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for name in names:
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        kb_url, dg_url = (with_database(admin_url, n) for n in names)
        migrate(kb_url)
        yield kb_url, dg_url
    finally:
        drop()


def dagster_dev(kb_url: str, dg_url: str, root: Path) -> DagsterDev:
    """``dagster dev`` on these databases with the repository's dagster.yaml, its folders under ``root``."""
    from pipelines.cli.dev_command import psycopg2_url

    home = root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(home),
        DAGSTER_PG_URL=psycopg2_url(dg_url),
        KBINDEX_DATABASE_URL=kb_url,
        KBINDEX_HOME=str(root / "kbhome"),
        KBINDEX_BLOB_URL=str(root / "blobs"),
        KBINDEX_ARTIFACTS=str(root / "artifacts"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    return DagsterDev(root, env)


# --------------------------------------------------------------------------------------------------
# documents


def select_documents(corpus: Path, n: int) -> list[Path]:
    """``n`` corpus files: two en-peps .rst for every en-sotu .txt, spread evenly over each folder."""
    peps = sorted((corpus / "en-peps").glob("*.rst"))
    sotu = sorted((corpus / "en-sotu").glob("*.txt"))
    if not peps or not sotu:
        raise BenchSkipped(f"corpus not found: need {corpus}/en-peps/*.rst and {corpus}/en-sotu/*.txt")
    n_sotu = min(len(sotu), n // 3)
    n_peps = min(len(peps), n - n_sotu)

    def spread(files: list[Path], k: int) -> list[Path]:
        return [files[int(i * len(files) / k)] for i in range(k)] if k else []

    picked_peps, picked_sotu = spread(peps, n_peps), spread(sotu, n_sotu)
    out: list[Path] = []
    for i in range(max(len(picked_peps), len(picked_sotu))):  # interleave: the queue holds a mix throughout
        out.extend(picked_peps[2 * i : 2 * i + 2] if 2 * i < len(picked_peps) else [])
        if i < len(picked_sotu):
            out.append(picked_sotu[i])
    return out[:n]


def generated_documents(n: int, seed: int = 7) -> list[tuple[str, bytes]]:
    """``n`` small generated text documents (when no corpus is given: smoke runs)."""
    rng = random.Random(seed)
    words = ("policy refund invoice travel hotel contract retention employee manager approval budget "
             "security laptop vendor audit quarter report customer warranty shipping").split()
    docs = []
    for i in range(n):
        paragraphs = [" ".join(rng.choice(words) for _ in range(60)).capitalize() + "." for _ in range(8)]
        docs.append((f"generated-{i:04d}.txt", f"Document {i}\n\n".encode() + "\n\n".join(paragraphs).encode()))
    return docs


def one_page_documents(n: int, corpus: Path | None, seed: int = 11) -> list[tuple[str, bytes]]:
    """``n`` distinct one-page (~2,500 character) documents for the latency samples."""
    source = sorted((corpus / "en-sotu").glob("*.txt")) if corpus else []
    if not source:
        return [(f"page-{i:03d}.txt", body) for i, (_, body) in enumerate(generated_documents(n, seed))]
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        text = rng.choice(source).read_text(errors="replace")
        start = rng.randrange(0, max(1, len(text) - 2600))
        page = text[start : start + 2500]
        docs.append((f"page-{i:03d}.txt", f"Latency sample {i}\n\n{page}".encode()))
    return docs


# --------------------------------------------------------------------------------------------------
# measuring


@dataclass
class Bench:
    kb_url: str
    dg_url: str
    dagster: DagsterDev
    out: Out
    report: dict[str, Any] = field(default_factory=dict)
    service_pid: int | None = None  # the warm embedding service, when on: its CPU is counted apart
    publish_batch: int | None = None
    """Documents per publish_many transaction, as `kbindex publish DIR` sends them (None: its default,
    KBINDEX_PUBLISH_BATCH); 0: one publish call per document, as before batches existed."""

    def __post_init__(self) -> None:
        from resources.blob_store import BlobStore
        from resources.database import Database
        from resources.publisher import Publisher

        self.db = Database(self.kb_url, max_size=2)
        self.publisher = Publisher(self.db, BlobStore(self.dagster.env["KBINDEX_BLOB_URL"]))
        self.conn = psycopg.connect(self.kb_url, autocommit=True)

    def close(self) -> None:
        self.conn.close()
        self.db.close()

    def sql(self, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run the named statement ``name`` (sql/queries) on the bench's own connection; its rows, if any."""
        cur = self.conn.execute(queries[name], params or {})
        return cur.fetchall() if cur.description else []

    def counts(self, tenant: str) -> dict[str, int]:
        return dict(self.sql("bench_pipeline_tenant_states", {"tenant": tenant}))

    def wait_terminal(self, tenant: str, expected: int, timeout: float, progress: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while True:
            counts = self.counts(tenant)
            done = sum(counts.get(s, 0) for s in TERMINAL)
            if progress is not None:
                progress(done, counts)
            if done >= expected:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s: {counts}\n{self.dagster.log_tail()}")
            self.dagster.check_alive()
            time.sleep(0.5)

    # -- phases -------------------------------------------------------------------------------

    def warm_up(self, timeout: float) -> float:
        started = time.perf_counter()
        self.publisher.publish(WARMUP_TENANT, "warm-up.txt", b"Warm-up document: proves the daemon is up.", "warm-up.txt")
        self.wait_terminal(WARMUP_TENANT, 1, timeout)
        return time.perf_counter() - started

    def publish_all(self, tenant: str, docs: list[tuple[str, bytes]]) -> None:
        """Publish ``docs`` (name, body) as a user's bulk import would: batches, or one call each."""
        from resources.publisher import BATCH_DOCUMENTS, PublishRequest, batched

        size = BATCH_DOCUMENTS if self.publish_batch is None else self.publish_batch
        if size <= 0:
            for name, body in docs:
                self.publisher.publish(tenant, name, body, name)
            return
        for batch in batched(docs, lambda doc: len(doc[1]), max_items=size):
            self.publisher.publish_all(tenant, [PublishRequest(n, b, n) for n, b in batch])

    def throughput(self, docs: list[tuple[str, bytes]], timeout: float, tenant: str = TENANT) -> dict[str, Any]:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        meter = CpuMeter({"embedding service": self.service_pid, "PostgreSQL": postgres_pid(self.kb_url),
                          "Dagster": self.dagster.proc.pid if self.dagster.proc else None}, parts_of="Dagster")
        meter.start()
        started = time.perf_counter()
        self.publish_all(tenant, docs)
        publish_seconds = time.perf_counter() - started
        self.out(f"published {len(docs)} documents in {publish_seconds:.1f} s; indexing…")
        with Progress(
            TextColumn("[bold]indexing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), transient=not sys.stdout.isatty(),
            disable=not sys.stdout.isatty(),
        ) as bar:
            job = bar.add_task("", total=len(docs))
            last_line = [time.monotonic()]

            def show(done: int, counts: dict[str, int]) -> None:
                chunks = self.sql("bench_pipeline_tenant_chunks", {"tenant": tenant})[0][0]
                line = f"{chunks} chunks  " + " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                bar.update(job, completed=done, description=line)
                if bar.disable and time.monotonic() - last_line[0] >= 15:  # not a terminal: a line now and then
                    last_line[0] = time.monotonic()
                    self.out(f"  {time.perf_counter() - started:6.0f} s  {done}/{len(docs)} terminal  {line}")

            self.wait_terminal(tenant, len(docs), timeout, show)
        cpu_seconds, dagster_parts = meter.spent(), meter.parts_spent()
        (wall, chunks, versions) = self.sql("bench_pipeline_tenant_throughput", {"tenant": tenant})[0]
        return {
            "docs": len(docs),
            "succeeded_docs": versions,
            "chunks": chunks,
            "publish_seconds": round(publish_seconds, 2),
            "wall_seconds": round(wall, 2),
            "chunks_per_second": round(chunks / wall, 2) if wall else 0.0,
            "cpu_seconds": cpu_seconds,
            "dagster_parts": dagster_parts,
            "final_states": self.final_states(tenant),
            "stages": self.stage_breakdown(tenant),
        }

    def latency(self, docs: list[tuple[str, bytes]], timeout: float, seed: int = 3) -> dict[str, Any]:
        rng = random.Random(seed)
        samples: list[float] = []
        breakdowns: list[dict[str, float]] = []
        for i, (name, body) in enumerate(docs):
            time.sleep(rng.uniform(0.0, 1.0))  # do not phase-lock the samples to the sensor's 5 s loop
            started = time.perf_counter()
            result = self.publisher.publish(LATENCY_TENANT, name, body, name)
            deadline = time.monotonic() + timeout
            while True:
                row = self.sql("bench_pipeline_pointer_version", {"tenant": LATENCY_TENANT, "document_id": name})
                if row and row[0][0] == result.version:
                    break
                status = self.sql("bench_pipeline_task_status", {"task_id": result.task_id})[0]
                if status[0] in ("DEAD", "CANCELLED"):
                    raise RuntimeError(f"latency sample {name} ended {status[0]} {status[1]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"latency sample {name} not searchable after {timeout:.0f} s")
                time.sleep(POLL_SECONDS)
            took = time.perf_counter() - started
            samples.append(took)
            breakdowns.append(self.task_breakdown(result.task_id))
            self.out(f"  latency {i + 1}/{len(docs)}: {took:5.2f} s  " + "  ".join(
                f"{k} {v:.2f}" for k, v in breakdowns[-1].items()))
        return {
            "samples": [round(s, 3) for s in samples],
            "p50": round(percentile(samples, 50), 3),
            "p95": round(percentile(samples, 95), 3),
            "breakdown_median": {k: round(statistics.median(b[k] for b in breakdowns), 3) for k in breakdowns[0]}
            if breakdowns else {},
            "final_states": self.final_states(LATENCY_TENANT),
        }

    def task_breakdown(self, task_id: int) -> dict[str, float]:
        """Seconds per phase of one task from its event history (database clock)."""
        rows = self.sql("bench_pipeline_task_events", {"task_id": task_id})
        created = self.sql("bench_pipeline_task_times", {"task_id": task_id})[0]
        marks: dict[str, Any] = {}
        for kind, to_status, stage, at in rows:
            if kind == "transition" and to_status == "RUNNING" and "claimed" not in marks:
                marks["claimed"] = at
            if kind == "progress" and stage and stage not in marks:
                marks[stage] = at
        order = [("created", created[0]), ("claimed", marks.get("claimed")), ("parse", marks.get("parse")),
                 ("embed", marks.get("embed")), ("publish", marks.get("publish")), ("finished", created[1])]
        names = {"claimed": "sensor", "parse": "run_start", "embed": "parse_chunk", "publish": "embed",
                 "finished": "publish"}
        out: dict[str, float] = {}
        prev = order[0][1]
        for mark, at in order[1:]:
            if at is None or prev is None:
                continue
            out[names[mark]] = (at - prev).total_seconds()
            prev = at
        return out

    def stage_breakdown(self, tenant: str) -> dict[str, float]:
        """Median seconds per phase over the tenant's SUCCEEDED tasks (sensor wait, run start, ...)."""
        ids = [r[0] for r in self.sql("bench_pipeline_tenant_succeeded_ids", {"tenant": tenant})]
        parts = [self.task_breakdown(t) for t in ids]
        keys = sorted({k for p in parts for k in p})
        return {k: round(statistics.median(p[k] for p in parts if k in p), 3) for k in keys}

    def final_states(self, tenant: str) -> dict[str, int]:
        rows = self.sql("bench_pipeline_tenant_final_states", {"tenant": tenant})
        return {k: int(v) for k, v in rows}

    def runs(self, tenant: str) -> dict[str, Any]:
        """The Dagster runs that carried this tenant's tasks: how many, versions each, how long."""
        task_ids = {r[0] for r in self.sql("bench_pipeline_tenant_task_ids", {"tenant": tenant})}
        with psycopg.connect(self.dg_url, autocommit=True) as conn:
            rows = conn.execute(queries["bench_dagster_runs_in_order"]).fetchall()
        leases = self._run_leases()
        sizes, durations, statuses, run_ids = [], [], {}, []
        for run_id, status, start, end in rows:
            pairs = [p for p in leases.get(run_id, []) if p[0] in task_ids]
            if not pairs:
                continue
            run_ids.append(run_id)
            sizes.append(len(pairs))
            statuses[status] = statuses.get(status, 0) + 1
            if start and end:
                durations.append(end - start)
        return {
            "runs": len(sizes),
            "versions_per_run": sizes,
            "versions_per_run_mean": round(statistics.mean(sizes), 2) if sizes else 0,
            "run_seconds_median": round(statistics.median(durations), 2) if durations else None,
            "run_statuses": statuses,
            "step_seconds": self.step_seconds(run_ids),
            "claimed_by": self.claimed_by(run_ids),
        }

    def claimed_by(self, run_ids: list[str]) -> dict[str, int]:
        """How many of these runs each claiming sensor requested (pipelines/claim_window.py shares a loop's wait)."""
        with psycopg.connect(self.dg_url, autocommit=True) as conn:
            rows = conn.execute(queries["bench_dagster_runs_by_sensor"], {"run_ids": run_ids}).fetchall()
        return {name: count for name, count in rows}

    def step_seconds(self, run_ids: list[str]) -> dict[str, list[float]]:
        """Per asset step, its seconds in each of these runs (STEP_START -> STEP_SUCCESS/FAILURE events)."""
        if not run_ids:
            return {}
        with psycopg.connect(self.dg_url, autocommit=True) as conn:
            rows = conn.execute(queries["bench_dagster_step_events"], {"run_ids": run_ids}).fetchall()
        started: dict[tuple[str, str], Any] = {}
        out: dict[str, list[float]] = {}
        for run_id, step, kind, at in rows:
            if kind == "STEP_START":
                started[(run_id, step)] = at
            elif (run_id, step) in started:
                out.setdefault(step, []).append(round((at - started.pop((run_id, step))).total_seconds(), 2))
        return out

    def embed_texts(self, tenant: str) -> list[str]:
        """The exact texts the pipeline embedded for the tenant's SUCCEEDED versions: each version's stored
        bytes parsed and chunked again with its profile's parameters (the chunker is deterministic, and a
        run deletes its artifacts once its tasks end)."""
        from pipelines.domain.chunking import VersionIdentity, chunk_document
        from pipelines.domain.parsing import parse_document
        from resources.blob_store import BlobStore
        from resources.embedder import tokenizer_for_model

        blobs = BlobStore(self.dagster.env["KBINDEX_BLOB_URL"])
        rows = self.sql("bench_pipeline_embedded_versions", {"tenant": tenant})
        texts: list[str] = []
        for document_id, version, profile, content_hash, filename, media_type, model, tokens, overlap, ocr in rows:
            parsed = parse_document(blobs.get(content_hash), filename=filename, media_type=media_type, ocr=ocr)
            chunks = chunk_document(parsed, tokenizer=tokenizer_for_model(model), chunk_tokens=tokens, overlap=overlap,
                                    identity=VersionIdentity(tenant, document_id, version, profile))
            texts.extend(c.embed_text for c in chunks)
        return texts

    def embed_counts(self, tenant: str) -> dict[str, int]:
        """The pipeline's own per-version counts, summed over the tenant's runs: texts embedded, reused
        from storage and shared within a run (the ``chunk_embeddings`` materialization metadata)."""
        from dagster import deserialize_value

        run_ids = self.runs_of(tenant)
        totals = {"embedded": 0, "reused": 0, "shared": 0}
        if not run_ids:
            return totals
        with psycopg.connect(self.dg_url, autocommit=True) as conn:
            rows = conn.execute(queries["bench_dagster_materializations_of_runs"],
                                {"run_ids": run_ids, "asset_key": '%"chunk_embeddings"%'}).fetchall()
        for (event,) in rows:
            metadata = deserialize_value(event).dagster_event.event_specific_data.materialization.metadata
            for name in totals:
                value = metadata.get(name)
                totals[name] += int(getattr(value, "value", value) or 0)
        return totals

    def runs_of(self, tenant: str) -> list[str]:
        """Ids of the Dagster runs whose leases name one of this tenant's tasks."""
        task_ids = {r[0] for r in self.sql("bench_pipeline_tenant_task_ids", {"tenant": tenant})}
        return [run_id for run_id, pairs in self._run_leases().items() if any(p[0] in task_ids for p in pairs)]

    def _run_leases(self) -> dict[str, list[tuple[int, int]]]:
        """Every run's leases, from its lease tags in Dagster's run storage."""
        from resources.dagster_resources import LEASES_TAG, leases_of

        with psycopg.connect(self.dg_url, autocommit=True) as conn:
            rows = conn.execute(queries["bench_dagster_tags_named"],
                                {"key": LEASES_TAG, "key_like": LEASES_TAG + ".%"}).fetchall()
        tags: dict[str, dict[str, str]] = {}
        for run_id, key, value in rows:
            tags.setdefault(run_id, {})[key] = value
        return {run_id: leases_of(t) for run_id, t in tags.items()}

    def model_name(self) -> str:
        return self.sql("bench_active_model")[0][0]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p50 of 20 samples is the 10th smallest, p95 the 19th)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


# --------------------------------------------------------------------------------------------------
# the whole bench


def run(
    *,
    corpus: Path | None,
    docs: int,
    latency_samples: int,
    fake_model: bool = False,
    warmup: bool = True,
    timeout: float = 1800.0,
    bare_parallel: bool = True,
    embed_service: bool = True,
    peers: bool = False,
    passes: int = 3,
    publish_batch: int | None = None,
    out: Out = print,
) -> dict[str, Any]:
    """Run every phase; returns the report (also printed by ``main``). ``peers``: then bench.peers on the
    same documents (LlamaIndex beside kbindex). ``passes``: interleaved rounds of pipeline, bare encode and
    bare system (bench/pipeline/passes.py); pass 1's figures are the detailed single-pass report."""
    from bench.pipeline.passes import interleaved_passes, summary
    if corpus is not None:
        files = select_documents(corpus, docs)
        documents = [(p.name, p.read_bytes()) for p in files]
    else:
        documents = generated_documents(docs)
    pages = one_page_documents(latency_samples, corpus)
    share_built_models()
    embed_batch = int(os.environ.get("KBINDEX_EMBED_BATCH", "64"))
    report: dict[str, Any] = {
        "settings": {k: os.environ[k] for k in SETTINGS if k in os.environ},
        "cpus": os.cpu_count(),
        "publish_batch": publish_batch,
    }
    with server_url() as admin_url, scratch_databases(admin_url) as (kb_url, dg_url):
        if fake_model:
            with psycopg.connect(kb_url, autocommit=True) as conn:
                conn.execute(queries["bench_set_active_model"], {"model": "fake-384"})
        root = Path(tempfile.mkdtemp(prefix="kbindex-bench-pipeline-"))
        dagster = dagster_dev(kb_url, dg_url, root)
        bench = Bench(kb_url, dg_url, dagster, out, publish_batch=publish_batch)
        services = ExitStack()
        try:
            service = services.enter_context(warm_embedding_service(  # as `kbindex dev` runs it: small runs
                dagster.env["KBINDEX_HOME"], dagster.env, log=root / "embedder.log",  # use the warm model
                enabled=embed_service and not fake_model))
            bench.service_pid = service.pid if service else None
            report["embed_service"] = service is not None
            dagster.start()
            ready = dagster.wait_ready()
            report["dagster_ready_seconds"] = round(ready, 2)
            if warmup:
                out(f"dagster dev answered in {ready:.1f} s; indexing a warm-up document…")
                report["warmup_seconds"] = round(bench.warm_up(min(timeout, 300.0)), 2)
                out(f"warm-up document searchable after {report['warmup_seconds']:.1f} s (cold run)")
            report["model"] = bench.model_name()
            report["passes"] = interleaved_passes(
                bench, documents, passes=max(1, passes), admin_url=admin_url, model=report["model"],
                embed_batch=embed_batch, tenant=TENANT, timeout=timeout, bare_parallel=bare_parallel, out=out,
                idle_pids=lambda: [dagster.proc.pid if dagster.proc else None, service.pid if service else None])
            report["floor"] = summary(report["passes"])
            first = report["passes"][0]
            report["throughput"] = first["throughput"]
            if latency_samples:
                out(f"latency: {latency_samples} one-page documents, one at a time")
                report["latency"] = bench.latency(pages, timeout=min(timeout, 300.0))
                report["latency"]["dagster"] = bench.runs(LATENCY_TENANT)
            texts = bench.embed_texts(TENANT)
            report["pipeline_counts"] = bench.embed_counts(TENANT)
        finally:
            dagster.stop()
            services.close()
            bench.close()
            shutil.rmtree(root, ignore_errors=True)
    unique = list(dict.fromkeys(texts))  # the pipeline embeds each distinct text once and reuses the rest
    report["reuse"] = reuse_figures(len(texts), len(unique), report.get("pipeline_counts"))
    report["bare_one_process"] = first["bare_one_process"]  # pass 1's bare encode of these distinct texts
    if first["bare_processes"]:
        report["bare_processes"] = first["bare_processes"]
    report["bare"] = first["bare_encode"]
    # Same work on both sides: the distinct texts, in the pipeline's wall time vs the model's own.
    wall = report["throughput"]["wall_seconds"]
    report["throughput"]["texts_per_second"] = round(len(unique) / wall, 2) if wall else 0.0
    e2e, bare = report["throughput"]["texts_per_second"], report["bare"]["chunks_per_second"]
    report["ratio"] = round(e2e / bare, 3) if bare else None
    one = report["bare_one_process"]["chunks_per_second"]
    report["ratio_vs_one_process"] = round(e2e / one, 3) if one else None
    report["cpu"] = cpu_budget(report["throughput"]["cpu_seconds"], wall, report["bare"]["cpu_seconds"],
                               report["cpus"])
    if peers:
        from bench.peers import PeersUnavailable
        from bench.peers import run as run_peers

        out(f"bench.peers: LlamaIndex IngestionPipeline on the same {len(documents)} documents…")
        try:
            report["peers"] = run_peers(documents, batch_size=embed_batch, bare_parallel=bare_parallel,
                                        kbindex_model="fake-384" if fake_model else None, out=out)
        except PeersUnavailable as exc:
            report["peers"] = {"skipped": str(exc)}
        except Exception as exc:  # noqa: BLE001 - the pipeline's own figures are printed all the same
            report["peers"] = {"skipped": f"bench.peers failed: {type(exc).__name__}: {exc}"}
    return report


def reuse_figures(chunks: int, distinct: int, counts: dict[str, int] | None) -> dict[str, Any]:
    """How many chunks the pipeline served without embedding them, by its texts and by its own counts."""
    figures: dict[str, Any] = {"chunks": chunks, "distinct_texts": distinct,
                               "reuse_share": round(1 - distinct / chunks, 4) if chunks else 0.0}
    if counts is not None:
        figures["pipeline_counts"] = counts
        figures["pipeline_embedded_share"] = round(counts["embedded"] / chunks, 4) if chunks else 0.0
    return figures


def render(report: dict[str, Any]) -> str:
    t, b, r = report["throughput"], report["bare"], report["reuse"]
    runs = t["dagster"]
    lines = [
        f"model {report['model']}, {report['cpus']} cpus, settings {report['settings'] or 'defaults'}, "
        f"embedding service {'on' if report.get('embed_service') else 'off'}",
        f"docs                 {t['docs']} ({t['succeeded_docs']} succeeded)",
        f"chunks (succeeded)   {t['chunks']}",
        f"wall time            {t['wall_seconds']:.1f} s  (first publish -> last terminal; publishing took {t['publish_seconds']:.1f} s)",
        f"end-to-end           {t['chunks_per_second']:.1f} chunks/s, {t['texts_per_second']:.1f} distinct texts/s",
        f"reuse                {r['distinct_texts']} distinct texts of {r['chunks']} chunks: "
        f"{100 * r['reuse_share']:.1f}% of chunks served by reuse"
        + (f"; the pipeline's counts: {r['pipeline_counts']}" if r.get("pipeline_counts") else ""),
        *(f"bare model.encode    {x['chunks_per_second']:.1f} chunks/s  ({x['chunks']} chunks in {x['seconds']:.1f} s, "
          f"{x.get('processes', 1)} process(es) x {x['threads']} thread(s))"
          for x in (report["bare_one_process"], report.get("bare_processes")) if x),
        f"ratio e2e/bare       {report['ratio']}  (distinct texts/s, same texts both sides; target >= 0.95; "
        f"bare = the faster of the above at "
        f"{b['chunks_per_second']:.1f} chunks/s; vs one process: {report['ratio_vs_one_process']})",
        f"runs launched        {runs['runs']}  versions per run {runs['versions_per_run']} (mean {runs['versions_per_run_mean']}), median run {runs['run_seconds_median']} s",
        f"run steps (s)        {runs['step_seconds']}",
        f"median task phases   {t['stages']}",
        render_cpu(report["cpu"], t.get("dagster_parts")),
        f"final states         {t['final_states']}",
    ]
    if report.get("passes"):
        from bench.pipeline.passes import render as render_passes

        lines.append(render_passes(report["passes"], report["floor"]))
    lat = report.get("latency")
    if lat:
        lines += [
            f"latency p50          {lat['p50']:.2f} s  p95 {lat['p95']:.2f} s  (target p50 <= 2 s, issue #34; "
            f"{len(lat['samples'])} samples, each published when the one before was searchable)",
            f"latency phases (med) {lat['breakdown_median']}",
            f"latency runs         {lat['dagster']['runs']}  versions per run {lat['dagster']['versions_per_run']}"
            f"  claimed by {lat['dagster'].get('claimed_by', {})}",
            f"latency final states {lat['final_states']}",
        ]
    peers = report.get("peers")
    if peers:
        from bench.peers import render as render_peers

        lines += [f"bench.peers skipped  {peers['skipped']}"] if "skipped" in peers else [
            "", render_peers(peers),
            f"side by side         kbindex e2e/bare {report['ratio']}, LlamaIndex/bare {peers['ratio']} "
            f"(each vs the faster bare setup on its own distinct texts)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__)
    parser.add_argument("--corpus", type=Path, default=None,
                        help="folder with en-peps/ and en-sotu/ (without it: generated documents)")
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--latency-samples", type=int, default=20)
    parser.add_argument("--fake-model", action="store_true",
                        help="set the active profile's model to 'fake-384' (smoke runs; no torch)")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the warm-up document (the first run's cold start then counts)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the throughput phase")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here as JSON")
    parser.add_argument("--no-embed-service", dest="embed_service", action="store_false",
                        help="no warm embedding service (kbindex dev starts one): every run loads its own model")
    parser.add_argument("--no-bare-parallel", dest="bare_parallel", action="store_false",
                        help="measure bare model.encode in one process only (not also one process per core)")
    parser.add_argument("--passes", type=int, default=3,
                        help="interleaved passes of pipeline, bare encode and bare system (medians reported)")
    parser.add_argument("--publish-batch", type=int, default=None, metavar="N",
                        help="documents per publish transaction (default: `kbindex publish`'s, KBINDEX_PUBLISH_BATCH; "
                        "0: one publish call per document, as before batches)")
    parser.add_argument("--peers", action="store_true",
                        help="afterwards run bench.peers (LlamaIndex) on the same documents; needs .[peers]")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    exit_on_sigterm()  # SIGTERM still stops Dagster and drops the databases

    def out(line: str) -> None:
        print(line, flush=True)

    if args.corpus is not None and not args.corpus.is_dir():
        out(f"bench.pipeline skipped: corpus folder {args.corpus} not found (pass --corpus ../shared/corpus)")
        return 0
    try:
        report = run(corpus=args.corpus, docs=args.docs, latency_samples=args.latency_samples,
                     fake_model=args.fake_model, warmup=args.warmup, timeout=args.timeout,
                     bare_parallel=args.bare_parallel, embed_service=args.embed_service, peers=args.peers,
                     passes=args.passes, publish_batch=args.publish_batch, out=out)
    except BenchSkipped as exc:
        out(f"bench.pipeline skipped: {exc}")
        return 0
    out(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
