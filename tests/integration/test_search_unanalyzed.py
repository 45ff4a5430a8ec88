"""Search on tables PostgreSQL has not analyzed yet (a fresh install in its first minute, a restored database):
the planner then guesses one row per table, and a statement whose shape it may turn around can read the whole
tenant once per candidate. A hybrid search's cross-scoring statement must stay a probe per candidate."""

from __future__ import annotations

import json

import psycopg
import pytest

from bench.retrieval.__main__ import TENANT, Corpus, index_corpus
from pipelines.domain.metadata import EVERYTHING
from resources.database import Session
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder
from resources.search import search
from sql import queries
from tests.plans import rows_read, walk

DOCUMENTS = 300
CORPUS_TABLES = ("chunk", "search_pointer", "lexical_posting", "lexical_chunk")


@pytest.fixture
def unanalyzed(db, db_url, tmp_path):
    """DOCUMENTS one-paragraph documents indexed through the product's path, autovacuum kept off their tables so
    they stay never analyzed while the test looks."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        for table in CORPUS_TABLES:
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    texts = {f"para-{i:04d}.txt": f"Paragraph {i}. Policy {i % 97} applies to team {i % 13}." for i in range(DOCUMENTS)}
    index_corpus(db, Corpus("paragraphs", texts, {}, {}), FakeEmbedder(model_name=DEFAULT_MODEL_NAME), 64, tmp_path)
    with psycopg.connect(db_url) as conn:
        analyzed = conn.execute("SELECT relname FROM pg_stat_user_tables WHERE relname = ANY(%s) AND "
                                "(last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)",
                                [list(CORPUS_TABLES)]).fetchall()
    assert analyzed == [], "the situation this test is about: no statistics yet"
    return db


def test_the_cross_scores_of_a_hybrid_search_probe_each_candidate_without_statistics(unanalyzed, db_url,
                                                                                     monkeypatch):
    """lexical_scores_of reads at most one posting and one pointer per (candidate, term), whatever the tenant
    holds. As a plain join to search_pointer the planner, guessing one pointer, put the pointers outside and
    probed every candidate's postings once per pointer: 300 documents, 37,800 posting probes for 126."""
    sent: list[tuple[str, dict]] = []
    real = Session._run

    def spy(self, name, params):
        sent.append((name, params))
        return real(self, name, params)

    monkeypatch.setattr(Session, "_run", spy)
    fake = FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    hits = search(unanalyzed, fake, "policy applies team", tenant_id=TENANT, k=10, mode="hybrid", read=EVERYTHING)
    assert len(hits) == 10
    params = next(p for name, p in sent if name == "lexical_scores_of")
    probes = len(params["chunk_ids"]) * len(params["candidates"])
    assert probes > 0
    with psycopg.connect(db_url) as conn:
        from pgvector.psycopg import register_vector

        register_vector(conn)
        (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries["lexical_scores_of"], params).fetchone()
    nodes = list(walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]))
    read = {table: sum(rows_read(n) for n in nodes if n.get("Relation Name") == table)
            for table in ("lexical_posting", "search_pointer")}
    assert read["lexical_posting"] <= probes and read["search_pointer"] <= probes, (read, probes)
