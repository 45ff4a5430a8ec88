"""The claiming sensor's run planning: retried versions share runs with fresh ones; bisection caps hold.

A run covers a contiguous range of partition keys in insertion order, so a retried version's key,
which already exists somewhere earlier, used to get a run of its own (issue #12, defect 7).
"""

from __future__ import annotations

from datetime import UTC, datetime

from pipelines.sensors import plan_runs
from resources.dagster_resources import leases_of
from resources.task_queue import ClaimedTask, Lease

RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def task(task_id: int, attempt: int = 1, tenant: str = "acme", profile: str = "p") -> ClaimedTask:
    lease = Lease(task_id, attempt, "batch-x", datetime.now(UTC))
    return ClaimedTask(lease, tenant, f"doc-{task_id}", 1, profile, "INDEX")


def sizes(plan) -> list[int]:
    return [len(leases_of(r.tags)) for r in plan.requests]


def check_ranges(plan) -> None:
    """Every run's keys are exactly one contiguous slice of the keys added, in order."""
    order = plan.add
    for r in plan.requests:
        if RANGE_START in r.tags:
            start, end = order.index(r.tags[RANGE_START]), order.index(r.tags[RANGE_END])
            assert start <= end


def test_retried_and_fresh_versions_of_one_tenant_share_runs():
    retried = [task(i, attempt=2) for i in range(1, 31)]  # a crashed 30-version run, back again
    fresh = [task(i) for i in range(31, 41)]
    keys = {t.lease.task_id: f"acme/doc-{t.lease.task_id}/v1" for t in retried + fresh}
    existing = {keys[t.lease.task_id] for t in retried}

    plan = plan_runs(retried + fresh, keys, existing, "batch-x", 160, spread=2, batch_min=12)

    assert sizes(plan) == [20, 20]  # not 30 one-version runs plus one run of 10
    assert sorted(plan.delete) == sorted(existing)  # moved to the end, with the fresh ones
    assert sorted(plan.add) == sorted(keys.values()) and len(set(plan.add)) == len(plan.add)
    check_ranges(plan)


def test_a_key_a_live_run_still_covers_is_not_moved():
    retried, fresh = task(1, attempt=2), task(2)
    keys = {1: "acme/doc-1/v1", 2: "acme/doc-2/v1"}

    plan = plan_runs([retried, fresh], keys, {"acme/doc-1/v1"}, "batch-x", 160, pinned={"acme/doc-1/v1"})

    assert plan.delete == [] and plan.add == ["acme/doc-2/v1"]
    assert sorted(r.partition_key for r in plan.requests) == ["acme/doc-1/v1", "acme/doc-2/v1"]


def test_capped_tasks_get_runs_no_bigger_than_their_cap():
    tasks = [task(i, attempt=2) for i in range(1, 31)] + [task(i) for i in range(31, 51)]
    keys = {t.lease.task_id: f"acme/doc-{t.lease.task_id}/v1" for t in tasks}
    caps = {i: 15 for i in range(1, 23)} | {i: 4 for i in range(23, 31)}  # two earlier crashes

    plan = plan_runs(tasks, keys, set(), "batch-x", 160, spread=2, batch_min=12, caps=caps)

    by_run = [{t for t, _ in leases_of(r.tags)} for r in plan.requests]
    for ids in by_run:
        run_caps = {caps.get(i) for i in ids}
        assert len(run_caps) == 1, "capped tasks share runs only with tasks of the same cap"
        (cap,) = run_caps
        assert cap is None or len(ids) <= cap
    assert sorted(sizes(plan)) == sorted([20, 15, 7, 4, 4])
    check_ranges(plan)


def test_the_tasks_of_one_version_share_a_run_and_its_key_is_added_once():
    a, b = task(1, profile="old"), task(2, profile="new")  # one version, two profiles
    others = [task(i) for i in range(3, 30)]
    keys = {1: "acme/doc-1/v1", 2: "acme/doc-1/v1"} | {t.lease.task_id: f"acme/doc-{t.lease.task_id}/v1" for t in others}

    plan = plan_runs([a, *others, b], keys, set(), "batch-x", 160, spread=2, batch_min=12)

    assert plan.add.count("acme/doc-1/v1") == 1
    holding = [r for r in plan.requests if {1, 2} & {t for t, _ in leases_of(r.tags)}]
    assert len(holding) == 1
    check_ranges(plan)


def test_tenants_never_share_a_run():
    tasks = [task(1, tenant="a"), task(2, tenant="b", attempt=3)]
    keys = {1: "a/doc-1/v1", 2: "b/doc-2/v1"}

    plan = plan_runs(tasks, keys, {"b/doc-2/v1"}, "batch-x", 160)

    assert sizes(plan) == [1, 1] and plan.delete == ["b/doc-2/v1"]


# -- runs sized by bytes, not by count (issue #14: small documents) -------------------------------------


def test_a_claim_takes_the_due_versions_that_fit_its_byte_budget():
    from pipelines.sensors import claim_count

    assert claim_count([1_000] * 5_000, budget=1_000_000, floor=24) == 1_000  # abstracts: a thousand fit
    assert claim_count([400_000] * 100, budget=1_000_000, floor=24) == 24  # huge files: the floor still
    assert claim_count([100] * 5, budget=1_000_000, floor=5) == 5  # fewer are due than fit: all of them
    assert claim_count([0] * 10, budget=3, floor=1) == 3  # an empty file still counts as a byte
    assert claim_count([], budget=10, floor=0) == 0


def test_many_small_versions_make_few_big_runs_and_long_ones_more_runs():
    claimed = [task(i) for i in range(1, 1001)]
    keys = {t.lease.task_id: f"acme/doc-{t.lease.task_id}/v1" for t in claimed}
    small = plan_runs(claimed, keys, set(), "batch-x", 1000, spread=2, batch_min=12,
                      weights={t.lease.task_id: 1_500 for t in claimed}, run_bytes=5_000_000)
    assert sizes(small) == [500, 500]  # 1.5 MB: the two run slots, not seven runs of 160
    large = plan_runs(claimed, keys, set(), "batch-x", 1000, spread=2, batch_min=12,
                      weights={t.lease.task_id: 40_000 for t in claimed}, run_bytes=5_000_000)
    assert len(large.requests) == 8 and max(sizes(large)) <= 126  # 40 MB: no run much over 5 MB
    check_ranges(large)
    capped = plan_runs(claimed, keys, set(), "batch-x", 300, spread=2, batch_min=12,
                       weights={t.lease.task_id: 1 for t in claimed}, run_bytes=5_000_000)
    assert sizes(capped) == [250, 250, 250, 250]  # and never over the version cap


def test_a_tick_is_spread_over_runs_only_as_far_as_each_run_gets_enough_bytes():
    """A run's fixed cost is seconds of CPU: 39 abstracts make one run, not two of 19 and 20."""
    claimed = [task(i) for i in range(1, 40)]
    keys = {t.lease.task_id: f"acme/doc-{t.lease.task_id}/v1" for t in claimed}
    weights = {t.lease.task_id: 1_500 for t in claimed}

    def plan(split_bytes: int, weight: int = 1_500):
        return plan_runs(claimed, keys, set(), "batch-x", 320, spread=2, batch_min=12, run_bytes=5_000_000,
                         weights={t: weight for t in weights}, split_bytes=split_bytes)

    assert sizes(plan(0)) == [20, 19]  # without the rule: both slots
    assert sizes(plan(256 * 1024)) == [39]  # 58 KB: one run
    assert sizes(plan(256 * 1024, weight=20_000)) == [20, 19]  # 780 KB: worth two runs
    assert sizes(plan(256 * 1024, weight=1)) == [39]


def test_a_run_of_tiny_versions_is_bounded_by_their_fixed_cost_not_by_a_count():
    """Issue #34: a version weighs its bytes plus its fixed cost (``version_bytes``); thousands of tiny
    versions fill one run each slot, and the count ceiling only stops what the weight would not."""
    from pipelines import sensors

    claimed = [task(i) for i in range(1, 3001)]
    keys = {t.lease.task_id: f"acme/doc-{t.lease.task_id}/v1" for t in claimed}
    tiny = {t.lease.task_id: 300 for t in claimed}  # one-paragraph FAQ entries

    def plan(version_bytes: int, run_bytes: int = 5_000_000, batch_max: int = 2_500):
        return plan_runs(claimed, keys, set(), "batch-x", batch_max, spread=2, batch_min=12, weights=tiny,
                         run_bytes=run_bytes, split_bytes=256 * 1024, version_bytes=version_bytes)

    assert sizes(plan(2_048)) == [1_500, 1_500]  # 7 MB of work: the two run slots, 1,500 versions each
    assert sizes(plan(2_048, run_bytes=2_000_000)) == [750] * 4  # no run over its work budget
    assert sizes(plan(0, run_bytes=200_000)) == [600] * 5  # bytes alone: 900 KB would make 5 runs...
    fixed = sizes(plan(2_048, run_bytes=200_000))  # ...their fixed cost makes 36 (7 MB / 200 KB)
    assert len(fixed) == 36 and sum(fixed) == 3_000 and max(fixed) <= 200_000 // 2_348 + 1
    # The defaults: a run holds thousands of tiny versions (the ceiling was a flat 320), and a claim takes them.
    assert sensors.BATCH_MAX >= 2_000
    assert sensors.claim_count([300] * 10_000, sensors.RUN_BYTES * 2, 24, sensors.VERSION_BYTES) > 4_000
    assert sensors.claim_count([300] * 10_000, 1_000_000, 24, 2_048) == 1_000_000 // 2_348


def test_bytes_alone_keeps_the_old_ceiling_instead_of_asking_a_tick_for_millions_of_rows():
    """KBINDEX_RUN_VERSION_BYTES=0 sizes runs by bytes alone; the count ceiling must not become RUN_BYTES // 1
    (5,242,880), which claim_limit would pass as the LIMIT of its due-sizes read every tick."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "from pipelines import sensors; print(sensors.BATCH_MAX)"],
                         env={**os.environ, "KBINDEX_RUN_VERSION_BYTES": "0"},
                         capture_output=True, text=True, check=True)
    assert int(out.stdout.strip().splitlines()[-1]) == 320
