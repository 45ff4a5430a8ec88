"""One dynamic partition per document version (key ``tenant/document_id/vN``, see domain.partition_keys).

A run covers a contiguous range of these keys (the claiming sensor adds each run's keys together).
Dagster resolves such a range by listing *every* key of the definition and slicing it: about 15
times per run (the run's planned events, each step's output and input version checks, each
``context.partition_keys``), 0.2-0.3 s each at 100k keys (issue #14). ``VersionPartitions``
resolves it with two bounded queries on Dagster's own ``dynamic_partitions`` table instead (the
range's ends, then the rows between their ids: the same insertion order Dagster slices), so a
run's Dagster overhead no longer grows with the corpus. Wherever that table is not reachable (a
non-SQL storage), Dagster's own resolution is used unchanged; so it is, with a warning, if a Dagster
upgrade moved the private symbols these queries use (resources/dagster_private.py).
"""

from collections.abc import Sequence

import dagster as dg

from resources import dagster_private

VERSIONS_PARTITIONS_NAME = "document_versions"


class VersionPartitions(dg.DynamicPartitionsDefinition):
    """A named DynamicPartitionsDefinition whose key ranges cost O(range), not O(all keys)."""

    def get_partition_keys_in_range(self, partition_key_range: dg.PartitionKeyRange) -> Sequence[str]:
        def dagsters() -> Sequence[str]:
            return super(VersionPartitions, self).get_partition_keys_in_range(partition_key_range)

        if self.name is None:
            return dagsters()
        return dagster_private.partition_keys_in_range(
            self.name, partition_key_range.start, partition_key_range.end, public=dagsters)


document_versions = VersionPartitions(name=VERSIONS_PARTITIONS_NAME)
