"""``python -m bench.scale.runs --daemon``: run overhead with runs the Dagster daemon creates and launches.

The in-process mode (bench/scale/runs.py) times a tick and ``dg.materialize``; it leaves out what the daemon
does per run: create it from the sensor's request (the README says Dagster still lists every live key there),
queue, dequeue and launch it. Here, for each ``--keys`` count, fresh databases on one throwaway PostgreSQL
(fake embedder: the figures are Dagster's and kbindex's overhead, not the model's) get that many partition keys
seeded into Dagster's storage, as in the in-process mode, and a real ``dagster dev`` with the project's
dagster.yaml, sensors, run launcher and event batching (as ``kbindex dev`` sets it). All of them run at once,
and batches alternate between them: first ``--warmup`` discarded batches on each, then ``--batches`` rounds,
each running one batch on every key count in a shuffled order (``--seed``). So every size is measured under
the same machine load (the other stacks idle meanwhile, the same for all), instead of one ``dagster dev`` per
size one after the other.

A batch publishes ``--versions`` fresh documents and waits until all their index tasks are SUCCEEDED. Per
batch: publish -> last SUCCEEDED transition seconds, and from Dagster's ``runs`` table and run events each index
run's claim -> create (kbindex's claim event to the run record: the rest of the tick, the daemon's run creation
up to the record), create -> start (the launch latency: split into the daemon's work after the record until the
run is queued, i.e. its planned events, the queue until dequeued, and the launch until the run process's
RUN_START) and start -> end, plus the Dagster tree's CPU seconds (the daemon's apart: CPU, unlike wall time,
does not follow the other work on the machine). The wake
grace of the claiming sensor is raised to ``--claim-grace`` seconds so that one tick claims the whole batch
(the product's 0.1 s split a batch into runs of uneven sizes at random); each batch's runs are listed.

The target (issue #33): throughput at 100k keys / at 1k >= 0.9, i.e. median seconds at 1k / median at 100k.
The summary prints, per figure, the 100k/1k ratio of medians (>1: slower at 100k) and its inverse (the
target's). CI runs a small round: tests/integration/test_bench_scale_runs_daemon.py.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psycopg

from bench.chaos import _sql

JOB_NAME = "index_versions"
DAEMON = "daemon"
LIVE_STATUSES = ["QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"]
TARGET = 0.9


@dataclass
class RunSample:
    """One index run of a batch, from Dagster's ``runs`` table and kbindex's claim events (seconds)."""

    versions: int
    claim_to_create: float
    create_to_start: float
    start_to_end: float
    status: str
    create_to_enqueue: float
    """Of create -> start: the rest of the daemon's run creation after the run record (its planned events) until
    the run is queued (its RUN_ENQUEUED event)."""
    enqueue_to_dequeue: float
    """Of create -> start: queued, until the run coordinator dequeues it (its RUN_STARTING event)."""
    dequeue_to_start: float
    """The rest: the launch, the run process's start and its set-up until its RUN_START event."""


@dataclass
class Batch:
    label: str
    keys: int
    seconds: float
    """Publish start -> the last of the batch's tasks SUCCEEDED (its transition event)."""
    publish_seconds: float
    to_claim: float
    """Publish start -> the first claim of the batch's tasks (the sensor's wait: no key count in it)."""
    claim_to_done: float
    """The first claim -> the last SUCCEEDED: the batch without the sensor's wait."""
    succeeded: int
    versions: int
    runs: list[RunSample]
    daemon_cpu: float
    dagster_cpu: float
    other_runs: list[str] = field(default_factory=list)
    """Runs of other jobs created meanwhile (an hourly schedule firing), by job name: noise to know of."""

    @property
    def warmup(self) -> bool:
        return self.label.startswith("w")


class Stack:
    """Fresh kbindex and Dagster databases with ``keys`` seeded partition keys, and a ``dagster dev`` on them."""

    def __init__(self, admin_url: str, keys: int, root: Path, claim_grace: float) -> None:
        self.admin_url, self.keys, self.root, self.claim_grace = admin_url, keys, root, claim_grace
        self.last_run_row = 0
        """The id (Dagster's runs table) of the last run a batch has measured."""
        self.dagster: Any = None
        self.db: Any = None

    def prepare(self) -> float:
        """Create the databases, seed the keys; returns the seconds the seeding took."""
        import dagster as dg

        from bench import fresh_fake_model_databases
        from bench.scale.runs import seed_partition_keys
        from resources.local_postgres import with_database

        self.root.mkdir(parents=True, exist_ok=True)
        kb, dgname = f"kbd_{self.keys}", f"dgd_{self.keys}"
        self.kb_url, dagster_url = fresh_fake_model_databases(self.admin_url, kb, dgname, self.root, str(self.keys))
        self.dg_sql_url = with_database(self.admin_url, dgname)
        # fresh_fake_model_databases points this process's KBINDEX_* at the last stack prepared: keep this one's.
        self.env = {name: os.environ[name] for name in ("KBINDEX_DATABASE_URL", "KBINDEX_BLOB_URL", "KBINDEX_ARTIFACTS")}
        self.env["KBINDEX_HOME"] = str(self.root / "home")
        self.dagster_url = dagster_url
        with dg.instance_for_test(overrides={"storage": {"postgres": {"postgres_url": dagster_url}}}) as instance:
            return seed_partition_keys(instance, self.keys)

    def start(self) -> None:
        from bench.dagster_dev import DagsterDev, dagster_yaml
        from resources.blob_store import BlobStore
        from resources.database import Database
        from resources.publisher import Publisher

        home = self.root / "dagster_home"
        home.mkdir(exist_ok=True)
        (home / "dagster.yaml").write_text(dagster_yaml())  # the project's, with the warm launcher unless told otherwise
        env = dict(os.environ)  # with kbindex dev's event batching, as DagsterDev sets it
        env.update(self.env, DAGSTER_HOME=str(home), DAGSTER_PG_URL=self.dagster_url, HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", KBINDEX_CLAIM_WAKE_GRACE_SECONDS=str(self.claim_grace))
        env.pop("KBINDEX_FAULT_SENSOR_AFTER_CLAIM", None)
        self.dagster = DagsterDev(self.root, env)
        self.dagster.start()
        self.db = Database(self.kb_url, max_size=2)
        self.publisher = Publisher(self.db, BlobStore(self.env["KBINDEX_BLOB_URL"]))

    def stop(self) -> None:
        """Stop ``dagster dev`` and drop the two databases (the server may be an external one)."""
        from psycopg import sql as pgsql

        if self.db is not None:
            self.db.close()
            self.db = None
        if self.dagster is not None:
            self.dagster.stop()
            self.dagster = None
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for name in (f"kbd_{self.keys}", f"dgd_{self.keys}"):
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))

    def _cpu(self) -> dict[str, float]:
        from bench.cpu import tree_parts

        return tree_parts(self.dagster.proc.pid) if self.dagster.proc is not None else {}

    def batch(self, label: str, versions: int, timeout: float, note: Callable[[str], None]) -> Batch:
        """Publish ``versions`` fresh documents, wait until their tasks SUCCEEDED and their runs ended, measure."""
        cpu_before = self._cpu()
        started = time.time()
        task_ids = []
        for i in range(versions):
            body = "\n\n".join(f"Doc {label}-{i} paragraph {p}: refunds, travel and invoices." for p in range(6))
            name = f"fresh-{label}-{i}.txt"
            task_ids.append(self.publisher.publish("acme", name, body.encode(), name).task_id)
        publish_seconds = time.time() - started
        deadline, last_note = time.monotonic() + timeout, time.monotonic()
        while True:
            self.dagster.check_alive()
            states = dict(_sql(self.kb_url, "bench_runs_daemon_task_states", {"task_ids": task_ids}))
            live = _sql(self.dg_sql_url, "bench_dagster_count_job_runs_in_status",
                        {"job": JOB_NAME, "statuses": LIVE_STATUSES})[0][0]
            ended = sum(n for s, n in states.items() if s in ("SUCCEEDED", "DEAD", "CANCELLED"))
            if ended == versions and live == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.keys:,} keys, batch {label}: tasks {states}, {live} run(s) live "
                                   f"{timeout:.0f} s after the publish\n{self.dagster.log_tail()}")
            if time.monotonic() - last_note > 10:
                last_note = time.monotonic()
                note(f"    {self.keys:>9,} {label}: tasks {dict(sorted(states.items()))}, {live} run(s) live, "
                     f"{time.time() - started:.0f} s")
            time.sleep(0.5)
        cpu_after = self._cpu()
        done = _sql(self.kb_url, "bench_runs_daemon_last_success", {"task_ids": task_ids})[0][0] or time.time()
        runs, others, first_claim = self._runs(task_ids)
        first_claim = first_claim or started
        return Batch(label=label, keys=self.keys, seconds=done - started, publish_seconds=publish_seconds,
                     to_claim=first_claim - started, claim_to_done=done - first_claim,
                     succeeded=int(states.get("SUCCEEDED", 0)), versions=versions, runs=runs,
                     daemon_cpu=cpu_after.get(DAEMON, 0.0) - cpu_before.get(DAEMON, 0.0),
                     dagster_cpu=sum(cpu_after.values()) - sum(cpu_before.values()), other_runs=others)

    def _runs(self, task_ids: list[int]) -> tuple[list[RunSample], list[str], float | None]:
        """The runs created since the last batch (index runs measured, other jobs' runs named) and the time of
        the first claim of the batch's tasks."""
        from resources.dagster_resources import leases_of

        # create_timestamp: CURRENT_TIMESTAMP into a timestamp without time zone, so in the session's zone;
        # event_logs.timestamp: naive UTC, as Dagster writes it.
        rows = _sql(self.dg_sql_url, "bench_dagster_runs_since", {"after": self.last_run_row})
        new = [r[1:] for r in rows]  # only the runs created since the last batch: not every run of the bench
        self.last_run_row = max((r[0] for r in rows), default=self.last_run_row)
        others = [r[1] for r in new if r[1] != JOB_NAME]
        index_runs = [r for r in new if r[1] == JOB_NAME]
        ids = [r[0] for r in index_runs]
        tags: dict[str, dict[str, str]] = {}
        events: dict[tuple[str, str], float] = {}
        if ids:
            for run_id, key, value in _sql(self.dg_sql_url, "bench_dagster_tags_of_runs", {"run_ids": ids}):
                tags.setdefault(run_id, {})[key] = value
            events = {(run_id, kind): at for run_id, kind, at in _sql(
                self.dg_sql_url, "bench_dagster_run_queue_events", {"run_ids": ids})}
        claims = {(t, a): at for t, a, at in _sql(self.kb_url, "bench_runs_daemon_claims", {"task_ids": task_ids})}
        nan = float("nan")
        samples = []
        for run_id, _, status, created, start, end in index_runs:
            leases = leases_of(tags.get(run_id))
            claimed = [claims[lease] for lease in leases if lease in claims]
            queued, out = events.get((run_id, "PIPELINE_ENQUEUED")), events.get((run_id, "PIPELINE_STARTING"))
            samples.append(RunSample(
                versions=len(leases), status=status,
                claim_to_create=created - min(claimed) if claimed else nan,
                create_to_start=start - created if start else nan,
                start_to_end=end - start if start and end else nan,
                create_to_enqueue=queued - created if queued else nan,
                enqueue_to_dequeue=out - queued if out and queued else nan,
                dequeue_to_start=start - out if start and out else nan))
        return samples, others, min(claims.values(), default=None)


def _stop_all(stacks: list[Stack]) -> None:
    """Stop every stack at once (a ``dagster dev`` may take up to 30 s to stop), then raise the first error."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, len(stacks))) as pool:
        futures = [pool.submit(stack.stop) for stack in stacks]
    for future in futures:
        future.result()


def _sigterm_held_while(stop: ExitStack, register: Callable[[], None]) -> None:
    """Run ``register`` (it adds clean-up callbacks to ``stop``) so that SIGTERM is ignored while they run, and
    the handler restored after them: a kill that arrived while a ``dagster dev`` was stopping left it running,
    orphaned, with its children."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        register()
        return
    stop.callback(signal.signal, signal.SIGTERM, signal.getsignal(signal.SIGTERM))
    register()
    stop.callback(signal.signal, signal.SIGTERM, signal.SIG_IGN)  # the first callback to run


def schedule(counts: list[int], batches: int, warmup: int, seed: int) -> list[tuple[str, int]]:
    """(label, keys) of every batch in the order run: ``warmup`` rounds over every count (in the order given),
    then ``batches`` rounds, each over every count in a shuffled order."""
    rng = random.Random(seed)
    plan = [(f"w{w}", keys) for w in range(warmup) for keys in counts]
    for b in range(batches):
        order = list(counts)
        rng.shuffle(order)
        plan += [(f"b{b}", keys) for keys in order]
    return plan


def run_daemon(admin_url: str, counts: list[int], versions: int, batches: int, warmup: int, seed: int,
               workdir: Path, *, claim_grace: float = 1.0, timeout: float = 300.0,
               note: Callable[[str], None] = print) -> list[Batch]:
    """Every batch of the plan (``schedule``), warm-ups included, on one stack per key count."""
    plan = schedule(counts, batches, warmup, seed)
    note("order: " + ", ".join(f"{label}:{keys:,}" for label, keys in plan))
    stacks = {keys: Stack(admin_url, keys, workdir / f"keys-{keys}", claim_grace) for keys in counts}
    out: list[Batch] = []
    with ExitStack() as stop:
        _sigterm_held_while(stop, lambda: stop.callback(_stop_all, list(stacks.values())))
        for keys, stack in stacks.items():
            seeded = stack.prepare()
            note(f"{keys:,} keys seeded into Dagster's storage in {seeded:.1f} s")
        for stack in stacks.values():
            stack.start()
        for keys, stack in stacks.items():
            note(f"dagster dev on {keys:,} keys answered in {stack.dagster.wait_ready():.1f} s")
        for label, keys in plan:
            note(f"batch {label} on {keys:,} keys: publishing {versions} versions ...")
            batch = stacks[keys].batch(label, versions, timeout, note)
            out.append(batch)
            note("  " + sample_line(batch))
    return out


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def sample_line(b: Batch) -> str:
    runs = b.runs
    return (f"{b.label:>4} {b.keys:>9,} batch {b.seconds:6.2f} s = to claim {b.to_claim:.2f} + claim->done "
            f"{b.claim_to_done:.2f} (publish {b.publish_seconds:.2f}) ok {b.succeeded}/{b.versions} | runs {len(runs)}"
            f" [versions {' '.join(str(r.versions) for r in runs)}]"
            f" claim->create {_fmt([r.claim_to_create for r in runs])}"
            f" create->start {_fmt([r.create_to_start for r in runs])}"
            f" (to queue {_fmt([r.create_to_enqueue for r in runs])}"
            f" + queued {_fmt([r.enqueue_to_dequeue for r in runs])}"
            f" + launch {_fmt([r.dequeue_to_start for r in runs])})"
            f" start->end {_fmt([r.start_to_end for r in runs])}"
            f" | CPU s daemon {b.daemon_cpu:.2f} Dagster {b.dagster_cpu:.2f}"
            + (" (warm-up, not counted)" if b.warmup else "")
            + (f" other runs: {', '.join(b.other_runs)}" if b.other_runs else ""))


FIGURES: list[tuple[str, Callable[[Batch], list[float]]]] = [
    ("batch s (publish -> all succeeded)", lambda b: [b.seconds]),
    ("  publish -> first claim s", lambda b: [b.to_claim]),
    ("  first claim -> all succeeded s", lambda b: [b.claim_to_done]),
    ("run: claim -> created s", lambda b: [r.claim_to_create for r in b.runs]),
    ("run: created -> started s (launch)", lambda b: [r.create_to_start for r in b.runs]),
    ("  created -> enqueued s (to queue)", lambda b: [r.create_to_enqueue for r in b.runs]),
    ("  enqueued -> dequeued s (queued)", lambda b: [r.enqueue_to_dequeue for r in b.runs]),
    ("  dequeued -> started s (launched)", lambda b: [r.dequeue_to_start for r in b.runs]),
    ("run: started -> ended s", lambda b: [r.start_to_end for r in b.runs]),
    ("daemon CPU s per batch", lambda b: [b.daemon_cpu]),
    ("Dagster tree CPU s per batch", lambda b: [b.dagster_cpu]),
]


def medians(batches: list[Batch], counts: list[int]) -> dict[str, dict[int, tuple[float, float, float, int]]]:
    """Per figure and key count: (median, min, max, samples) over the measured batches (warm-ups left out)."""
    out: dict[str, dict[int, tuple[float, float, float, int]]] = {}
    for name, values in FIGURES:
        for keys in counts:
            xs = [x for b in batches if b.keys == keys and not b.warmup for x in values(b) if x == x]  # x == x: not NaN
            if xs:
                out.setdefault(name, {})[keys] = (statistics.median(xs), min(xs), max(xs), len(xs))
    return out


def summary(batches: list[Batch], counts: list[int]) -> list[str]:
    """Every sample, then per figure and key count median [min..max] (n) and the ratios of medians to the
    smallest count: largest/smallest (time grows > 1) and smallest/largest (the target's throughput ratio)."""
    lines = [sample_line(b) for b in batches]
    table = medians(batches, counts)
    base = min(counts)
    lines.append("")
    header = f"{'figure':<36}" + "".join(f"{f'{k:,} keys: median [min..max] (n)':>38}" for k in counts)
    lines.append(header + "".join(f"{f'{k:,}/{base:,} x':>16}{f'{base:,}/{k:,} x':>16}" for k in counts if k != base))
    for name, _ in FIGURES:
        row = table.get(name, {})
        cells = "".join(f"{f'{m:.2f} [{lo:.2f}..{hi:.2f}] ({n})':>38}" if k in row else f"{'-':>38}"
                        for k in counts for m, lo, hi, n in [row.get(k, (0, 0, 0, 0))])
        ratios = ""
        for k in counts:
            if k == base:
                continue
            if k in row and base in row and row[base][0] > 0 and row[k][0] > 0:
                ratios += f"{row[k][0] / row[base][0]:>16.2f}{row[base][0] / row[k][0]:>16.2f}"
            else:
                ratios += f"{'-':>16}{'-':>16}"
        lines.append(f"{name:<36}{cells}{ratios}")
    lines.append("")
    top = max(counts)
    for name, what in ((FIGURES[0][0], "target (issue #33)"), (FIGURES[2][0], "the same without the sensor's wait")):
        row = table.get(name, {})
        if top != base and top in row and base in row:
            ratio = row[base][0] / row[top][0]
            lines.append(f"{what}: throughput at {top:,} keys / at {base:,}, daemon-launched, warm, median of batches"
                         f" = {base:,}-key / {top:,}-key median of '{name.strip()}' = {ratio:.2f} (>= {TARGET}): "
                         f"{'met' if ratio >= TARGET else 'MISSED'}")
    return lines


def main_daemon(counts: list[int], versions: int, batches: int, warmup: int, seed: int, claim_grace: float,
                timeout: float) -> int:
    import tempfile

    from bench import exit_on_sigterm
    from resources.local_postgres import temporary_server

    exit_on_sigterm()  # SIGTERM still stops every dagster dev and drops the scratch PostgreSQL
    with temporary_server("kbindex-bench-scale-", external_env="KBINDEX_BENCH_DATABASE_URL") as admin_url, \
            tempfile.TemporaryDirectory(prefix="kb-scale-daemon-") as tmp:
        result = run_daemon(admin_url, counts, versions, batches, warmup, seed, Path(tmp), claim_grace=claim_grace,
                            timeout=timeout, note=lambda line: print(line, flush=True))
    print("\n".join(summary(result, counts)), flush=True)
    return 0 if all(b.succeeded == b.versions for b in result) else 1
