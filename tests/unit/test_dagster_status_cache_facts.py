"""Two Dagster facts the README's "With history behind the live keys" rests on (issue #33).

If a Dagster upgrade changes either, that section and bench/scale/ui.py's reading of it must change too:
- the partitions tab's status cache is keyed by a hash of every dynamic partition key, so each key the
  claiming sensor adds makes the next request rebuild the cache from the asset's whole history;
- the open-source SQL event log storages (PostgreSQL's included) cannot wipe single partitions, so pruned
  keys' materializations cannot be removed through Dagster's API to bound that history.
"""

import dagster as dg
import pytest
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from dagster_postgres.event_log.event_log import PostgresEventLogStorage


def test_a_new_dynamic_key_changes_the_status_cache_identity():
    versions = dg.DynamicPartitionsDefinition(name="versions")
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("versions", ["v1"])
        before = versions.get_serializable_unique_identifier(instance)
        assert versions.get_serializable_unique_identifier(instance) == before  # stable while keys stay
        instance.add_dynamic_partitions("versions", ["v2"])
        assert versions.get_serializable_unique_identifier(instance) != before


def test_sql_event_log_storage_cannot_wipe_single_partitions():
    assert PostgresEventLogStorage.wipe_asset_partitions is SqlEventLogStorage.wipe_asset_partitions
    with dg.DagsterInstance.ephemeral() as instance:
        assert isinstance(instance.event_log_storage, SqlEventLogStorage)
        with pytest.raises(NotImplementedError):
            instance.wipe_asset_partitions(dg.AssetKey("parsed_document"), ["v1"])
