"""What each version pays in one run, counted, does not grow with the run's versions (issue #34).

A run of small documents is only worth holding thousands of versions if nothing it writes per version
grows with their number. Through the four assets in process (bench/per_version.py's counting, fake
embedder): Dagster writes exactly one materialization (and one data-version tag row) per version and
asset, its other events are per run; the task view gets a fixed number of progress rows per version (one per
stage, and the embed stage's start and end), plus the run's adoption and the final transition; and the
fenced publish transaction's statements are per batch.
"""

from __future__ import annotations

import pytest

from bench.per_version import measure_run

STAGES = 4  # parse, chunk, embed, publish
PROGRESS_ROWS = 5  # parse 0/1, chunk 0/1, embed 0/n when embedding starts, embed n/n, publish 0/1


@pytest.fixture
def counts_of(db_url, dagster_pg_url, kb_env, fake_profile):
    return lambda n, tenant: measure_run(db_url, dagster_pg_url, n, tenant=tenant)


@pytest.mark.timeout(300)
def test_a_run_writes_per_version_a_fixed_number_of_progress_rows_and_one_materialization_per_asset(counts_of):
    small, large = counts_of(3, "small"), counts_of(12, "large")
    for c in (small, large):
        assert c.succeeded == c.versions
        # "embed 0/n" is kept although the run-ahead pass may finish the version before "embed n/n": it is
        # what shows a version as embedding while it embeds (and what the daemon e2e test waits for to kill
        # a run mid-embed).
        assert c.task_events == {"progress": PROGRESS_ROWS * c.versions, "run": c.versions, "transition": c.versions}, \
            dict(c.task_events)
        assert c.dagster_events["ASSET_MATERIALIZATION"] == STAGES * c.versions
        assert c.asset_event_tags == STAGES * c.versions
    per_run = {k: v for k, v in large.dagster_events.items() if k != "ASSET_MATERIALIZATION"}
    assert per_run == {k: v for k, v in small.dagster_events.items() if k != "ASSET_MATERIALIZATION"}, \
        "Dagster events besides the materializations grew with the run's versions"
    assert small.publish_statements == large.publish_statements  # one fenced transaction per batch
    assert small.statements["task_progress_many"] == large.statements["task_progress_many"]


def test_a_versions_materialization_carries_its_own_metadata_not_the_runs_counts(counts_of):
    """Dagster copies a partitioned result's metadata into every version's event: the run's counts per outcome
    were n copies of one run figure. They are a log line per step now; each version keeps its own figures."""
    c = counts_of(3, "meta")
    assert c.succeeded == 3
    assert c.metadata_labels, "no materialization metadata read"
    assert not any(label.startswith("tasks_") for label in c.metadata_labels), sorted(c.metadata_labels)
    assert {"task_id", "profile", "outcome", "seconds", "chunks", "vectors", "model", "chunk_count"} <= c.metadata_labels
