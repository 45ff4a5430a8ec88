"""The CI-sized round of bench/scale/runs.py: a tick and its run over a few thousand existing partition
keys index every version, kbindex itself never makes the Dagster calls that probe or list
partition keys per version (has_dynamic_partition per key, add_asset_metadata's per-call listing),
and nothing in the tick or the run lists every key (Dagster's key-range resolution included: see
pipelines/partitions.py)."""

from __future__ import annotations

import dagster as dg
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

from bench.scale.runs import measure

ROOT = str(__import__("pathlib").Path(__file__).resolve().parents[2])


def test_a_tick_and_its_run_over_many_existing_keys(pg_server_url, tmp_path, monkeypatch):
    calls: list[str] = []
    original = dg.DagsterInstance.has_dynamic_partition

    def probed(self, *args, **kwargs):  # Dagster's own run creation probes each key of a range; kbindex must not
        import traceback

        ours = [f for f in traceback.extract_stack()
                if f"{ROOT}/pipelines/" in f.filename or f"{ROOT}/resources/" in f.filename]
        # context.partition_keys (Dagster's accessor: it probes the range's two ends) is Dagster's own
        # cost, bounded because the live key set is (prune_lineage_keys); anything else is ours.
        if ours and "partition_keys" not in (ours[-1].line or ""):
            calls.append(f"{ours[-1].filename}:{ours[-1].lineno}")
        return original(self, *args, **kwargs)

    def listed(self, *args, **kwargs):  # the public call lists every key of the corpus each time
        raise AssertionError("context.add_asset_metadata(partition_key=...) is O(corpus) per call")

    listings: list[str] = []
    original_list = SqlEventLogStorage.get_dynamic_partitions

    def listing(self, *args, **kwargs):  # O(all keys): ~15 per run at Dagster's defaults (issue #14)
        import traceback

        listings.append("".join(traceback.format_stack(limit=8)))
        return original_list(self, *args, **kwargs)

    monkeypatch.setattr(SqlEventLogStorage, "get_dynamic_partitions", listing)
    monkeypatch.setattr(dg.DagsterInstance, "has_dynamic_partition", probed)
    monkeypatch.setattr(dg.AssetExecutionContext, "add_asset_metadata", listed)
    for name in ("KBINDEX_DATABASE_URL", "KBINDEX_BLOB_URL", "KBINDEX_ARTIFACTS", "KBINDEX_HOME"):
        monkeypatch.setenv(name, "")  # measure() points these at its round; restored after the test
    result = measure(pg_server_url, keys=3000, versions=12, workdir=tmp_path)
    assert result.succeeded == 12
    assert calls == []
    assert listings == [], listings[0]
