"""A model migration of 100k versions launched from the Dagster UI, against plain indexing on the same setup.

``python -m bench.scale.migration [--versions 100000] [--plain 23000] [--minutes 6] [--cut 0.9] [--window 2000]``
starts a throwaway PostgreSQL, bulk-loads ``--versions`` indexed versions (bench/scale/corpus.py; their bytes in the blob
store, the active profile on the fake model ``fake-384``) and publishes ``--plain`` fresh documents of
the same kind. Then ``dagster dev`` (webserver, daemon, claiming sensor; dagster.yaml's run slots)
starts and indexes them: **plain indexing**, tasks/s from the first run's start to the last task's end.
Then, as an operator would:

1. ``create_profile`` (what ``kbindex profile create`` calls) makes a shadow profile on ``fake-shadow``
   (a fake salted by its name: other vectors, same cost) and one REINDEX task per current version, in
   one statement: timed;
2. the ``backfill_profile`` job is launched with the UI's own ``LaunchPipelineExecution`` mutation (the
   launchpad): the round trip is timed (target <= 10 s);
3. the time from the mutation to the first indexing run STARTED is measured (target <= 60 s);
4. REINDEX tasks/s over the ``--minutes`` that follow that start, against plain indexing (target >= 0.9).
   The ratio that holds the target times both phases the same way over the same number of versions:
   from the phase's first run's start to the finish of its M-th finished task, M = ``--cut`` (0.9) x
   ``--plain``. Plain indexing's last runs (its wind-down, slots emptying) are left out as REINDEX's are
   (its backlog goes on). The earlier metric (plain to its LAST task, wind-down included, against REINDEX's
   first ``--plain`` tasks; issue #33: unequal cut rules) is printed beside it as "old".
   ``--plain`` must be large against a run: runs are sized by work (~2,340 of these versions each, two at a
   time), and a phase's tasks finish a run at a time, so with the old default of 3,000 REINDEX's 2,700th
   task came with its 4,684th (both first runs end together: ~184 tasks/s, plain's rate) and the ratio
   read 0.58. The default is now as many versions as the REINDEX window covers (23,000 in 6 minutes here;
   2026-12-05, measured 0.93; the README keeps the earlier figures beside it).
   Both insert into an HNSW graph that holds the seeded corpus's chunks (random vectors), each model's
   vectors starting a neighbourhood of their own; an insert may cost more as its neighbourhood fills. The
   bench prints each run's publish step (from its publish announcement to its last task's finish), runs in
   finishing order grouped into windows of at least ``--window`` versions: p50 / p95 per run, seconds per
   320 versions (a full run) and the window's tasks/s, for plain indexing and for REINDEX: that growth is
   measured, not assumed.

With ``--corpus PATH`` (issue #33's real-model round) nothing is seeded: ``--plain`` one-paragraph documents
cut from the shared corpus (bench/scale/small_docs.py's paragraphs) go through plain indexing on the default
profile (int8 MiniLM, through the warm embedding service, as ``kbindex dev`` runs it), then the migration
REINDEXes exactly those versions into a shadow profile on the same model, chunking and lexical analysis.
Profiles never share vectors (resources/embedding_reuse.py), so both phases embed the same texts with the
same model: the same work, timed the same way. Not quite, before 2026-12-07: the same model gives the same texts
the same vectors, and pgvector's HNSW insert stores a vector equal to an existing element's as one more heap TID
of that element, with none of a new element's neighbour updates. Every REINDEX insert took that path (3,000
paragraphs: the chunk inserts 4.7 s against plain's 10.1 s). Between the phases the active profile's vectors
are now stored reflected (v -> -v, the graph rebuilt), where an old model's vectors would be, and the report
counts the REINDEX vectors still equal to an active one (0 for equal work). ``python -m bench.scale.migration
--corpus ../shared/corpus --plain 10000 --minutes 30`` is the 10k round; the window ends early once every
REINDEX task is done. Both phases start from vacuumed, analyzed and checkpointed tables (in both modes).

In both modes the shadow profile copies the active profile's chunking, lexical analyzer, fusion and context,
so a REINDEX writes the same kind of rows as plain indexing (before 2026-12-05 the fake round's shadow
profile took create_profile's defaults, the word-piece analyzer, while the active profile analyzes English
words: unequal lexical work).

The CI-sized rounds are tests/acceptance/test_bench_scale_migration.py (fake models, soak) and
tests/acceptance/test_bench_scale_migration_real_model.py (the real-model round, a dozen documents).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench import exit_on_sigterm
from bench.dagster_dev import LAUNCH_RUN
from bench.scale.corpus import (
    TENANT,
    DagsterUI,
    create_databases,
    document_text,
    reflect_vectors,
    seed_chunks,
    seed_corpus,
    settle,
    write_blobs,
)
from bench.warm_service import warm_embedding_service

SHADOW = "shadow"
SHADOW_MODEL = "fake-shadow"
BACKFILL_JOB = "backfill_profile"
INDEX_JOB = "index_versions"
TARGETS = {"launch_seconds": 10.0, "first_run_seconds": 60.0, "ratio": 0.9}


@dataclass
class Result:
    versions: int
    plain_tasks: int
    plain_seconds: float
    create_seconds: float
    reindex_tasks: int
    launch_seconds: float
    first_run_seconds: float
    window_seconds: float
    reindex_done: int
    reindex_first_seconds: float | None
    """From the first run's start to the end of the migration's ``plain_tasks``-th task (None: not reached)."""
    backfill_run_status: str
    index_runs: int
    plain_runs: dict[str, int]
    retried: dict[str, int]
    """Tasks that took more than one attempt, by task type (lease expiries under load show up here)."""
    cut: int = 0
    """M: both phases are timed to their M-th finished task (``--cut`` x ``--plain``)."""
    plain_cut_seconds: float | None = None
    reindex_cut_seconds: float | None = None
    """From each phase's first run's start to the finish of its M-th task (None: fewer than M finished)."""
    plain_windows: list[dict] | None = None
    reindex_windows: list[dict] | None = None
    """Per window of versions in finishing order: publish-step p50/p95 seconds and tasks/s (``windows``)."""
    models: str = f"fake-384 -> {SHADOW_MODEL}"
    """The active profile's model -> the shadow profile's."""
    equal_vectors: int = 0
    """REINDEX chunks whose vector equals the active profile's for the same chunk (pgvector's cheaper duplicate
    insert: must be 0 for equal work)."""
    settle_seconds: float = 0.0
    """Outside both timed phases: settling the tables before each, and in the real-model round reflecting the
    active profile's vectors and rebuilding the graph before REINDEX."""

    @property
    def plain_rate(self) -> float:
        return self.plain_tasks / self.plain_seconds

    @property
    def reindex_rate(self) -> float:
        return self.reindex_done / self.window_seconds

    @property
    def window_ratio(self) -> float:
        return self.reindex_rate / self.plain_rate

    @property
    def old_ratio(self) -> float:
        """Issue #33's unequal metric, kept for comparison: REINDEX's first ``plain_tasks`` versions (no
        wind-down) against plain indexing to its last task (wind-down included)."""
        if not self.reindex_first_seconds:
            return 0.0
        return (self.plain_tasks / self.reindex_first_seconds) / self.plain_rate

    @property
    def ratio(self) -> float:
        """Both phases over their first ``cut`` finished tasks, from their first run's start: the same
        number of versions, the same cut rule."""
        if not self.reindex_cut_seconds or not self.plain_cut_seconds:
            return 0.0
        return self.plain_cut_seconds / self.reindex_cut_seconds

    def holds(self) -> dict[str, bool]:
        return {"launch_seconds": self.launch_seconds <= TARGETS["launch_seconds"],
                "first_run_seconds": self.first_run_seconds <= TARGETS["first_run_seconds"],
                "ratio": self.ratio >= TARGETS["ratio"]}


def _wait(predicate, timeout: float, what: str, ui: DagsterUI, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        ui.dev.check_alive()
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}\n{ui.dev.log_tail()}")


def _first_start(instance, after: datetime) -> float | None:
    """Start time (epoch s) of the first indexing run created after ``after`` that has started."""
    import dagster as dg

    records = instance.get_run_records(dg.RunsFilter(job_name=INDEX_JOB, created_after=after))
    starts = [r.start_time for r in records if r.start_time]
    return min(starts) if starts else None


def cut_seconds(finished: list[float], start: float, n: int) -> float | None:
    """Seconds from ``start`` to the finish of the ``n``-th task of ``finished`` (epoch seconds, in finishing
    order); None when fewer than ``n`` finished."""
    return finished[n - 1] - start if 0 < n <= len(finished) else None


def windows(rows: list[tuple[float, str | None, float | None]], size: int) -> list[dict]:
    """The publish step of each run (rows: finished epoch s, run, seconds from the run's publish announcement
    to the task's finish; the step lasts until its last task finishes), runs in the order they finished,
    grouped into windows of at least ``size`` versions: the versions and runs of each window, p50 / p95 of
    its runs' publish seconds, seconds per 320 versions (the runs' publish seconds over their versions), and
    tasks/s from the previous window's last finish to this one's (the first: from its first finish)."""
    runs: dict[str | None, dict] = {}
    for finished, owner, publish in rows:
        run = runs.setdefault(owner, {"versions": 0, "publish": 0.0, "last": finished})
        run["versions"] += 1
        run["publish"] = max(run["publish"], publish or 0.0)
        run["last"] = max(run["last"], finished)
    ordered = sorted(runs.values(), key=lambda r: r["last"])
    out: list[dict] = []
    part: list[dict] = []
    done, previous = 0, rows[0][0] if rows else 0.0
    for i, run in enumerate(ordered):
        part.append(run)
        if sum(r["versions"] for r in part) < size and i < len(ordered) - 1:
            continue
        versions = sum(r["versions"] for r in part)
        publish = sorted(r["publish"] for r in part)
        span = part[-1]["last"] - previous
        out.append({"from": done + 1, "to": done + versions, "runs": len(part),
                    "publish_p50": percentile(publish, 0.5), "publish_p95": percentile(publish, 0.95),
                    "seconds_per_320": round(320 * sum(publish) / versions, 2),
                    "tasks_per_second": round(versions / span, 2) if span > 0 else None})
        done, previous, part = done + versions, part[-1]["last"], []
    return out


def percentile(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list (None if empty)."""
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))], 3)


def phase_rows(db, profile: str, task_type: str, prefix: str, until: float) -> list[tuple[float, str | None, float | None]]:
    return [(float(r["finished"]), r["owner"], None if r["publish_seconds"] is None else float(r["publish_seconds"]))
            for r in db.fetch_all("bench_migration_finished_tasks",
                                  {"profile": profile, "task_type": task_type, "prefix": prefix, "until": until})]


def launch_backfill_job(ui: DagsterUI, profile: str) -> tuple[str, float]:
    """The launchpad of ``backfill_profile``: the UI's LaunchPipelineExecution mutation; (run id, seconds)."""
    params = {
        "mode": "default",
        "executionMetadata": {"tags": []},
        "runConfigData": json.dumps({"ops": {"request_profile_backfill": {"config": {"profile": profile}}}}),
        "selector": {**ui.repository_selector(), "pipelineName": BACKFILL_JOB},
    }
    data, _, seconds = ui.post(LAUNCH_RUN, {"executionParams": params})
    out = data["launchPipelineExecution"]
    if out["__typename"] != "LaunchRunSuccess":
        raise RuntimeError(f"launch failed: {out}")
    return out["run"]["id"], seconds


def run(admin_url: str, workdir: Path, versions: int, plain: int, minutes: float, log_to: Path | None = None,
        lease_seconds: float = 300, cut: float = 0.9, window_versions: int = 1000,
        documents: list[tuple[str, bytes]] | None = None) -> Result:
    """The bench on a scratch server. ``documents``: the real-model round (module docstring): these documents
    are the plain phase (``plain`` is ignored) on the default profile's own model, and nothing is seeded."""
    import dagster as dg

    from pipelines.domain.lexical import LexicalParams
    from resources.blob_store import BlobStore
    from resources.database import Database
    from resources.local_postgres import with_database
    from resources.migrations import migrate
    from resources.profiles import create_profile
    from resources.publisher import Publisher

    if documents is not None:
        if versions:
            raise ValueError("the real-model round seeds nothing: pass versions=0 with documents")
        plain = len(documents)

    kb, dg_db = "mig_kb", "mig_dg"
    create_databases(admin_url, kb, dg_db)
    kb_url = with_database(admin_url, kb)
    migrate(kb_url)
    blobs = str(workdir / "blobs")
    env = {"KBINDEX_DATABASE_URL": kb_url, "KBINDEX_HOME": str(workdir / "home"), "KBINDEX_BLOB_URL": blobs,
           "KBINDEX_ARTIFACTS": str(workdir / "artifacts"), "KBINDEX_LEASE_SECONDS": str(lease_seconds)}
    os.environ.update(env)
    if documents is not None:  # the warm embedding service, as `kbindex dev` runs it; no run embeds by itself
        env.update({"KBINDEX_EMBED_SERVICE": env["KBINDEX_HOME"], "KBINDEX_EMBED_SERVICE_FALLBACK": "none"})
    db = Database(kb_url)
    ui = DagsterUI(workdir, with_database(admin_url, dg_db), env)
    services = ExitStack()
    try:
        publisher = Publisher(db, BlobStore(blobs))
        if documents is None:
            db.execute("bench_corpus_set_active_model", {"model": "fake-384"})
            print(f"seeding {versions:,} indexed versions and their blobs ...", flush=True)
            seeded = seed_corpus(db, versions, progress=versions >= 200_000)
            chunked = seed_chunks(kb_url, versions)
            written = write_blobs(blobs, 1, versions)
            print(f"  {seeded:.0f} s (SQL), {chunked:.0f} s (a chunk each and the HNSW graph), {written:.0f} s (blobs)",
                  flush=True)
            for i in range(versions + 1, versions + plain + 1):  # the same kind of document, fresh
                publisher.publish(TENANT, f"fresh-{i}", document_text(i), f"fresh-{i}.txt")
        else:
            services.enter_context(warm_embedding_service(env["KBINDEX_HOME"], {**os.environ, **env},
                                                          log=workdir / "embedder.log"))
            for i, (name, body) in enumerate(documents, 1):
                publisher.publish(TENANT, f"fresh-{i}", body, name)
        settled = settle(kb_url)  # both phases start from vacuumed, analyzed, checkpointed tables
        active_profile = db.fetch_one("index_profile_active")
        instance = ui.open_instance()
        began = datetime.now(UTC)
        print(f"dagster dev answered in {ui.start():.1f} s; plain indexing of {plain:,} fresh publishes ...", flush=True)
        # Both phases add keys; past the 30,000 cap its sensor would start prune runs in one phase only.
        assert ui.stop_sensor("prune_lineage_keys_when_due") == "STOPPED"
        _wait(lambda: db.fetch_one("bench_migration_all_succeeded")["done"], 3600, "plain indexing", ui)
        first = _first_start(instance, began)
        last = db.fetch_one("bench_migration_last_finished", {"prefix": "fresh-"})["last"]
        plain_seconds = float(last) - first
        active = db.fetch_one("index_profile_active")["name"]
        plain_rows = phase_rows(db, active, "INDEX", "fresh-", float(last))
        m = max(1, int(cut * plain))
        # A run records its success a moment after its last task: count the plain runs once they are done.
        unfinished = dg.RunsFilter(job_name=INDEX_JOB, statuses=[dg.DagsterRunStatus.QUEUED,
                                   dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                                   dg.DagsterRunStatus.STARTED])
        _wait(lambda: not instance.get_run_records(unfinished, limit=1), 120, "the plain runs to finish", ui)
        plain_runs: dict[str, int] = {}
        for record in instance.get_run_records(dg.RunsFilter(job_name=INDEX_JOB)):
            plain_runs[record.dagster_run.status.value] = plain_runs.get(record.dagster_run.status.value, 0) + 1

        if documents is not None:  # the same model embeds the same texts to the same vectors: move them aside
            settled += reflect_vectors(kb_url, active)
            print(f"the active profile's vectors reflected, the graph rebuilt: {settled:.1f} s outside the phases",
                  flush=True)
        else:
            settled += settle(kb_url)
        started = time.perf_counter()
        # The same chunking, analysis, fusion and context as the active profile: the same rows to write.
        created = create_profile(db, SHADOW, model=SHADOW_MODEL if documents is None else active_profile["model"],
                                 chunk_tokens=active_profile["chunk_tokens"], overlap=active_profile["chunk_overlap"],
                                 lexical=LexicalParams.of(active_profile), context=active_profile["embed_context"])
        create_seconds = time.perf_counter() - started
        print(f"create_profile: {created['reindex_tasks']:,} REINDEX tasks in {create_seconds:.2f} s", flush=True)

        launched_at = datetime.now(UTC)
        run_id, launch_seconds = launch_backfill_job(ui, SHADOW)
        first_start = _wait(lambda: _first_start(instance, launched_at), 600, "the first backfill run to start",
                            ui, interval=0.2)
        first_run_seconds = first_start - launched_at.timestamp()
        print(f"launched in {launch_seconds:.2f} s; first indexing run started after {first_run_seconds:.1f} s; "
              f"measuring {minutes:g} min ...", flush=True)
        window_end = first_start + minutes * 60
        while time.time() < window_end and db.fetch_one("bench_migration_profile_unfinished",
                                                        {"profile": SHADOW})["unfinished"]:
            ui.dev.check_alive()
            time.sleep(min(1.0, max(0.0, window_end - time.time())))
        # Measured like plain indexing: from the first run's start to the end of the last task finished
        # (here, within the window), so the runs cut off by the window's end count neither their tasks
        # nor their time.
        row = db.fetch_one("bench_migration_window_done", {"profile": SHADOW, "until": first_start + minutes * 60})
        done, last = row["done"], row["last"]
        window = float(last) - first_start if last is not None else minutes * 60
        nth = db.fetch_one("bench_migration_nth_finished", {"profile": SHADOW, "n": plain})
        first_seconds = nth["finished"] - first_start if nth else None
        reindex_rows = phase_rows(db, SHADOW, "REINDEX", "", first_start + minutes * 60)
        equal = db.fetch_one("bench_migration_equal_vectors", {"profile": SHADOW})["equal"]
        backfill_run = instance.get_run_by_id(run_id)
        runs = instance.get_run_records(dg.RunsFilter(job_name=INDEX_JOB, created_after=launched_at))
        retried = {r["task_type"]: int(r["tasks"]) for r in db.fetch_all("bench_corpus_retried")}
        return Result(versions, plain, plain_seconds, create_seconds, int(created["reindex_tasks"]),
                      launch_seconds, first_run_seconds, window, int(done), first_seconds,
                      backfill_run.status.value if backfill_run else "missing", len(runs), plain_runs, retried,
                      cut=m, plain_cut_seconds=cut_seconds([row[0] for row in plain_rows], first, m),
                      reindex_cut_seconds=cut_seconds([row[0] for row in reindex_rows], first_start, m),
                      plain_windows=windows(plain_rows, window_versions),
                      reindex_windows=windows(reindex_rows, window_versions),
                      models=f"{active_profile['model']} -> {created['model']}", equal_vectors=int(equal),
                      settle_seconds=settled)
    finally:
        db.close()
        if log_to is not None and ui.dev.log_path.exists():
            log_to.write_bytes(ui.dev.log_path.read_bytes())
        ui.stop()
        services.close()


def report(r: Result) -> bool:
    holds = r.holds()

    def mark(key: str) -> str:
        return "ok" if holds[key] else "MISSED"

    print(f"\nmigration of {r.reindex_tasks:,} versions ({r.versions:,} seeded + {r.plain_tasks:,} fresh), "
          f"models {r.models}, dagster.yaml run slots")
    print(f"  create_profile (REINDEX tasks, one statement)   {r.create_seconds:8.2f} s")
    print(f"  launch mutation round trip                     {r.launch_seconds:8.2f} s   target <= 10 s  {mark('launch_seconds')}")
    print(f"  mutation -> first indexing run STARTED         {r.first_run_seconds:8.1f} s   target <= 60 s  {mark('first_run_seconds')}")
    def rate(n: int, seconds: float | None) -> str:
        return f"{n / seconds:8.1f} tasks/s over {seconds:.0f} s" if seconds else "     not reached"

    print(f"  plain, first {r.cut:,} of {r.plain_tasks:,} finished             {rate(r.cut, r.plain_cut_seconds)}")
    print(f"  REINDEX, first {r.cut:,} finished                   {rate(r.cut, r.reindex_cut_seconds)}")
    print(f"  ratio, both to their {r.cut:,}-th task             {r.ratio:8.2f}     target >= 0.9   {mark('ratio')}")
    print(f"  old: plain to its last task (wind-down incl.)  {r.plain_rate:8.1f} tasks/s over {r.plain_seconds:.0f} s")
    print(f"  old: REINDEX, its first {r.plain_tasks:,} versions         {rate(r.plain_tasks, r.reindex_first_seconds)}")
    print(f"  old ratio (unequal cut rules, issue #33)       {r.old_ratio:8.2f}")
    print(f"  REINDEX, first {r.window_seconds:.0f} s                         {r.reindex_rate:8.1f} tasks/s "
          f"({r.reindex_done:,} done, {r.index_runs} runs): {r.window_ratio:.2f} of plain")
    print(f"  REINDEX vectors equal to the active profile's (cheaper duplicate graph inserts; 0 = equal work): "
          f"{r.equal_vectors:,}; tables settled outside the phases in {r.settle_seconds:.1f} s")
    print(f"  backfill_profile run: {r.backfill_run_status}; plain runs by status: {r.plain_runs}; "
          f"tasks retried (attempts > 1): {r.retried or 'none'}")
    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    for label, rows in (("plain", r.plain_windows), ("REINDEX", r.reindex_windows)):
        print(f"  {label}, runs in finishing order, per window of versions: runs, publish step s per run p50 / p95,"
              f" publish s per 320 versions, tasks/s")
        for w in rows or []:
            print(f"    {w['from']:>7,}-{w['to']:<7,} {w['runs']:>4} {num(w['publish_p50']):>7} / {num(w['publish_p95']):<7}"
                  f" {num(w['seconds_per_320']):>7} {num(w['tasks_per_second']):>8}")
    return all(holds.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=100_000, help="indexed versions to migrate")
    parser.add_argument("--plain", type=int, default=23_000,
                        help="fresh publishes for the plain-indexing rate: as many as the REINDEX window covers")
    parser.add_argument("--minutes", type=float, default=6.0, help="REINDEX throughput window after the first run starts")
    parser.add_argument("--lease-seconds", type=float, default=300,
                        help="KBINDEX_LEASE_SECONDS for both phases: on a loaded machine runs can take longer than "
                             "the default 60 s to start, and then lose their leases (measured here: load 15-22 on 2 cores)")
    parser.add_argument("--log", type=Path, help="keep a copy of the dagster dev log here")
    parser.add_argument("--cut", type=float, default=0.9,
                        help="both phases are timed to their (cut x --plain)-th finished task")
    parser.add_argument("--window", type=int, default=2000, help="versions per window of the publish timings")
    parser.add_argument("--corpus", type=Path, default=None,
                        help="the real-model round: --plain paragraphs of this corpus, nothing seeded (--versions ignored)")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from resources.local_postgres import temporary_server

    documents = None
    if args.corpus is not None:
        from bench import share_built_models
        from bench.scale.small_docs import paragraph_documents

        if not (args.corpus / "en-sotu").is_dir():
            print(f"bench.scale.migration --corpus skipped: corpus {args.corpus} not found")
            return 0
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        share_built_models()
        documents = paragraph_documents(args.corpus, args.plain)
        args.versions = 0

    with temporary_server("kbindex-bench-migration-", external_env="KBINDEX_BENCH_DATABASE_URL") as admin_url, \
            tempfile.TemporaryDirectory(prefix="kb-scale-mig-") as tmp:
        result = run(admin_url, Path(tmp), args.versions, args.plain, args.minutes, args.log, args.lease_seconds,
                     args.cut, args.window, documents)
        ok = report(result)  # before the clean-up: deleting 10^5 blobs takes minutes on a loaded machine
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
