"""The CI-sized bench.idle round: the real dagster dev, idle, with the current task-event trigger and with
migration 0001's (which notified on every claim that found nothing due, waking the claiming sensor's own wait)."""

from __future__ import annotations

import pytest

from bench.idle import render, run

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_an_idle_deployment_sends_no_task_events_and_the_old_trigger_did():
    lines: list[str] = []
    # Windows longer than the daemon's 5-s loop: idle, kbindex hears from the claiming sensors only at a loop's start.
    report = run(seconds=6.0, rounds=1, settle=3.0, out=lines.append, census_seconds=6.0)
    shown = "\n".join(lines) + "\n" + render(report)
    by_side = {w["side"]: w for w in report["windows"]}
    assert by_side["current"]["notifications"] == 0, shown
    # Each loop's first claim, empty, notifies under the old trigger. It used to wake the tick into claiming again
    # every 0.1 s (~8 a second); a woken tick now claims only when something is due (claim_on_wake), so once a loop.
    assert by_side["notify on empty"]["notifications"] >= 1, shown
    assert report["medians"]["current"]["dagster (all)"] > 0, shown  # the meter saw dagster dev's processes
    census = report["census"]  # the embedded server's log is readable here
    assert census["dagster"]["work"] > 0 and census["kbindex"]["work"] > 0, shown  # the daemon polls, the sensor claims
    assert census["dagster, by process"].get("daemon", 0) > 0, shown  # named by application_name
    assert "statements per second, dagster (current)" in shown, shown
    assert census["dagster, most sent"]["daemon"], shown  # its most frequent statement shapes
    assert "most sent by daemon, per second:" in shown, shown


def test_a_statement_shape_hides_literals_so_repeats_count_as_one():
    from bench.idle import statement_shape

    a = statement_shape("SELECT * FROM runs WHERE id = 'abc' AND n > 12\n  LIMIT 3")
    assert a == statement_shape("SELECT * FROM runs WHERE id = 'x''y'  AND n > 7 LIMIT 30")
    assert a == "SELECT * FROM runs WHERE id = ? AND n > ? LIMIT ?"
    assert statement_shape("SELECT t1.x FROM t1") == "SELECT t1.x FROM t1"  # digits inside names stay
