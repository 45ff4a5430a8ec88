"""The CI-sized round of bench/scale/ui.py: the UI's own partition-health and asset-graph queries,
sent to a real ``dagster dev``, see exactly the live keys (not the corpus), and one prune deletes
exactly the keys past the lineage window, leaving the live ones. Timings are the bench's business."""

from __future__ import annotations

import psycopg
import pytest

from bench.scale.ui import run
from resources.local_postgres import with_database

pytestmark = pytest.mark.slow


def test_ui_queries_see_the_live_keys_and_prune_leaves_them(pg_server_url, tmp_path, monkeypatch):
    for name in ("KBINDEX_DATABASE_URL", "KBINDEX_BLOB_URL", "KBINDEX_ARTIFACTS", "KBINDEX_HOME", "DAGSTER_PG_URL"):
        monkeypatch.setenv(name, "")  # run() points these at its round (product_instance: DAGSTER_PG_URL); restored
    rounds, pruned = run(pg_server_url, tmp_path, versions=1500, live_counts=[200, 500], prune=120, repeat=1,
                         history=300)

    assert [r.live_keys for r in rounds] == [200, 500]
    for r in rounds:
        assert set(r.health) == {"parsed_document", "document_chunks", "chunk_embeddings", "search_index"}
        # the status cache caught up, and the 300 pruned keys' materializations behind it are not counted
        assert all(n == r.live_keys for n in r.materialized.values()), r.materialized
        assert r.numbers and all(n == r.live_keys for n in r.numbers.values()), r.numbers  # graph: live keys only
        assert all(t.response_bytes > 0 for t in r.health.values())
        assert set(r.after_new_key) == set(r.health)  # each tab measured again after one more key
        assert all(first > 0 and after > 0 for first, after in r.after_new_key.values())
    assert pruned is not None
    assert pruned.deleted == 120
    assert {name: keys for name, (keys, _) in pruned.by_storage.items()} == {  # 4 runs of 30, alternating
        "kbindex storage": 60, "dagster_postgres": 60}
    assert pruned.keys_left == 500  # the lineage window's keys survive the prune (and each round's probe key went)
    assert pruned.recorded_left == 500  # kbindex forgot exactly the deleted keys

    with psycopg.connect(with_database(pg_server_url, "ui_dg")) as conn:  # the history is really there
        (events,) = conn.execute(
            "SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'").fetchone()
    assert events == 4 * (500 + 120 + 300)  # live, pruned by the round, and the history: pruning kept all events
