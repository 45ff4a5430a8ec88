"""bench.scale.migration times both phases to the same task count with the same rule (issue #33)."""

from __future__ import annotations

import pytest

from bench.scale.migration import Result, cut_seconds, percentile, windows


def result(**kw) -> Result:
    base = dict(versions=100, plain_tasks=10, plain_seconds=20.0, create_seconds=0.1, reindex_tasks=110,
                launch_seconds=1.0, first_run_seconds=5.0, window_seconds=60.0, reindex_done=50,
                reindex_first_seconds=10.0, backfill_run_status="SUCCESS", index_runs=3, plain_runs={}, retried={})
    return Result(**{**base, **kw})


def test_the_ratio_compares_both_phases_to_their_mth_task_and_the_old_one_stays_printed():
    # plain: 9 tasks in 9 s, then a 11 s wind-down for its last; REINDEX: 9 tasks in 12 s, 10 in 13 s.
    plain = [float(i) for i in range(1, 10)] + [20.0]
    reindex = [100.0 + i * 12 / 9 for i in range(1, 10)] + [113.0] + [200.0]
    m = 9
    r = result(cut=m, plain_cut_seconds=cut_seconds(plain, 0.0, m), reindex_cut_seconds=cut_seconds(reindex, 100.0, m),
               plain_seconds=20.0, reindex_first_seconds=cut_seconds(reindex, 100.0, 10))
    assert r.plain_cut_seconds == 9.0 and r.reindex_cut_seconds == pytest.approx(12.0)
    assert r.ratio == pytest.approx(9.0 / 12.0)  # REINDEX is slower over the same 9 versions
    assert r.old_ratio == pytest.approx((10 / 13.0) / (10 / 20.0))  # the wind-down made it look faster: 1.54
    assert r.holds()["ratio"] is False
    assert cut_seconds(plain, 0.0, 11) is None and result().ratio == 0.0


def test_windows_give_each_runs_publish_step_in_finishing_order():
    # run A: 3 versions, its publish step ends 2.0 s after its announcement; B: 2 versions, 4.0 s; C: 1, 1.0 s
    rows = [(10.0, "A", 0.5), (11.0, "A", 1.0), (12.0, "A", 2.0), (13.0, "B", 3.0), (14.0, "B", 4.0),
            (20.0, "C", 1.0)]
    w1, w2 = windows(rows, 4)  # A alone has 3 < 4 versions: A and B make the first window
    assert (w1["from"], w1["to"], w1["runs"]) == (1, 5, 2)
    assert (w1["publish_p50"], w1["publish_p95"]) == (2.0, 4.0)
    assert w1["seconds_per_320"] == 320 * 6.0 / 5 and w1["tasks_per_second"] == 5 / 4.0
    assert (w2["from"], w2["to"], w2["runs"], w2["publish_p50"]) == (6, 6, 1, 1.0)
    assert w2["tasks_per_second"] == round(1 / 6.0, 2) and windows([], 4) == []
    assert percentile([], 0.5) is None and percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0
