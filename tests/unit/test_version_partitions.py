"""VersionPartitions resolves a key range like Dagster does, without listing every key (issue #14)."""

import dagster as dg
import pytest
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

from pipelines.partitions import VersionPartitions

NAME = "versions_test"


@pytest.fixture(params=["sql", "custom"])
def instance(request, tmp_path):
    # "custom": a `storage: custom` DagsterStorage, as dagster.yaml names KbindexDagsterStorage (the
    # instance uses the SQL event storage inside it).
    overrides = {} if request.param == "sql" else {"storage": {"custom": {
        "module": "dagster._core.storage.sqlite_storage", "class": "DagsterSqliteStorage",
        "config": {"base_dir": str(tmp_path)}}}}
    with dg.instance_for_test(overrides=overrides) as inst:
        inst.add_dynamic_partitions(NAME, ["a", "b", "c", "d", "e", "other"])
        inst.delete_dynamic_partition(NAME, "c")
        inst.add_dynamic_partitions(NAME, ["c"])  # moved to the end, as the sensor moves a retried key
        inst.add_dynamic_partitions("another_def", ["x", "y"])
        yield inst


@pytest.mark.parametrize("start,end", [("a", "e"), ("b", "b"), ("d", "c"), ("a", "c"), ("e", "b")])
def test_a_range_resolves_as_dagster_does(instance, start, end):
    ours, dagsters = VersionPartitions(name=NAME), dg.DynamicPartitionsDefinition(name=NAME)
    key_range = dg.PartitionKeyRange(start, end)
    with partition_loading_context(dynamic_partitions_store=instance):
        expected = dagsters.get_partition_keys_in_range(key_range)
        calls = []
        original = SqlEventLogStorage.get_dynamic_partitions
        SqlEventLogStorage.get_dynamic_partitions = lambda *a, **k: calls.append(a) or original(*a, **k)
        try:
            assert ours.get_partition_keys_in_range(key_range) == expected
        finally:
            SqlEventLogStorage.get_dynamic_partitions = original
    assert calls == [], "the range was resolved by listing every key"


def test_a_range_with_a_missing_end_is_refused_as_dagster_does(instance):
    with partition_loading_context(dynamic_partitions_store=instance), pytest.raises(
            dg.DagsterInvalidInvocationError, match="Nonexistent partition keys"):
        VersionPartitions(name=NAME).get_partition_keys_in_range(dg.PartitionKeyRange("a", "zz"))


def test_without_an_instance_it_falls_back_to_dagster():
    with pytest.raises(Exception, match="instance is not available"):
        VersionPartitions(name=NAME).get_partition_keys_in_range(dg.PartitionKeyRange("a", "b"))


def test_once_bounded_dagsters_own_definition_resolves_a_runs_range_without_listing_every_key(instance, monkeypatch):
    """The daemon's path (bench.scale.runs --daemon found it growing with the key count): when it creates a run, it
    records the run's planned materializations with the code location snapshot's plain definition, never
    VersionPartitions. KbindexDagsterStorage bounds that definition's ranges in every process on our instance."""
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    from resources import dagster_private

    monkeypatch.setattr(dg.DynamicPartitionsDefinition, "get_partition_keys_in_range",
                        dg.DynamicPartitionsDefinition.get_partition_keys_in_range)  # put back after the test
    plain = dg.DynamicPartitionsDefinition(name=NAME)
    run = dg.DagsterRun(job_name="index_versions", run_id="r" * 32,
                        tags={ASSET_PARTITION_RANGE_START_TAG: "b", ASSET_PARTITION_RANGE_END_TAG: "c"})
    with partition_loading_context(dynamic_partitions_store=instance):
        expected = sorted(run.get_resolved_partitions_subset_for_events(plain).get_partition_keys())
        assert dagster_private.bound_dynamic_ranges() and dagster_private.bound_dynamic_ranges()  # idempotent
        calls = []
        original = SqlEventLogStorage.get_dynamic_partitions
        monkeypatch.setattr(SqlEventLogStorage, "get_dynamic_partitions",
                            lambda *a, **k: calls.append(a) or original(*a, **k))
        got = sorted(run.get_resolved_partitions_subset_for_events(plain).get_partition_keys())
        unnamed = dg.DynamicPartitionsDefinition(lambda _: ["p", "q"])  # no name: Dagster's own, unchanged
        assert unnamed.get_partition_keys_in_range(dg.PartitionKeyRange("p", "q")) == ["p", "q"]
    assert got == expected == ["b", "c", "d", "e", "other"]
    assert calls == [], "the range was resolved by listing every key"
