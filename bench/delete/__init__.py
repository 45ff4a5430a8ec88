"""Delete and metadata-only change latency through the real daemon and claiming sensor, beside the fast path.

Issue #29's target: a delete (tombstone publish) -> gone from every search mode, idle, p50 <= 5 s. Issue #30's:
a metadata-only change (same bytes, new metadata or allow list) -> searchable with its new metadata, idle,
p50 <= 2 s with 0 texts embedded. One run measures, one document at a time and one operation at a time:

- publish: a new one-page document -> searchable in dense, lexical and hybrid (through a run: it needs parsing
  and embedding whichever publisher is used);
- delete_pipeline / metadata_pipeline: ``Publisher`` without ``fast``: a PENDING task, a sensor tick that claims
  it, a run (which copies the earlier version's chunks for a metadata-only change), a fenced publish;
- delete_fast / metadata_fast: ``Publisher(fast=FastPublish(...))``: the publishing process (here the bench, as
  the CLI and the API do) claims the task right after the commit and runs the same fenced publish itself
  (resources/chunk_copy.py). ``fast_in_process`` counts how many it finished before ``publish``/``delete``
  returned (the rest were left to a run: the sensor claimed first).

Each document pair (one per path) is published, changed (metadata ``dept``/``revision`` and allow list
``group:finance``) and deleted. Every time starts before the ``publish``/``delete`` call and stops at the first
poll (every ``poll`` s) where all three modes agree: searchable = a hit of that document; changed = a hit, read as
``group:finance``, with the new version number and exactly the new metadata; gone = no hit, read with the
operator override (every version, whatever its allow list). Before each operation the bench waits until no task
is unfinished and no Dagster run is in progress (idle), then a random 0..``gap`` s (``--gap``), so operations
arrive at random points of the sensor daemon's 5-s loop rather than each one the same time after the last run.

Set-up is bench/chaos's (its own embedded PostgreSQL, ``dagster dev``), without faults, embedding through the
fake OpenAI-compatible provider (bench/fake_embedding_server.py) in this process: runs in any process embed
through it, so the texts it answered between an operation's start and the next idle point are that operation's
``texts_embedded`` (the bench's own queries are embedded locally with the same vectors and not counted). Stored
vectors of the same texts could also be reused without a provider call, so ``run_embed_step`` adds what the run
itself recorded on the version's chunk_embeddings partition in Dagster's event log (``copied_from``: the chunks
and vectors were copied; ``embedded``: texts it embedded), and None where no run materialized the version (the
fast path published it). For the paths through runs, ``phases`` splits each task's time: its commit -> the
claim that made it RUNNING (the sensor's tick) and that claim -> finished (the run's start, its work, the publish).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.chaos import Chaos, ChaosConfig, _sql
from pipelines.sensors import CLAIM_SENSORS, CLAIM_WAIT_SECONDS

MODES = ("dense", "lexical", "hybrid")
TENANT = "deletes"
MEASURES = ("publish", "delete_pipeline", "delete_fast", "metadata_pipeline", "metadata_fast")
READER = "group:finance"
"""Who the metadata-only change allows; the changed version is searched for on its behalf."""
RUNNING = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING")
DELETE_TARGET_S = 5.0
METADATA_TARGET_S = 2.0


@dataclass
class DeleteConfig:
    documents: int = 10
    """Documents per path (pipeline and fast): 2x this many are published."""
    timeout: float = 120.0
    """Seconds one operation may take to show in (or leave) search before the bench gives up."""
    idle_timeout: float = 120.0
    poll: float = 0.05
    gap: float = 5.0
    """Once idle, each operation waits a random 0..gap s first (seeded), so it lands anywhere in the sensor daemon's
    5-s loop, as a lone publish does. 0: back to back, which locks every operation to the same phase of that loop."""
    keep: bool = False


def _page(n: int) -> tuple[str, bytes]:
    phrase = f"zebulon{n}quartz"
    text = (f"# Policy {n}\n\nThe {phrase} rule says how the team files expense reports for trip {n}. "
            "Receipts go in the shared folder within a week; the approver checks each line. ") * 6
    return phrase, text.encode()


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))], 3)


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": round(statistics.median(values), 3) if values else None,
            "p95": percentile(values, 95), "max": round(max(values), 3) if values else None,
            "seconds": [round(v, 3) for v in values]}


class DeleteBench(Chaos):
    def __init__(self, config: DeleteConfig, out: Callable[[str], None] = print) -> None:
        super().__init__(ChaosConfig(tasks=0, kills=0, stops=0, pg_restarts=0, faults="", fake_delay=0.0,
                                     run_batch=8, run_batch_min=1, keep=config.keep,
                                     http_provider=True, http_rpm=100_000), out)
        self.dcfg = config

    # -- reading -----------------------------------------------------------------------------------

    def _modes_with(self, phrase: str, document_id: str, read: Any = None,
                    want: Callable[[Any], bool] = lambda hit: True) -> set[str]:
        from resources.search import search

        return {m for m in MODES
                if any(h.document_id == document_id and want(h)
                       for h in search(self.db, self.embedder, phrase, tenant_id=TENANT, k=10, mode=m, read=read))}

    def _until(self, started: float, what: str, document_id: str, done: Callable[[], bool],
               found: Callable[[], set[str]]) -> float:
        while time.monotonic() - started < self.dcfg.timeout:
            if done():
                return time.monotonic() - started
            time.sleep(self.dcfg.poll)
        raise TimeoutError(f"{document_id}: not {what} after {self.dcfg.timeout} s (modes: {sorted(found())})")

    def _texts_embedded(self) -> int:
        """Texts the fake provider embedded and delivered so far, to any process."""
        return sum(len(r["digests"]) for r in self.provider.stats()["records"])

    def _run_account(self, document_id: str, version: int) -> dict[str, Any] | None:
        """What a run recorded for the version's chunk_embeddings partition (embedded, reused, copied_from, or
        tombstone), from Dagster's event log; None: no run materialized it (the fast path published it)."""
        from dagster import deserialize_value

        from pipelines.domain.partition_keys import version_partition_key

        rows = _sql(self.dg_url, "bench_dagster_version_materialization",
                    {"partition": version_partition_key(TENANT, document_id, version), "asset_key": "%chunk_embeddings%"})
        if not rows:
            return None
        meta = deserialize_value(rows[0][0]).dagster_event.step_materialization_data.materialization.metadata
        return {k: meta[k].value for k in ("embedded", "reused", "copied_from", "tombstone") if k in meta}

    def _phases(self, task_id: int) -> dict[str, float] | None:
        """Where a task's time went: its commit -> the claim that made it RUNNING (the sensor's tick), and that
        claim -> finished (the run's start, its work and the fenced publish)."""
        rows = _sql(self.url, "bench_delete_task_phases", {"task_id": task_id})
        if not rows or rows[0][1] is None:
            return None
        return {"to_claim": round(rows[0][0], 3), "claim_to_done": round(rows[0][1], 3)}

    def _wait_idle(self) -> None:
        """Until no task is unfinished and no Dagster run is in progress (a run that published may still be ending)."""
        started = time.monotonic()
        while time.monotonic() - started < self.dcfg.idle_timeout:
            tasks = _sql(self.url, "bench_chaos_unfinished")
            runs = _sql(self.dg_url, "bench_dagster_count_runs_in_status", {"statuses": list(RUNNING)})
            if tasks[0][0] == 0 and runs[0][0] == 0:
                return
            time.sleep(0.2)
        raise TimeoutError(f"not idle after {self.dcfg.idle_timeout} s")

    # -- operations --------------------------------------------------------------------------------

    def _measure(self, name: str, document_id: str, operation: Callable[[], Any],
                 done: Callable[[Any], Callable[[], bool]], found: Callable[[], set[str]], what: str) -> Any:
        """Wait for idle, run ``operation``, time until ``done(result)()``; record seconds and texts embedded."""
        self._wait_idle()
        if self.dcfg.gap > 0:
            time.sleep(self.rng.uniform(0, self.dcfg.gap))
        self.load.append(os.getloadavg()[0])
        before = self._texts_embedded()
        started = time.monotonic()
        result = operation()
        seconds = self._until(started, what, document_id, done(result), found)
        self._wait_idle()
        texts = self._texts_embedded() - before
        self.seconds[name].append(seconds)
        self.texts[name].append(texts)
        if name != "publish":
            self.runs[name].append(self._run_account(document_id, result.version))
        if not name.endswith("_fast"):
            self.phases[name].append(self._phases(result.task_id))
        status = getattr(result, "status", None)
        if name.endswith("_fast"):
            self.in_process[name] += status == "SUCCEEDED"
        self._note(f"{name} {document_id}: {what} after {seconds:.3f} s, {texts} texts embedded"
                   f"{f' (task {status} when the call returned)' if status else ''}")
        return result

    def _round(self, plain: Any, fast: Any, n: int) -> None:
        from pipelines.domain.metadata import ReadScope

        everything, reader = ReadScope.of(see_all=True), ReadScope.of([READER])
        docs = [("pipeline", plain, f"policy-{n}", *_page(2 * n)), ("fast", fast, f"policy-fast-{n}", *_page(2 * n + 1))]
        for _, _, doc, phrase, data in docs:
            self._measure("publish", doc, lambda: plain.publish(TENANT, doc, data, f"{doc}.md"),
                          lambda _r: lambda: self._modes_with(phrase, doc) == set(MODES),
                          lambda: self._modes_with(phrase, doc), "searchable in every mode")
        for path, publisher, doc, phrase, data in docs:
            meta = {"dept": "finance", "revision": n + 1}

            def changed(result: Any, phrase: str = phrase, doc: str = doc) -> Callable[[], bool]:
                def new(hit: Any) -> bool:
                    return hit.version_number == result.version and hit.metadata == result.metadata
                return lambda: self._modes_with(phrase, doc, reader, new) == set(MODES)

            self._measure(f"metadata_{path}", doc,
                          lambda: publisher.publish(TENANT, doc, data, f"{doc}.md", metadata=meta, allow=[READER]),
                          changed, lambda: self._modes_with(phrase, doc, reader),
                          "searchable with its new metadata in every mode")
        for path, publisher, doc, phrase, _ in docs:
            self._measure(f"delete_{path}", doc, lambda: publisher.delete(TENANT, doc),
                          lambda _r: lambda: not self._modes_with(phrase, doc, everything),
                          lambda: self._modes_with(phrase, doc, everything), "gone from every mode")

    def run(self) -> dict[str, Any]:
        from pipelines.domain.metadata import ReadScope
        from resources.blob_store import BlobStore
        from resources.chunk_copy import FastPublish
        from resources.database import Database
        from resources.embedder import FakeEmbedder
        from resources.publisher import Publisher
        from resources.task_queue import TaskQueue

        root = Path(tempfile.mkdtemp(prefix="kbindex-delete-"))
        self.t0 = time.monotonic()
        report: dict[str, Any] = {"ok": False}
        self.seconds: dict[str, list[float]] = {m: [] for m in MEASURES}
        self.texts: dict[str, list[int]] = {m: [] for m in MEASURES}
        self.in_process = {"delete_fast": 0, "metadata_fast": 0}
        self.runs: dict[str, list[dict[str, Any] | None]] = {m: [] for m in MEASURES}
        self.phases: dict[str, list[dict[str, float] | None]] = {m: [] for m in MEASURES if not m.endswith("_fast")}
        self.load: list[float] = []  # the machine's 1-minute load average as each operation started
        try:
            self._prepare(root)
            self.dagster.start()
            self._note(f"dagster dev answered in {self.dagster.wait_ready():.1f} s")
            self.db = Database(self.url, max_size=2)
            self.embedder = FakeEmbedder(model_name=self.model)  # the provider's vectors, not counted by it
            blobs = BlobStore(str(self.blobs))
            plain = Publisher(self.db, blobs)
            fast = Publisher(self.db, blobs, fast=FastPublish(self.db, TaskQueue(self.db)))
            for n in range(self.dcfg.documents):
                self._round(plain, fast, n)
            everything = ReadScope.of(see_all=True)
            still_found = [doc for n in range(self.dcfg.documents)
                           for doc, (phrase, _) in ((f"policy-{n}", _page(2 * n)), (f"policy-fast-{n}", _page(2 * n + 1)))
                           if self._modes_with(phrase, doc, everything)]  # none comes back once later runs published
            report = {"ok": not still_found, "documents": self.dcfg.documents, "gap_s": self.dcfg.gap,
                      "claim_wait_s": CLAIM_WAIT_SECONDS,  # dagster dev reads the same environment
                      "claim_sensors": CLAIM_SENSORS,
                      **{m: {**summary(self.seconds[m]), "texts_embedded": self.texts[m],
                             **({"run_embed_step": self.runs[m]} if m != "publish" else {}),
                             **({"phases": self.phases[m]} if m in self.phases else {})} for m in MEASURES},
                      "fast_in_process": dict(self.in_process), "found_after_delete": still_found,
                      "load_average_1m": {"cpus": os.cpu_count(), "min": round(min(self.load), 2),
                                          "p50": round(statistics.median(self.load), 2), "max": round(max(self.load), 2)}}
        except Exception as exc:  # noqa: BLE001
            report = {"ok": False, "errors": [f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"],
                      "partial": {m: self.seconds[m] for m in MEASURES}}
        finally:
            if hasattr(self, "db"):
                self.db.close()
            if hasattr(self, "dagster"):
                if not report.get("ok"):
                    report["dagster_log_tail"] = self.dagster.log_tail()
                self.dagster.stop()
            if hasattr(self, "provider"):
                self.provider.stop()
            if hasattr(self, "pg"):
                if self.dcfg.keep:
                    self.out(f"kept {root}")
                else:
                    self.pg.cleanup()
            if not self.dcfg.keep:
                shutil.rmtree(root, ignore_errors=True)
        return report


def targets(report: dict[str, Any]) -> dict[str, bool]:
    """Each path against its issue's target: delete p50 <= 5 s (#29); metadata-only p50 <= 2 s, 0 texts (#30)."""
    out = {}
    for path in ("pipeline", "fast"):
        d, m = report[f"delete_{path}"], report[f"metadata_{path}"]
        out[f"delete_{path}"] = d["p50"] is not None and d["p50"] <= DELETE_TARGET_S
        out[f"metadata_{path}"] = (m["p50"] is not None and m["p50"] <= METADATA_TARGET_S
                                   and sum(m["texts_embedded"]) == 0)
    return out


def format_report(report: dict[str, Any]) -> str:
    if "delete_fast" not in report:
        return "no figures: " + "; ".join(report.get("errors", []))
    names = {
        "publish": "publish -> searchable (run)",
        "delete_pipeline": "delete -> gone (run)",
        "delete_fast": "delete -> gone (fast path)",
        "metadata_pipeline": "metadata-only -> searchable (run)",
        "metadata_fast": "metadata-only -> searchable (fast path)",
    }
    load = report["load_average_1m"]
    lines = [f"idle, one at a time, all of dense, lexical and hybrid; {report['documents']} documents per path; "
             f"a random 0-{report['gap_s']:g} s pause before each; the sensor waits {report['claim_wait_s']:g} s "
             f"per daemon loop for a publish (KBINDEX_CLAIM_WAIT_SECONDS), shared by {report.get('claim_sensors', 1)} claiming "
             f"sensors (KBINDEX_CLAIM_SENSORS); machine load (1 min) {load['min']}-{load['max']} on {load['cpus']} CPUs",
             f"{'measure':<42} {'n':>3} {'p50 s':>7} {'p95 s':>7} {'max s':>7} {'texts embedded':>15}"]
    for m in MEASURES:
        s = report[m]
        lines.append(f"{names[m]:<42} {s['n']:>3} {s['p50']:>7} {s['p95']:>7} {s['max']:>7} {sum(s['texts_embedded']):>15}")
    fast = report["fast_in_process"]
    lines.append(f"fast path finished in the publishing call: deletes {fast['delete_fast']}/{report['delete_fast']['n']}, "
                 f"metadata-only {fast['metadata_fast']}/{report['metadata_fast']['n']} (the rest left to a run)")
    runs = report["metadata_pipeline"]["run_embed_step"]
    copied = sum(1 for r in runs if r and r.get("copied_from") is not None)
    embedded = sum(int(r.get("embedded") or 0) for r in runs if r)
    no_run = {m: sum(1 for r in report[m]["run_embed_step"] if r is None) for m in ("metadata_fast", "delete_fast")}
    lines.append(f"runs' own account (chunk_embeddings metadata): metadata-only through runs copied {copied}/{len(runs)},"
                 f" embedded {embedded} texts; no run at all for {no_run['metadata_fast']}/{report['metadata_fast']['n']}"
                 f" fast metadata-only changes and {no_run['delete_fast']}/{report['delete_fast']['n']} fast deletes")
    for m in ("publish", "delete_pipeline", "metadata_pipeline"):
        phases = [p for p in report[m]["phases"] if p]
        if phases:
            lines.append(f"{names[m]}: commit -> sensor claim p50 {statistics.median(p['to_claim'] for p in phases):.2f} s,"
                         f" claim -> published (run start, work, publish) p50"
                         f" {statistics.median(p['claim_to_done'] for p in phases):.2f} s")
    met = targets(report)
    for path in ("pipeline", "fast"):
        lines.append(f"target delete p50 <= {DELETE_TARGET_S:g} s (#29), {path}: "
                     f"{'met' if met[f'delete_{path}'] else 'MISSED'}")
    for path in ("pipeline", "fast"):
        lines.append(f"target metadata-only p50 <= {METADATA_TARGET_S:g} s with 0 texts embedded (#30), {path}: "
                     f"{'met' if met[f'metadata_{path}'] else 'MISSED'}")
    return "\n".join(lines)


def run_delete(config: DeleteConfig, out: Callable[[str], None] = print) -> dict[str, Any]:
    return DeleteBench(config, out).run()
