"""The CI-sized round of bench/scale/migration.py: plain indexing of fresh publishes, then a migration
started with the UI's own launch mutation for ``backfill_profile``, built by the claiming sensor in
ordinary bounded indexing runs from real blobs. Asserts the mechanisms; timings are the bench's."""

from __future__ import annotations

import pytest

from bench.scale.migration import run
from pipelines.sensors import BATCH_MAX

pytestmark = [pytest.mark.slow, pytest.mark.soak]  # ~3-5 min: `python -m pytest -m soak`
VERSIONS, PLAIN = 400, 40


def test_a_migration_launched_from_the_ui_is_built_in_bounded_runs(pg_server_url, tmp_path, monkeypatch):
    for name in ("KBINDEX_DATABASE_URL", "KBINDEX_BLOB_URL", "KBINDEX_ARTIFACTS", "KBINDEX_HOME",
                 "KBINDEX_LEASE_SECONDS"):
        monkeypatch.setenv(name, "")  # run() points these at its round; restored after the test
    result = run(pg_server_url, tmp_path, VERSIONS, PLAIN, minutes=0.5)

    assert result.plain_runs.get("SUCCESS", 0) >= 1
    assert result.reindex_tasks == VERSIONS + PLAIN  # one REINDEX task per current version, in one statement
    assert result.backfill_run_status == "SUCCESS"  # the launchpad's run only asks for the backfill
    assert result.reindex_done > 0  # REINDEX runs re-parsed the versions' blobs and built them
    assert result.reindex_done <= BATCH_MAX * result.index_runs  # bounded runs, never one for the whole backlog
    assert result.index_runs >= 2
    assert not result.retried, result.retried  # every task built at its first attempt
    assert result.equal_vectors == 0  # the shadow fake is salted: its graph inserts are new elements
