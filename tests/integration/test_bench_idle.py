"""The CI-sized bench.idle round: the real dagster dev, idle, with the current task-event trigger and with
migration 0001's (which notified on every claim that found nothing due, waking the claiming sensor's own wait)."""

from __future__ import annotations

import pytest

from bench.idle import render, run

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_an_idle_deployment_sends_no_task_events_and_the_old_trigger_did():
    lines: list[str] = []
    report = run(seconds=4.0, rounds=1, settle=3.0, out=lines.append, census_seconds=4.0)
    shown = "\n".join(lines) + "\n" + render(report)
    by_side = {w["side"]: w for w in report["windows"]}
    assert by_side["current"]["notifications"] == 0, shown
    assert by_side["notify on empty"]["notifications"] >= 10, shown  # ~8 a second while a tick waits
    assert report["medians"]["current"]["dagster (all)"] > 0, shown  # the meter saw dagster dev's processes
    census = report["census"]  # the embedded server's log is readable here
    assert census["dagster"]["work"] > 0 and census["kbindex"]["work"] > 0, shown  # the daemon polls, the sensor claims
    assert census["dagster, by process"].get("daemon", 0) > 0, shown  # named by application_name
    assert "statements per second, dagster (current)" in shown, shown
