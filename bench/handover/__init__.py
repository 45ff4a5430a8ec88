"""Handover bench (issue #28): a burst of versions on busy cores, then what the claim-to-run handover wasted.

``python -m bench.handover [--versions N] [--hog H] [--lease-seconds S] [--timeout T]`` starts the
real ``dagster dev`` (daemon, code server, the claiming sensor) on its own embedded PostgreSQL with
bench.chaos's machinery (``Chaos._prepare``: temporary folder, migrations, the ``fake-384`` profile,
the project's dagster.yaml), without chaos's faults: no kills, stops, restarts or embedding faults.
Then it starts H busy-loop processes (each ends by itself after the timeout, if nobody stops it),
publishes N small generated documents at once, waits with live progress until every task has ended,
stops the busy loops, lets the Dagster runs still live finish (``settle_seconds``), and measures.

Every figure comes from kbindex's ``task_event`` history and Dagster's run and tick records, never
from counters of the code under test. A claim is a ``transition`` event into RUNNING (its ``attempt``
is the lease attempt it grants, its ``lease_owner`` the claiming tick's owner); an adoption is an
event of kind ``run`` (a run took the attempt over from the claim owner and started it).

1. *one-version runs created by takeovers of waiting runs* (target 0): runs of the index job holding
   exactly one version (a ``dagster/partition`` tag, or a key range whose start is its end) whose
   lease came from a waiting takeover: a claim with ``from_status`` RUNNING whose task's previous
   claim (the transition into RUNNING before it) has no ``run`` event between the two, so that lease
   was never adopted by a run. A run's lease is read from its lease tags when it has them, else from
   the claim event of its version's task under the run's claim-owner tag, else from the last
   claim of that task before the run was created.
2. *tasks marked RUN_CRASHED that never started* (target 0): crash-recorder transitions (``from_status``
   RUNNING to RETRY_WAIT, PENDING or DEAD with ``error_code`` RUN_CRASHED; claims that carry an old
   code along are not counted) for an attempt that has no ``run`` event; distinct tasks are the figure.
3. *runs killed while their publish transaction was open* (target 0): index-job runs CANCELED (or
   CANCELING), whatever the canceler, holding an attempt that reached stage ``publish`` under the
   run's own owner (a ``progress`` event with stage publish) and had no later ``transition`` of that
   attempt by that owner. Beside it, with the same target, tasks DEAD with LEASE_ATTEMPTS_EXHAUSTED.
   How many canceled runs carry the message of kbindex's hung-run killer is reported too.
4. *the claiming sensors' ticks* (reported): from ``instance.get_ticks`` of each claiming sensor, the ticks that
   started between the publish and the end of the burst: count, median and max of
   ``end_timestamp - timestamp``, run ids they recorded; beside them the index-job runs Dagster
   created from the publish on (run records) and those per version published.
5. *files left under the artifact store* (target 0): regular files under KBINDEX_ARTIFACTS and
   KBINDEX_HOME/artifacts, counted recursively once the runs settled.
6. the end state: tasks SUCCEEDED, DEAD by code and in any other state (target 0), and bench.chaos's
   own checks through ``Chaos._report``: duplicate chunks, half-visible versions, lost publishes,
   writes from a superseded lease (each 0), and the verifier (``kbindex verify``'s checks) clean.

The run fails (exit 1) on a missed target, a timeout, or an error.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.chaos import PROJECT_ROOT, TERMINAL, Chaos, ChaosConfig, _sql

SENSOR_NAMES = ("claim_index_tasks", *(f"claim_index_tasks_{i}" for i in range(2, 10)))
"""Every claiming sensor the code location may have (KBINDEX_CLAIM_SENSORS; pipelines/claim_window.py)."""
JOB_NAME = "index_versions"
KILLER_MESSAGE = "kbindex: the run lost every lease"
"""The start of the message pipelines/sensors.py ``_terminate`` cancels a hung run with."""
HOG_CODE = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@dataclass
class HandoverConfig:
    versions: int = 1000
    hog: int = 2
    """Busy-loop processes started before the publish and stopped when every task has ended."""
    lease_seconds: float = 60.0
    timeout: float = 3600.0
    """Seconds from the publish until every task must have ended (then the figures, and exit 1)."""
    settle_seconds: float = 180.0
    """After the burst: how long runs still live (a waiting run starting late) may take to finish."""
    tenants: int = 2
    publish_threads: int = 4
    fake_delay: float = 0.05
    """Seconds per fake embedding call (KBINDEX_FAKE_DELAY) of up to ``embed_batch`` texts."""
    embed_batch: int = 64
    run_batch: int = 320
    run_batch_min: int = 12
    max_concurrent_runs: int = 3
    tenant_run_limit: int = 2
    max_waiting_runs: int = 1
    """The product's defaults (dagster.yaml, KBINDEX_RUN_BATCH*, KBINDEX_MAX_WAITING_RUNS)."""
    seed: int = 1
    sensors: tuple[str, ...] = SENSOR_NAMES
    keep: bool = False
    live: bool | None = None
    """A rich progress bar (None: when stdout is a terminal); otherwise a line every ``note_every`` s."""
    note_every: float = 15.0

    def chaos_config(self) -> ChaosConfig:
        return ChaosConfig(
            tasks=self.versions, kills=0, stops=0, pg_restarts=0, seconds_limit=self.timeout,
            lease_seconds=self.lease_seconds, fake_delay=self.fake_delay, embed_batch=self.embed_batch, faults="",
            seed=self.seed, tenants=self.tenants, run_batch=self.run_batch, run_batch_min=self.run_batch_min,
            max_concurrent_runs=self.max_concurrent_runs, tenant_run_limit=self.tenant_run_limit,
            max_waiting_runs=self.max_waiting_runs, keep=self.keep,
        )


# --------------------------------------------------------------------------------------------------
# the other process keeping the cores busy


class Hogs:
    """``n`` busy-loop processes; each exits by itself after ``seconds`` even if this process dies first."""

    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds = n, seconds
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = self.stopped = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", HOG_CODE, str(self.seconds)],
                                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))

    def cpu_seconds(self) -> float:
        from bench.cpu import tree_seconds

        return sum(tree_seconds(p.pid) for p in self.procs if p.poll() is None)

    def stop(self) -> dict[str, Any]:
        """Stop them (by pid); what they ran: wall seconds, and CPU seconds while they still ran."""
        cpu = self.cpu_seconds()
        ended_early = sum(1 for p in self.procs if p.poll() is not None)
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        if self.procs and not self.stopped:
            self.stopped = time.monotonic()
        wall = (self.stopped - self.started) if self.procs else 0.0
        return {"processes": self.n, "seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
                "ended_on_their_own": ended_early}


# --------------------------------------------------------------------------------------------------
# figures, from task_event and Dagster's records (named statements: sql/queries/bench_handover.sql, bench_dagster.sql)


def waiting_takeovers(url: str) -> set[tuple[int, int]]:
    """(task, attempt) of every claim that took over a lease no run had adopted (figure 1)."""
    return {(t, a) for t, a in _sql(url, "bench_handover_waiting_takeovers")}


def crashed_never_started(url: str) -> tuple[int, int]:
    """(events, distinct tasks) of RUN_CRASHED recorded for attempts no run adopted (figure 2)."""
    events, tasks = _sql(url, "bench_handover_crashed_unstarted")[0]
    return int(events), int(tasks)


def open_publishes(url: str, owners: list[str]) -> list[tuple[str, int, int]]:
    """(owner, task, attempt) that these run owners took to stage publish and never moved on (figure 3)."""
    return [(o, t, a) for o, t, a in _sql(url, "bench_handover_open_publishes", {"owners": owners})] if owners else []


def artifact_files(root: Path) -> dict[str, int]:
    """Regular files under each artifact folder the runs may have used (KBINDEX_ARTIFACTS, KBINDEX_HOME/artifacts)."""
    out = {}
    for folder in (root / "artifacts", root / "kbhome" / "artifacts"):
        out[str(folder.relative_to(root))] = sum(1 for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0
    return out


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _leases_of(tags: dict[str, str]) -> list[tuple[int, int]]:
    """The run's lease tags, when the code under test still writes them (decoded by its own helper)."""
    try:
        from resources.dagster_resources import leases_of
    except ImportError:
        return []
    try:
        return list(leases_of(tags))
    except Exception:  # noqa: BLE001 - a tag format the helper no longer reads: fall back to the claims
        return []


def _one_version_key(tags: dict[str, str]) -> str | None:
    """The version's partition key when the run holds exactly one (Dagster's partition tags), else None."""
    if tags.get("dagster/partition"):
        return tags["dagster/partition"]
    start, end = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
    return start if start and start == end else None


def run_leases(tags: dict[str, str], claims: list[tuple[int, int, str | None, float]],
               created: float) -> tuple[list[tuple[int, int]], str]:
    """A run's leases and where they were read: its lease tags; else, among ``claims`` of its version's
    task (task, attempt, owner, epoch seconds; event order), the one under the run's claim-owner
    tag; else the last claim made before the run was created (1 s of clock slack)."""
    leases = _leases_of(tags)
    if leases:
        return leases, "lease tags"
    from resources.dagster_resources import claim_owner_of

    owner = claim_owner_of(tags)
    mine = [c for c in claims if owner and c[2] == owner]
    source = "claim by the run's owner tag"
    if not mine:
        mine = [c for c in claims if c[3] <= created + 1][-1:]
        source = "last claim before the run" if mine else "none found"
    return [(t, a) for t, a, _, _ in mine], source


# --------------------------------------------------------------------------------------------------
# the bench


class Handover(Chaos):
    """bench.chaos's set-up and end checks around one burst on busy cores, without its faults."""

    def __init__(self, config: HandoverConfig, out: Callable[[str], None] = print) -> None:
        super().__init__(config.chaos_config(), out)
        self.hcfg = config
        self.figures: dict[str, Any] = {}

    # -- the burst ---------------------------------------------------------------------------------

    def publish_burst(self) -> float:
        """Publish ``versions`` new documents from a few threads at once; returns the seconds it took."""
        from resources.blob_store import BlobStore
        from resources.database import Database
        from resources.publisher import Publisher

        n = self.hcfg.versions
        docs = [self.docs.new(i) for i in range(1, n + 1)]
        tenants = [self.tenants[i % len(self.tenants)] for i in range(n)]
        db = Database(self.url, max_size=max(1, self.hcfg.publish_threads))
        publisher = Publisher(db, BlobStore(str(self.blobs)))
        started = time.monotonic()

        def one(i: int) -> tuple[str, str, int, int]:
            document_id, data, filename = docs[i]
            result = publisher.publish(tenants[i], document_id, data, filename)
            if not result.created:
                raise RuntimeError(f"publish of new document {tenants[i]}/{document_id} created nothing: {result}")
            return tenants[i], document_id, result.version, result.task_id

        try:
            with ThreadPoolExecutor(max(1, self.hcfg.publish_threads)) as pool:
                self.published = list(pool.map(one, range(n)))
        finally:
            db.close()
        self.c.tasks_created = self.c.new_documents = len(self.published)
        self.publishing_done.set()
        self.faults_done.set()
        return time.monotonic() - started

    def _status(self) -> tuple[Counter, Counter]:
        tasks = self.counts()
        runs = Counter(dict(_sql(self.dg_url, "bench_dagster_job_runs_by_status", {"job": JOB_NAME})))
        return tasks, runs

    def wait_burst(self, started: float) -> tuple[float | None, bool]:
        """Until every task has ended (or the timeout): a rich bar on a terminal, else a line now and then."""
        live = self.hcfg.live if self.hcfg.live is not None else sys.stdout.isatty()
        deadline = started + self.hcfg.timeout
        total = self.hcfg.versions
        progress = bar = None
        if live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            progress = Progress(TextColumn("tasks ended"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("{task.description}"), refresh_per_second=2)
            progress.start()
            bar = progress.add_task("", total=total)
        last_note = 0.0
        try:
            while True:
                if self.abort.is_set():
                    self._note("asked to stop (SIGTERM/SIGINT): measuring without the end of the burst")
                    return None, True
                self.dagster.check_alive()
                try:
                    tasks, runs = self._status()
                except Exception:  # noqa: BLE001 - a database hiccup: try again
                    time.sleep(1)
                    continue
                ended = sum(v for k, v in tasks.items() if k in TERMINAL)
                unfinished = sum(v for k, v in tasks.items() if k not in TERMINAL)
                line = (f"tasks {dict(sorted(tasks.items()))} runs {dict(sorted(runs.items()))}"
                        f" load {os.getloadavg()[0]:.1f}")
                if progress is not None:
                    progress.update(bar, completed=ended, description=line)
                elif time.monotonic() - last_note >= self.hcfg.note_every:
                    last_note = time.monotonic()
                    self._note(f"{ended}/{total} ended; {line}")
                if unfinished == 0 and ended >= total:
                    return time.monotonic(), False
                if time.monotonic() > deadline:
                    self._note(f"timeout: {unfinished} task(s) not ended {self.hcfg.timeout:.0f} s after the publish")
                    return None, True
                time.sleep(2)
        finally:
            if progress is not None:
                progress.stop()

    def settle(self) -> int:
        """Wait (at most ``settle_seconds``) until no index-job run is queued, starting or started; returns those left."""
        deadline = time.monotonic() + self.hcfg.settle_seconds
        while True:
            live = int(_sql(self.dg_url, "bench_dagster_job_runs_live", {"job": JOB_NAME})[0][0])
            if live == 0 or time.monotonic() > deadline or self.abort.is_set():
                return live
            time.sleep(2)

    # -- figures -----------------------------------------------------------------------------------

    def instance(self) -> Any:
        from dagster import DagsterInstance

        from pipelines.cli.dev_command import psycopg2_url

        home = self.dagster.env["DAGSTER_HOME"]
        with _environ(DAGSTER_HOME=home, DAGSTER_PG_URL=psycopg2_url(self.dg_url)):
            return DagsterInstance.from_config(home)

    def measure(self, instance: Any, publish_at: float, burst_end: float) -> dict[str, Any]:
        """Figures 1-5 (see the module docstring); ``publish_at``/``burst_end`` are wall-clock seconds."""
        from dagster import DagsterEventType, RunsFilter

        q = lambda name, p=None: _sql(self.url, name, p)  # noqa: E731
        records = [r for r in instance.get_run_records(RunsFilter(job_name=JOB_NAME))
                   if r.create_timestamp.timestamp() >= publish_at - 1]
        runs_by_status = Counter(r.dagster_run.status.value for r in records)

        # 1. one-version runs whose lease came from a takeover of a never-adopted lease
        takeovers = waiting_takeovers(self.url)
        one_version = [(r, key) for r in records if (key := _one_version_key(r.dagster_run.tags))]
        claims: dict[str, list[tuple[int, int, str | None, float]]] = {}
        keys = sorted({key for _, key in one_version})
        for key, task_id, attempt, owner, at in (q("bench_handover_claims_of_keys", {"keys": keys}) if keys else []):
            claims.setdefault(key, []).append((task_id, attempt, owner, at))
        from_takeover = 0
        examples = []
        lease_sources = Counter()
        for record, key in one_version:
            leases, source = run_leases(record.dagster_run.tags, claims.get(key, []), record.create_timestamp.timestamp())
            lease_sources[source] += 1
            if any(lease in takeovers for lease in leases):
                from_takeover += 1
                if len(examples) < 5:
                    examples.append({"run_id": record.dagster_run.run_id, "key": key, "leases": leases,
                                     "status": record.dagster_run.status.value})

        # 2. RUN_CRASHED for attempts no run started
        crashed_unstarted_events, crashed_unstarted_tasks = crashed_never_started(self.url)
        crashed_events, crashed_tasks = q("bench_handover_crashed_all")[0]

        # 3. canceled runs that held an open publish; tasks DEAD LEASE_ATTEMPTS_EXHAUSTED
        from resources.dagster_resources import run_owner

        canceled = [r.dagster_run for r in records if r.dagster_run.status.value in ("CANCELED", "CANCELING")]
        by_killer = 0
        for run in canceled:
            logs = instance.all_logs(run.run_id, of_type=DagsterEventType.RUN_CANCELED)
            if any(KILLER_MESSAGE in (e.dagster_event.message or "") for e in logs if e.dagster_event):
                by_killer += 1
        owners = {run_owner(run.run_id): run.run_id for run in canceled}
        open_rows = open_publishes(self.url, list(owners))
        killed_in_publish = sorted({owners[o] for o, _, _ in open_rows})
        exhausted = q("bench_handover_attempts_exhausted")[0][0]

        # 4. the claiming sensor's ticks
        ticks = self._ticks(instance, publish_at, burst_end)

        # 5. artifacts
        files = artifact_files(self.root)

        # 6. end state (bench.chaos's checks are added by the caller)
        states = Counter()
        dead_by_code = Counter()
        for status, code, n in q("bench_handover_task_states"):
            states[status] += n
            if status == "DEAD":
                dead_by_code[code or "(none)"] += n
        return {
            "one_version_runs_from_waiting_takeovers": from_takeover,
            "one_version_runs": len(one_version),
            "one_version_lease_source": dict(lease_sources),
            "waiting_takeover_claims": len(takeovers),
            "one_version_takeover_examples": examples,
            "run_crashed_never_started_tasks": crashed_unstarted_tasks,
            "run_crashed_never_started_events": crashed_unstarted_events,
            "run_crashed_tasks_all": crashed_tasks, "run_crashed_events_all": crashed_events,
            "runs_killed_in_publish": len(killed_in_publish),
            "runs_killed_in_publish_ids": killed_in_publish[:10],
            "tasks_left_in_publish_by_canceled_runs": len({(t, a) for _, t, a in open_rows}),
            "runs_canceled": len(canceled), "runs_canceled_by_hung_run_killer": by_killer,
            "dead_lease_attempts_exhausted": exhausted,
            "ticks": ticks,
            "runs_created": len(records),
            "runs_per_version": round(len(records) / max(1, self.hcfg.versions), 4),
            "runs_by_status": dict(sorted(runs_by_status.items())),
            "artifact_files": sum(files.values()), "artifact_files_by_folder": files,
            "tasks_succeeded": states.get("SUCCEEDED", 0),
            "tasks_dead_by_code": dict(sorted(dead_by_code.items())),
            "tasks_other": sum(n for s, n in states.items() if s not in ("SUCCEEDED", "DEAD")),
            "tasks_other_by_status": {s: n for s, n in sorted(states.items()) if s not in ("SUCCEEDED", "DEAD")},
        }

    def _ticks(self, instance: Any, publish_at: float, burst_end: float) -> dict[str, Any]:
        from dagster._core.definitions.run_request import InstigatorType

        states = [s for s in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
                  if s.instigator_name in self.hcfg.sensors]
        if not states:
            return {"error": f"no instigator state for the claiming sensors {self.hcfg.sensors!r}"}
        ticks = [t for s in states for t in instance.get_ticks(s.instigator_origin_id, s.selector_id,
                                                                after=publish_at - 0.001)]
        ticks = [t for t in ticks if publish_at <= t.timestamp <= burst_end]
        durations = sorted(t.end_timestamp - t.timestamp for t in ticks if t.end_timestamp)
        statuses = Counter(t.status.value for t in ticks)
        run_ids = [rid for t in ticks for rid in t.run_ids]
        return {
            "count": len(ticks),
            "median_seconds": round(statistics.median(durations), 3) if durations else None,
            "max_seconds": round(durations[-1], 3) if durations else None,
            "unfinished": len(ticks) - len(durations),
            "by_status": dict(sorted(statuses.items())),
            "runs_requested": len(run_ids),
            "runs_per_version": round(len(run_ids) / max(1, self.hcfg.versions), 4),
        }

    # -- the whole bench ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:  # noqa: C901 - one linear script with its clean-up
        self.root = root = Path(tempfile.mkdtemp(prefix="kbindex-handover-"))
        self.t0 = time.monotonic()
        report: dict[str, Any] = {"config": {"versions": self.hcfg.versions, "hog": self.hcfg.hog,
                                             "lease_seconds": self.hcfg.lease_seconds, "timeout": self.hcfg.timeout},
                                  "code": str(PROJECT_ROOT)}
        hogs = Hogs(self.hcfg.hog, self.hcfg.timeout + self.hcfg.settle_seconds + 120)
        handlers: dict[int, Any] = {}
        try:
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    handlers[sig] = signal.signal(sig, lambda *_: self.abort.set())
            self._prepare(root)
            self.dagster.start()
            ready = self.dagster.wait_ready()
            self._note(f"dagster dev answered in {ready:.1f} s; profile {self.profile} -> {self.model};"
                       f" {self.hcfg.hog} busy loop(s), then {self.hcfg.versions} publishes")
            hogs.start()
            publish_at = time.time()
            started = time.monotonic()
            publish_seconds = self.publish_burst()
            self._note(f"published {len(self.published)} versions in {publish_seconds:.1f} s")
            quiet_at, timed_out = self.wait_burst(started)
            burst_end = time.time()
            report["hog"] = hogs.stop()
            report["publish_seconds"] = round(publish_seconds, 1)
            report["burst_seconds"] = None if quiet_at is None else round(quiet_at - started, 1)
            report["timed_out"] = timed_out
            left = self.settle()
            report["runs_live_after_settle"] = left
            self._note(f"burst over ({'timed out' if timed_out else 'every task ended'});"
                       f" runs still live after settling: {left}; measuring")
            instance = self.instance()
            try:
                self.figures = self.measure(instance, publish_at, burst_end)
            finally:
                instance.dispose()
            report["figures"] = self.figures
            chaos = self._report(started, quiet_at, timed_out)
            report["checks"] = {"must_be_zero": chaos["must_be_zero"], "details": chaos["checks"],
                                "verify": chaos["verify"], "final_states": chaos["final_states"],
                                "transitions": chaos["retries"]["transitions"]}
            report["errors"] = list(self.c.errors)
        except Exception as exc:  # noqa: BLE001 - reported, and the bench fails
            self.c.errors.append(f"bench: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            report["errors"] = list(self.c.errors)
        finally:
            if hogs.procs and not hogs.stopped:
                report.setdefault("hog", hogs.stop())
            if hasattr(self, "dagster"):
                if report.get("errors"):
                    report["dagster_log_tail"] = self.dagster.log_tail()
                self.dagster.stop()
            if hasattr(self, "pg"):
                if self.hcfg.keep:
                    self.out(f"kept {root}")
                else:
                    self.pg.cleanup()
            if not self.hcfg.keep:
                import shutil

                shutil.rmtree(root, ignore_errors=True)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        report["targets"] = targets(report)
        report["ok"] = (not report.get("errors") and not report.get("timed_out", True)
                        and all(row["met"] for row in report["targets"] if row["met"] is not None))
        return report


# --------------------------------------------------------------------------------------------------
# the table


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each figure beside its target: ``met`` is True/False, or None for a figure that is only reported."""
    f = report.get("figures") or {}
    checks = report.get("checks") or {}
    zero = checks.get("must_be_zero") or {}
    ticks = f.get("ticks") or {}
    verify = checks.get("verify") or {}

    def row(name: str, value: Any, target: Any) -> dict[str, Any]:
        met = None if target == "reported" else (value == target if value is not None else False)
        return {"measure": name, "value": value, "target": target, "met": met}

    tick_text = (f"{ticks.get('count')} ticks, median {ticks.get('median_seconds')} s, max {ticks.get('max_seconds')} s,"
                 f" {f.get('runs_created')} runs ({f.get('runs_per_version')}/version)") if f else None
    return [
        row("one-version runs created by takeovers of waiting runs", f.get("one_version_runs_from_waiting_takeovers"), 0),
        row("tasks marked RUN_CRASHED that never started", f.get("run_crashed_never_started_tasks"), 0),
        row("runs killed while their publish transaction was open", f.get("runs_killed_in_publish"), 0),
        row("tasks DEAD LEASE_ATTEMPTS_EXHAUSTED", f.get("dead_lease_attempts_exhausted"), 0),
        row("claiming sensor ticks (burst)", tick_text, "reported"),
        row("files left under the artifact store", f.get("artifact_files"), 0),
        row("tasks neither SUCCEEDED nor DEAD", f.get("tasks_other"), 0),
        row("tasks DEAD (by code)", f.get("tasks_dead_by_code"), "reported"),
        row("duplicates (chunk ordinals, pointed rows)", zero.get("duplicates"), 0),
        row("lost publishes", zero.get("lost_publishes"), 0),
        row("half-visible versions", zero.get("half_visible_versions"), 0),
        row("writes from a superseded lease", zero.get("writes_from_superseded_lease"), 0),
        row("kbindex verify violations", None if not verify else sum(v.get("count", 1) for v in verify.get("violations", [])), 0),
    ]


def format_table(report: dict[str, Any]) -> str:
    rows = report.get("targets") or targets(report)
    width = max(len(r["measure"]) for r in rows)
    lines = [f"{'measure':<{width}}  {'target':>8}  {'':4}  value", "-" * (width + 40)]
    for r in rows:
        mark = {True: "ok", False: "MISS", None: ""}[r["met"]]
        value = r["value"] if not isinstance(r["value"], dict) else (", ".join(f"{k} {v}" for k, v in r["value"].items()) or "none")
        lines.append(f"{r['measure']:<{width}}  {str(r['target']):>8}  {mark:4}  {value}")
    return "\n".join(lines)


def run_handover(config: HandoverConfig, out: Callable[[str], None] = print) -> dict[str, Any]:
    return Handover(config, out).run()


__all__ = ["HandoverConfig", "crashed_never_started", "format_table", "open_publishes", "run_handover", "run_leases",
           "targets", "waiting_takeovers"]
