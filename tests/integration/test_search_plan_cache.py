"""A long-lived connection keeps searching the graph: no generic plan after psycopg prepares search_hits.

psycopg prepares a statement server-side after 5 runs on a connection; PostgreSQL then may switch to a
generic plan that knows neither the tenant nor k and sorts every candidate row exhaustively (measured:
~45 ms instead of ~3 ms at 20k chunks, recall pinned at exactly 1.0, i.e. no graph walk). search_settings
forces a custom plan inside the search transaction.
"""

from __future__ import annotations

import numpy as np

from bench.scale.search import seed
from resources.database import Database
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder
from resources.search import search

PREPARED_SEARCH = """
SELECT generic_plans, custom_plans FROM pg_prepared_statements
WHERE statement LIKE '%relaxed AS MATERIALIZED%'
"""


def test_search_never_runs_the_generic_plan_on_a_reused_connection(db_url):
    seed(db_url, 6000, 24, 100, 0, lambda line: None, np.random.default_rng(3))
    one_connection = Database(db_url, min_size=1, max_size=1)
    fake = FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    try:
        for i in range(20):
            assert len(search(one_connection, fake, f"question {i}", tenant_id="t-huge", k=10)) == 10
        with one_connection.session() as s:
            rows = s.conn.execute(PREPARED_SEARCH).fetchall()
    finally:
        one_connection.close()
    assert rows, "psycopg prepared search_hits (the situation this test is about)"
    generic, custom = rows[0]
    assert generic == 0 and custom >= 15, rows


def test_the_graph_is_built_with_the_parameters_bench_scale_measured(db_url):
    """Migration 0021: m = 24, ef_construction = 100 (recall@10 >= 0.95 of exact at 1M chunks)."""
    import psycopg

    with psycopg.connect(db_url) as conn:
        (definition,) = conn.execute("SELECT pg_get_indexdef('chunk_embedding_hnsw_idx'::regclass)").fetchone()
    assert "vector_cosine_ops" in definition and "m='24'" in definition and "ef_construction='100'" in definition
