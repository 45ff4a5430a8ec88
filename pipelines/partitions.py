"""One dynamic partition per document version (key ``tenant/document_id/vN``, see domain.partition_keys).

A run covers a contiguous range of these keys (the claiming sensor adds each run's keys together).
Dagster resolves such a range by listing *every* key of the definition and slicing it: about 15
times per run (the run's planned events, each step's output and input version checks, each
``context.partition_keys``), 0.2-0.3 s each at 100k keys (issue #14). ``VersionPartitions``
resolves it with two bounded queries on Dagster's own ``dynamic_partitions`` table instead (the
range's ends, then the rows between their ids: the same insertion order Dagster slices), so a
run's Dagster overhead no longer grows with the corpus. Wherever that table is not reachable (a
non-SQL storage), Dagster's own resolution is used unchanged.
"""

from collections.abc import Sequence

import dagster as dg

VERSIONS_PARTITIONS_NAME = "document_versions"


class VersionPartitions(dg.DynamicPartitionsDefinition):
    """A named DynamicPartitionsDefinition whose key ranges cost O(range), not O(all keys)."""

    def get_partition_keys_in_range(self, partition_key_range: dg.PartitionKeyRange) -> Sequence[str]:
        storage = _sql_event_storage()
        if storage is None or self.name is None:
            return super().get_partition_keys_in_range(partition_key_range)
        return keys_in_range(storage, self.name, partition_key_range.start, partition_key_range.end)


def keys_in_range(storage, name: str, start: str, end: str) -> list[str]:
    """The keys from ``start`` to ``end`` in insertion order, as Dagster's slice of the full listing."""
    from dagster._core.errors import DagsterInvalidInvocationError
    from dagster._core.storage.event_log.schema import DynamicPartitionsTable as T
    from dagster._core.storage.sqlalchemy_compat import db_select

    import sqlalchemy as db

    named = T.c.partitions_def_name == name
    with storage.index_connection() as conn:
        ids = dict(conn.execute(db_select([T.c.partition, T.c.id]).where(
            db.and_(named, T.c.partition.in_([start, end])))).fetchall())
        missing = [k for k in (start, end) if k not in ids]
        if missing:
            raise DagsterInvalidInvocationError(
                f"Partition range {start} to {end} is not a valid range. Nonexistent partition keys: {missing}")
        if start == end:
            return [start]
        rows = conn.execute(db_select([T.c.partition]).where(
            db.and_(named, T.c.id.between(ids[start], ids[end]))).order_by(T.c.id)).fetchall()
    return [r[0] for r in rows]


def _sql_event_storage():
    """The SQL event storage of the instance Dagster is resolving partitions with, if any."""
    from dagster._core.definitions.partitions.context import partition_loading_context
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    with partition_loading_context() as ctx:
        store = ctx.dynamic_partitions_store
    instance = getattr(store, "instance", store)  # a CachingInstanceQueryer wraps the instance
    storage = getattr(instance, "event_log_storage", None)
    return storage if isinstance(storage, SqlEventLogStorage) else None


document_versions = VersionPartitions(name=VERSIONS_PARTITIONS_NAME)
