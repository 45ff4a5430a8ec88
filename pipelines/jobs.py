"""The indexing job: the four assets, in one process per run (resources set up once per run)."""

import dagster as dg

from pipelines.assets import indexing_assets
from pipelines.partitions import document_versions

index_versions_job = dg.define_asset_job(
    name="index_versions",
    selection=dg.AssetSelection.assets(*indexing_assets),
    partitions_def=document_versions,
    executor_def=dg.in_process_executor,
    description="Parse, chunk, embed and publish the claimed document versions (one or many per run).",
)
