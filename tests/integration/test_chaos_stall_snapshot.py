"""A chaos round's stall snapshot on a real database: PostgreSQL's busy sessions, and a part it cannot read
reported as unavailable rather than ending the round."""

from __future__ import annotations

import threading
from collections import Counter

import psycopg

from bench.chaos import Chaos, ChaosConfig, format_report
from bench.dagster_dev import DagsterDev


def test_a_snapshot_names_the_session_that_waits_and_says_what_it_could_not_read(db_url, tmp_path):
    chaos = Chaos(ChaosConfig(tasks=1), out=lambda _: None)
    chaos.url, chaos.dg_url, chaos.t0 = db_url, db_url, 0.0  # no Dagster schema here: its runs are unavailable
    chaos.dagster = DagsterDev(tmp_path, {})  # not started: no stacks, an empty log
    (tmp_path / "dagster.log").write_text("")
    holder = psycopg.connect(db_url, autocommit=True)
    waiter = psycopg.connect(db_url, autocommit=True, application_name="chaos-waiter")
    try:
        holder.execute("CREATE TABLE stall_probe (id int)")
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE stall_probe IN ACCESS EXCLUSIVE MODE")
        blocked = threading.Thread(target=lambda: waiter.execute("SELECT count(*) FROM stall_probe"), daemon=True)
        blocked.start()
        blocked.join(1.0)
        chaos._snapshot_stall(70.0, 61.0, Counter({"RUNNING": 2, "SUCCEEDED": 3}))
    finally:
        holder.execute("ROLLBACK")
        blocked.join(5)
        holder.close()
        waiter.close()
    (stall,) = chaos.stalls
    assert stall["without_progress_seconds"] == 61.0 and stall["counts"] == {"RUNNING": 2, "SUCCEEDED": 3}
    assert isinstance(stall["live_runs"], str) and stall["live_runs"].startswith("unavailable: UndefinedTable")
    waiting = [s for s in stall["busy_sessions"] if s["app"] == "chaos-waiter"]
    assert waiting and waiting[0]["wait_type"] == "Lock" and waiting[0]["blocked_by"], stall["busy_sessions"]
    assert "at 70 s" in chaos.stall_stacks[0]
    shown = format_report({"stalls": chaos.stalls, "dagster_stacks_in_stalls": "\n".join(chaos.stall_stacks)})
    assert "without_progress_seconds" in shown and "while no task finished" in shown
