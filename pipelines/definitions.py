"""The kbindex code location: one Definitions object (``dagster dev -m pipelines.definitions``)."""

import warnings

import dagster as dg

# backfill_policy is marked beta; it is what lets one run cover many versions. Don't warn on every load.
warnings.filterwarnings("ignore", category=dg.BetaWarning)

from pipelines.artifact_sweep_job import sweep_artifacts_hourly, sweep_artifacts_job
from pipelines.assets import indexing_assets
from pipelines.jobs import index_versions_job
from pipelines.lineage_job import backfill_profile_job, prune_lineage_keys_job, prune_lineage_keys_when_due
from pipelines.quality_gate import gate_assets, gate_jobs
from pipelines.retention_job import apply_retention_hourly, apply_retention_job
from pipelines.sensors import CLAIMING_SENSORS, record_crashed_runs
from pipelines.source_sensor import sync_sources
from resources.dagster_resources import default_resources

defs = dg.Definitions(
    assets=[*indexing_assets, *gate_assets],
    jobs=[index_versions_job, apply_retention_job, prune_lineage_keys_job, backfill_profile_job, *gate_jobs,
          sweep_artifacts_job],
    schedules=[apply_retention_hourly, sweep_artifacts_hourly],
    sensors=[*CLAIMING_SENSORS, record_crashed_runs, prune_lineage_keys_when_due],
    resources=default_resources(),
    # Every job, the UI's implicit asset job included (backfills, "Materialize"), runs its steps in one
    # process: one IndexingRun holds the run's leases from parse to publish (issue #12, defect 10).
    executor=dg.in_process_executor,
)
# Sources (issue 29): the sync sensor joins on lines of its own, beside the claiming sensor's.
defs = dg.Definitions.merge(defs, dg.Definitions(sensors=[sync_sources]))
