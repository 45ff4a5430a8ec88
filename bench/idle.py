"""What an idle deployment costs: CPU of `dagster dev` (by part) and PostgreSQL with nothing to index.

``python -m bench.idle [--seconds 30] [--rounds 2] [--settle 20]`` starts a throwaway PostgreSQL and the real
`dagster dev` (the project's dagster.yaml, sensors and warm launcher; nothing published), lets it settle,
then measures windows of ``--seconds`` in alternation: ``current`` (the schema as migrated) and ``notify on
empty`` (the task-event trigger of migration 0001, which notified even when a statement inserted no event:
every claim that found nothing due woke the claiming sensor's own wait, migration 0050). Both sides run on the
same stack, the trigger function swapped between windows, ``--rounds`` windows each. Per window it prints the
CPU seconds per second of each part of `dagster dev`, of PostgreSQL (with its exited backends) and the number
of task-event notifications; then the medians side by side and their ratio.

``--census-seconds N`` (default 30; 0: none) then logs every statement PostgreSQL receives for N more seconds
(``log_min_duration_statement = 0`` on the bench's own server) and prints, per database (Dagster's, kbindex's),
the statements per second by kind: connection set-up (a new connection's driver and dialect queries),
connection tests (``SELECT 1``), catalog queries (``pg_catalog``), and the rest; and the Dagster database's by
sending process (its connections' ``application_name``: daemon, code server, webserver, ...), with each
process's most frequent statement shapes (literals as ``?``).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from sql import queries

SIDES = ("current", "notify on empty")
TOP_SHAPES = 6
"""Statement shapes listed per sending Dagster process in the census (its most frequent)."""


def window(meter: Any, kb_url: str, seconds: float) -> dict[str, Any]:
    """CPU per second by part over ``seconds``, and the task-event notifications sent meanwhile."""
    from resources.task_wakeup import TaskWakeup

    with TaskWakeup(kb_url) as wakeup:
        meter.start()
        started = time.monotonic()
        notes = sum(1 for _ in wakeup.conn.notifies(timeout=seconds))
        wall = time.monotonic() - started
        spent, parts = meter.spent(), meter.parts_spent()
    rates = {f"dagster: {part}": round(s / wall, 4) for part, s in parts.items()}
    rates["dagster (all)"] = round(spent.get("dagster", 0.0) / wall, 4)
    rates["postgres"] = round(spent.get("postgres", 0.0) / wall, 4)
    return {"wall": round(wall, 1), "core_s_per_s": rates, "notifications": notes}


SETUP_STATEMENTS = ("select pg_catalog.version()", "select current_schema()", "show transaction isolation level",
                    "show standard_conforming_strings", "BEGIN", "ROLLBACK")
"""What SQLAlchemy's psycopg2 dialect sends on a new connection (with a ``typarray`` query)."""
_LOGGED = re.compile(r"^\S+ \S+ \S+ \[\d+\] (\S*) <([^>]*)> LOG:  duration: [\d.]+ ms  (?:statement|execute [^:]*): (.*)")


def statement_kind(sql: str) -> str:
    sql = sql.strip().rstrip(";")
    if sql in SETUP_STATEMENTS or sql.startswith("SELECT t.oid, typarray"):
        return "connection set-up"
    if sql == "SELECT 1":
        return "connection test"
    if "pg_catalog." in sql:
        return "catalog"
    return "work"


_LITERALS = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")


def statement_shape(sql: str, width: int = 120) -> str:
    """``sql`` with its literals replaced by ``?`` and its whitespace collapsed, cut to ``width`` characters: the
    statements a process sends again and again count as one shape."""
    return " ".join(_LITERALS.sub("?", sql).split())[:width]


def census(admin_url: str, databases: dict[str, str], seconds: float) -> dict[str, dict[str, float]] | None:
    """Statements per second by database label and kind over ``seconds``, from the server's log; None where the
    log cannot be read (not the bench's embedded server, or no right to change the logging)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        log = Path(conn.execute(queries["bench_data_directory"]).fetchone()[0]) / "log"
        if not log.is_file():
            return None
        for name in ("bench_log_every_statement", "bench_log_prefix_with_application", "bench_reload_config"):
            conn.execute(queries[name], {})  # {}: the doubled percent signs are unescaped
    start = log.stat().st_size
    try:
        time.sleep(seconds)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for name in ("bench_log_statements_reset", "bench_log_prefix_reset", "bench_reload_config"):
                conn.execute(queries[name])
    counts: dict[str, collections.Counter[str]] = {label: collections.Counter() for label in databases}
    senders: collections.Counter[str] = collections.Counter()
    shapes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    by_name = {name: label for label, name in databases.items()}
    with open(log, encoding="utf-8", errors="replace") as f:
        f.seek(start)
        for line in f:
            m = _LOGGED.match(line)
            if m and m.group(1) in by_name:
                counts[by_name[m.group(1)]][statement_kind(m.group(3))] += 1
                if by_name[m.group(1)] == "dagster":  # application_name: resources/dagster_storage.py process_name
                    sender = m.group(2).removeprefix("kbindex-dagster-")
                    sender = "unnamed" if sender in ("", "[unknown]") else sender  # PostgreSQL logs "" as [unknown]
                    senders[sender] += 1
                    shapes[sender][statement_shape(m.group(3))] += 1
    out = {label: {kind: round(n / seconds, 2) for kind, n in sorted(c.items())} | {"all": round(sum(c.values()) / seconds, 2)}
           for label, c in counts.items()}
    out["dagster, by process"] = {name: round(n / seconds, 2) for name, n in senders.most_common()}
    out["dagster, most sent"] = {name: {shape: round(n / seconds, 2) for shape, n in shapes[name].most_common(TOP_SHAPES)}
                                 for name, _ in senders.most_common()}
    return out


def run(seconds: float, rounds: int, settle: float, out: Any = print, census_seconds: float = 0.0) -> dict[str, Any]:
    from bench import exit_on_sigterm, server_url
    from bench.cpu import CpuMeter, postgres_pid
    from bench.pipeline.__main__ import dagster_dev, scratch_databases

    exit_on_sigterm()
    migrated = (Path(__file__).resolve().parents[1] / "sql" / "migrations"
                / "0050_task_event_notify_only_new_events.sql").read_text()
    report: dict[str, Any] = {"windows": []}
    with server_url() as admin_url, scratch_databases(admin_url) as (kb_url, dg_url):
        with psycopg.connect(kb_url, autocommit=True) as conn:
            conn.execute(queries["bench_set_active_model"], {"model": "fake-384"})
        root = Path(tempfile.mkdtemp(prefix="kbindex-bench-idle-"))
        dagster = dagster_dev(kb_url, dg_url, root)
        try:
            dagster.start()
            out(f"dagster dev answered in {dagster.wait_ready():.1f} s; settling {settle:.0f} s")
            time.sleep(settle)
            meter = CpuMeter({"dagster": dagster.proc.pid if dagster.proc else None,
                              "postgres": postgres_pid(kb_url)}, parts_of="dagster")
            for n in range(rounds):
                for side in SIDES if n % 2 == 0 else reversed(SIDES):
                    with psycopg.connect(kb_url, autocommit=True) as conn:
                        conn.execute(migrated if side == "current" else queries["bench_idle_old_task_event_notify"])
                    dagster.check_alive()
                    w = {"side": side, **window(meter, kb_url, seconds)}
                    report["windows"].append(w)
                    r = w["core_s_per_s"]
                    out(f"  {side:>16}: dagster {r['dagster (all)']:.4f} core-s/s, postgres {r['postgres']:.4f}, "
                        f"{w['notifications']} notifications in {w['wall']} s")
            if census_seconds > 0:
                with psycopg.connect(kb_url, autocommit=True) as conn:
                    conn.execute(migrated)
                dagster.check_alive()
                from sqlalchemy.engine import make_url

                names = {label: make_url(url).database for label, url in (("dagster", dg_url), ("kbindex", kb_url))}
                report["census"] = census(admin_url, names, census_seconds)
                out(f"  statements per second ({census_seconds:.0f} s, current): "
                    f"{ {k: v for k, v in (report['census'] or {}).items() if k != 'dagster, most sent'} }")
        finally:
            with psycopg.connect(kb_url, autocommit=True) as conn:
                conn.execute(migrated)
            dagster.stop()
            shutil.rmtree(root, ignore_errors=True)
    report["medians"] = medians(report["windows"])
    return report


def medians(windows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """side -> figure -> median over its windows (CPU per second by part, and notifications per second)."""
    out: dict[str, dict[str, float]] = {}
    for side in SIDES:
        mine = [w for w in windows if w["side"] == side]
        if not mine:
            continue
        keys = sorted({k for w in mine for k in w["core_s_per_s"]})
        out[side] = {k: round(statistics.median(w["core_s_per_s"].get(k, 0.0) for w in mine), 4) for k in keys}
        out[side]["notifications per s"] = round(statistics.median(w["notifications"] / w["wall"] for w in mine), 2)
    return out


def render(report: dict[str, Any]) -> str:
    med = report["medians"]
    keys = sorted({k for side in med.values() for k in side})
    lines = [f"{'median, core-s per s':<34} {SIDES[0]:>12} {SIDES[1]:>16} {'ratio':>7}"]
    for k in keys:
        a, b = med.get(SIDES[0], {}).get(k, 0.0), med.get(SIDES[1], {}).get(k, 0.0)
        ratio = f"{a / b:7.3f}" if b else "      -"
        lines.append(f"{k:<34} {a:>12.4f} {b:>16.4f} {ratio}")
    for database, kinds in (report.get("census") or {}).items():
        if database == "dagster, most sent":
            for sender, shapes in kinds.items():
                lines.append(f"most sent by {sender}, per second:")
                lines.extend(f"  {n:>6} {shape}" for shape, n in shapes.items())
            continue
        lines.append(f"statements per second, {database} (current): "
                     + ", ".join(f"{kind} {n}" for kind, n in kinds.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of one measured window")
    parser.add_argument("--rounds", type=int, default=2, help="windows per side, alternating")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after dagster dev answers, unmeasured")
    parser.add_argument("--census-seconds", type=float, default=30.0,
                        help="then log every statement this long and count them by database and kind (0: no)")
    args = parser.parse_args(argv)
    report = run(args.seconds, args.rounds, args.settle, census_seconds=args.census_seconds)
    print(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
