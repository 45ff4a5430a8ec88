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
from tests.plans import rows_read, walk

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


# Statements of a search that read no table of the corpus: their plan is the same for every parameter.
NO_CORPUS_TABLE = {"index_profile_active", "search_snapshot", "search_settings"}


def named(statement: str) -> str:
    """The name of the sql/queries statement psycopg prepared as ``statement`` (%(x)s numbered $n by first use)."""
    import re

    from sql import queries

    def prepared_text(query: str) -> str:
        order = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", query)))
        return re.sub(r"%\((\w+)\)s", lambda m: f"${order.index(m.group(1)) + 1}", query).replace("%%", "%")

    return next((name for name, query in queries.items() if prepared_text(query) == statement), statement[:80])


def test_no_search_statement_of_any_mode_runs_a_generic_plan_on_a_reused_connection(db_url):
    """Every statement a search runs in its transaction, in each mode and with a filter, is planned for its own
    parameters (issue #33): 20 searches of each kind on one connection, then the prepared statements' counts."""
    from pipelines.domain.metadata import ReadScope

    seed(db_url, 6000, 24, 100, 0, lambda line: None, np.random.default_rng(3))
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:  # the seeded vocabulary is word-piece-sized ids, which
        conn.execute("UPDATE index_profile SET lexical_analyzer = 'wordpiece'")  # the query's pieces then hit
    one_connection = Database(db_url, min_size=1, max_size=1)
    fake = FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    kinds = [("dense", None), ("lexical", None), ("hybrid", None), ("dense", ReadScope.of(filters=["dept=hr"])),
             ("hybrid", ReadScope.of(filters=["dept=hr"]))]
    try:
        for i in range(20):
            for mode, read in kinds:
                search(one_connection, fake, f"question {i} the of and", tenant_id="t-huge", k=10, mode=mode, read=read)
        with one_connection.session() as s:
            rows = s.conn.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements").fetchall()
    finally:
        one_connection.close()
    prepared = {named(statement): (generic, custom) for statement, generic, custom in rows}
    assert {"search_hits", "lexical_stats_get", "lexical_hits", "lexical_hits_all_pointers", "lexical_scores_of",
            "search_hits_scoped"} <= prepared.keys(), prepared
    generic = {name: counts for name, counts in prepared.items() if counts[0] and name not in NO_CORPUS_TABLE}
    assert not generic, f"search statements that ran a generic plan: {generic}"


def test_bm25_of_given_chunks_probes_their_postings_instead_of_walking_the_terms(db_url):
    """lexical_scores_of (the dense candidates' BM25 in a hybrid search) reads at most one posting per
    (chunk, term): planned as a join, it walked every posting of the query's terms (7,934 for 26 matches at
    1M chunks)."""
    import json

    import psycopg

    from sql import queries

    seed(db_url, 6000, 24, 100, 0, lambda line: None, np.random.default_rng(3))
    with psycopg.connect(db_url) as conn:
        terms = [t for (t,) in conn.execute(
            "SELECT term FROM lexical_term_stats WHERE tenant_id = 't-huge' AND term >= 0 ORDER BY df DESC LIMIT 3")]
        ids = [c for (c,) in conn.execute(
            "SELECT c.chunk_id FROM chunk c JOIN search_pointer p USING (tenant_id, document_id, profile, version_number)"
            " WHERE c.tenant_id = 't-huge' ORDER BY c.chunk_id LIMIT 20")]
        postings = conn.execute("SELECT count(*) FROM lexical_posting WHERE tenant_id = 't-huge' AND term = ANY(%s)",
                                (terms,)).fetchone()[0]
        params = {"candidates": terms, "candidate_idfs": [1.0] * len(terms), "k1": 1.2, "b": 0.75, "avg_length": 60.0,
                  "chunk_ids": ids, "tenant_id": "t-huge", "profile": "minilm-v1", "see_all": True, "principals": [],
                  "filters": "[]"}
        (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries["lexical_scores_of"], params).fetchone()[0]
        scored = conn.execute(queries["lexical_scores_of"], params).fetchall()
    plan = plan if isinstance(plan, dict) else json.loads(plan)[0]
    assert scored, "some of the chunks hold one of the terms"
    assert postings > 10 * len(ids) * len(terms), "a walk of the terms would read far more than the probes"
    read = sum(rows_read(n) for n in walk(plan["Plan"]) if n.get("Relation Name") == "lexical_posting")
    assert read <= len(ids) * len(terms), f"{read} postings read for {len(ids)} chunks x {len(terms)} terms"
