"""The CI-sized round of bench/scale/history.py: the copied runs are really in Dagster's storage behind the live
keys, the partitions tab sees the live keys only, and deleting them as prune_lineage_keys does takes every run
and every event of the history and nothing else. Timings are the bench's business."""

from __future__ import annotations

import psycopg
import pytest

from bench.scale.history import report, run
from resources.local_postgres import with_database

pytestmark = pytest.mark.slow


def test_the_history_runs_are_copied_then_deleted_with_all_their_events(pg_server_url, tmp_path, monkeypatch, capsys):
    for name in ("KBINDEX_DATABASE_URL", "KBINDEX_BLOB_URL", "KBINDEX_ARTIFACTS", "KBINDEX_HOME", "DAGSTER_PG_URL"):
        monkeypatch.setenv(name, "")  # run() points these at its round (product_instance: DAGSTER_PG_URL); restored
    before, after, deletion, per_run = run(pg_server_url, tmp_path, versions=500, live=150, history=240,
                                           run_size=12, repeat=1, batch_keys=60)

    assert per_run > 4 * 12  # a real run: step and run events besides one materialization per asset and version
    assert (deletion.runs, deletion.kept) == (20, 0)
    assert (deletion.events_before, deletion.events_after, deletion.runs_after) == (20 * per_run, 0, 0)
    # four prune batches of 60 keys, alternating between the project's storage and plain dagster_postgres
    assert {name: done[:2] for name, done in deletion.by_storage.items()} == {
        "kbindex storage": (120, 10), "dagster_postgres": (120, 10)}
    for r in (before, after):
        assert all(n == 150 for n in r.materialized.values()), r.materialized  # live keys only, either way
        assert set(r.after_new_key) == {"parsed_document", "document_chunks", "chunk_embeddings", "search_index"}
    with psycopg.connect(with_database(pg_server_url, "history_dg")) as conn:
        (runs,) = conn.execute("SELECT count(*) FROM runs").fetchone()
        (events,) = conn.execute(
            "SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'").fetchone()
    assert events == 4 * 150  # the live keys' materializations stay (run-less, as bench.scale.ui writes them)
    assert runs == 0  # the template run went too
    report(150, 240, 12, before, after, deletion, per_run)
    printed = capsys.readouterr().out
    assert "20 runs (0 kept)" in printed and "kbindex storage:" in printed and "dagster_postgres:" in printed
