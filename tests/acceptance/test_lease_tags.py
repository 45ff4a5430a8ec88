"""A run's lease tags and run key stay within what Dagster's run storage can index, at any task id or run size.

Dagster stores run tags, the sensor's run key among them (dagster/run_key), in a PostgreSQL B-tree on
(key, value), whose entries stop at ~2.7 KB (after compression). A JSON list of 1,000 leases (9-12 KB)
does not fit: the run could not be created, and the claimed tasks waited for their leases to expire,
tick after tick (issue #14). 320 leases with seven-digit ids (~3.8 KB) passed only by compressing well.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime

import dagster as dg
import pytest

from pipelines.sensors import BATCH_MAX, _request
from resources.dagster_resources import (
    LEASES_TAG,
    RUN_KEY_PAIRS_MAX,
    TAG_VALUE_MAX,
    decode_leases,
    encode_leases,
    lease_tags,
    leases_of,
    run_key_of,
)
from resources.task_queue import ClaimedTask, Lease


def _sparse_pairs(n: int, seed: int = 5) -> list[tuple[int, int]]:
    """``n`` leases of a large corpus: seven-digit ids far apart (retries, takeovers), some past attempt 1."""
    rng = random.Random(seed)
    ids = rng.sample(range(1_000_000, 9_999_999), n)
    return [(t, rng.choice([1, 1, 1, 2, 3, 40])) for t in ids]


def test_leases_round_trip_in_any_order_and_old_json_tags_still_read():
    pairs = _sparse_pairs(500) + [(1, 1), (2, 1), (3, 7)]
    assert decode_leases(encode_leases(pairs)) == sorted(pairs)
    assert leases_of(lease_tags(pairs)) == sorted(pairs)
    assert decode_leases(json.dumps([[12, 1], [7, 2]])) == [(12, 1), (7, 2)]  # runs created before this format
    assert leases_of({}) == [] and decode_leases("") == []
    with pytest.raises(ValueError):
        decode_leases("garbage")


def test_a_burst_costs_about_two_characters_a_lease():
    burst = [(t, 1) for t in range(4_000_000, 4_000_320)]
    assert len(encode_leases(burst)) < 2 * 320 + 10


def test_every_tag_and_the_run_key_stay_short_for_a_thousand_sparse_leases():
    pairs = _sparse_pairs(1000)
    tags = lease_tags(pairs)
    assert len(tags) > 1 and all(len(v) <= TAG_VALUE_MAX for v in tags.values())
    key = run_key_of(pairs)
    assert len(key) < RUN_KEY_PAIRS_MAX + 100
    assert run_key_of(list(reversed(pairs))) == key  # same lease set, same key (duplicate delivery)
    assert run_key_of(pairs[:-1]) != key
    assert run_key_of([(5, 1), (3, 2)]) == "3:2,5:1"  # a small run keeps DESIGN's task_id:attempt form


def test_dagster_run_storage_takes_the_sensors_tags_for_a_big_run_where_json_tags_fail(pg_server_url, dagster_pg_url):
    pairs = _sparse_pairs(max(1000, BATCH_MAX))  # the default ceiling (2,560 tiny versions, issue #34)
    group = [ClaimedTask(Lease(t, a, "batch-big", datetime.now(UTC)), "acme", f"doc-{t}", 1, "p", "INDEX")
             for t, a in pairs]
    request = _request(group, [f"acme/doc-{t}/v1" for t, _ in pairs], "batch-big", "acme")
    tags = {**request.tags, "dagster/run_key": request.run_key}
    overrides = {"storage": {"postgres": {"postgres_url": dagster_pg_url}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        with pytest.raises(Exception, match="index row (size|requires)"):  # what the JSON tag did
            instance.add_run(dg.DagsterRun(job_name="index_versions", run_id=str(uuid.uuid4()),
                                           tags={LEASES_TAG: json.dumps([[t, a] for t, a in pairs])}))
        run = instance.add_run(dg.DagsterRun(job_name="index_versions", run_id=str(uuid.uuid4()), tags=tags))
        stored = instance.get_run_by_id(run.run_id)
        assert leases_of(stored.tags) == sorted(pairs)
        assert instance.get_runs(dg.RunsFilter(tags={"dagster/run_key": request.run_key}))[0].run_id == run.run_id
