"""One dynamic partition per document version (key ``tenant/document_id/vN``, see domain.partition_keys)."""

import dagster as dg

VERSIONS_PARTITIONS_NAME = "document_versions"
document_versions = dg.DynamicPartitionsDefinition(name=VERSIONS_PARTITIONS_NAME)
