"""A CI-sized chaos round (bench/chaos): the real `dagster dev`, run processes SIGKILLed while they work,
one run SIGSTOPped past its lease and resumed, PostgreSQL stopped and started again, embedding timeouts,
rate limits and wrong-dimension answers at ~5%, and a reader checking every search hit against the
search pointer meanwhile. Nothing may be duplicated, half visible or lost, and `verify` must be clean.
"""

from __future__ import annotations

import time

import pytest

from bench.chaos import ChaosConfig, format_report, run_chaos

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_small_chaos_round_loses_duplicates_and_half_shows_nothing():
    config = ChaosConfig(
        tasks=25,
        kills=3,
        stops=1,
        pg_restarts=1,
        seconds_limit=210,
        faults="timeout=0.05,rate_limit=0.05,wrong_dimension=0.05",
        seed=11,
    )
    lines: list[str] = []
    started = time.monotonic()
    report = run_chaos(config, out=lines.append)
    shown = "\n".join(lines) + "\n" + format_report(report)
    print(shown)  # the figures, with -s or on failure
    assert not report.get("errors"), shown
    assert not report["timed_out"], shown
    assert report["must_be_zero"] == {
        "duplicates": 0,
        "half_visible_versions": 0,
        "lost_publishes": 0,
        "writes_from_superseded_lease": 0,
    }, shown
    assert report["verify"]["ok"], shown
    faults = report["faults"]
    assert faults["process_kills"] >= 3, shown
    assert len(faults["sigstops"]) == 1 and len(faults["postgres_restarts"]) == 1, shown
    assert report["tasks"]["tasks"] >= 25, shown
    reader = report["reader"]
    assert reader.get("strict_hits", 0) > 0 and reader.get("bracketed_hits", 0) > 0, shown
    assert time.monotonic() - started < 240, shown
