"""bench/chaos/progress.py: a chaos round notices a stall that it then recovers from."""

from __future__ import annotations

from pathlib import Path

from bench.chaos.progress import ProgressWatch, keep_stalled_report


def test_a_stall_is_reported_once_when_nothing_finishes_for_the_bound_while_tasks_wait():
    watch = ProgressWatch(stall_seconds=60)
    assert watch.see(0, finished=5, unfinished=3) is None
    assert watch.see(59, finished=5, unfinished=3) is None
    assert watch.see(61, finished=5, unfinished=4) == 61  # new publishes are not progress
    assert watch.see(90, finished=5, unfinished=4) is None  # the same stall: reported once
    assert watch.see(95, finished=6, unfinished=3) is None  # a task finished: over
    assert watch.see(160, finished=6, unfinished=3) == 65  # a second stall is reported again
    assert watch.longest == 90


def test_waiting_with_nothing_unfinished_is_not_a_stall():
    watch = ProgressWatch(stall_seconds=60)
    for now in range(0, 300, 10):
        assert watch.see(now, finished=30, unfinished=0) is None
    assert watch.longest == 0
    assert watch.see(301, finished=30, unfinished=1) is None  # the clock starts when work appears
    assert watch.see(362, finished=30, unfinished=1) == 61


def test_a_stalled_round_keeps_its_report_and_a_clean_one_keeps_nothing():
    assert keep_stalled_report({"stalls": []}, "report") is None
    summary = keep_stalled_report({"stalls": [{"without_progress_seconds": 176.2, "at_seconds": 41.0}]}, "the report")
    assert summary is not None and "176 s at 41 s" in summary
    kept = Path(summary.rpartition("snapshots: ")[2])
    assert kept.read_text() == "the report"
    kept.unlink()
    kept.parent.rmdir()
