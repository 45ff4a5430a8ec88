"""The claiming sensor's run planning: retried versions share runs with fresh ones; bisection caps hold.

A run covers a contiguous range of partition keys in insertion order, so a retried version's key,
which already exists somewhere earlier, used to get a run of its own (issue #12, defect 7).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pipelines.sensors import plan_runs
from resources.dagster_resources import LEASES_TAG
from resources.task_queue import ClaimedTask, Lease

RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def task(task_id: int, attempt: int = 1, tenant: str = "acme", profile: str = "p") -> ClaimedTask:
    lease = Lease(task_id, attempt, "batch-x", datetime.now(UTC))
    return ClaimedTask(lease, tenant, f"doc-{task_id}", 1, profile, "INDEX")


def sizes(plan) -> list[int]:
    return [len(json.loads(r.tags[LEASES_TAG])) for r in plan.requests]


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

    by_run = [{t for t, _ in json.loads(r.tags[LEASES_TAG])} for r in plan.requests]
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
    holding = [r for r in plan.requests if {1, 2} & {t for t, _ in json.loads(r.tags[LEASES_TAG])}]
    assert len(holding) == 1
    check_ranges(plan)


def test_tenants_never_share_a_run():
    tasks = [task(1, tenant="a"), task(2, tenant="b", attempt=3)]
    keys = {1: "a/doc-1/v1", 2: "b/doc-2/v1"}

    plan = plan_runs(tasks, keys, {"b/doc-2/v1"}, "batch-x", 160)

    assert sizes(plan) == [1, 1] and plan.delete == ["b/doc-2/v1"]
