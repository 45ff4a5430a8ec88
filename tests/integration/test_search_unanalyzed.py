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


def _sent(monkeypatch) -> list[tuple[str, dict]]:
    """The statements (name, parameters) the searches after this call send, in order."""
    sent: list[tuple[str, dict]] = []
    real = Session._run

    def spy(self, name, params):
        sent.append((name, params))
        return real(self, name, params)

    monkeypatch.setattr(Session, "_run", spy)
    return sent


def _rows_read(db_url: str, name: str, params: dict) -> dict[str, int]:
    """Rows each corpus table gave the statement's plan, EXPLAIN ANALYZE run with the parameters a search sent."""
    with psycopg.connect(db_url) as conn:
        from pgvector.psycopg import register_vector

        register_vector(conn)
        (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries[name], params).fetchone()
    nodes = list(walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]))
    return {table: sum(rows_read(n) for n in nodes if n.get("Relation Name") == table) for table in CORPUS_TABLES}


def test_the_bm25_walk_reads_only_its_terms_postings_without_statistics(unanalyzed, db_url, monkeypatch):
    """lexical_hits walks each chosen term's postings by index. As a plain join to q the planner, guessing one
    posting, read every posting of the tenant and kept the terms' by a join filter."""
    sent = _sent(monkeypatch)
    fake = FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    hits = search(unanalyzed, fake, "policy 42 team 7", tenant_id=TENANT, k=10, mode="lexical", read=EVERYTHING)
    assert hits
    name, params = next((n, p) for n, p in sent if n.startswith("lexical_hits"))
    terms_postings = sum(params["candidate_dfs"])
    with psycopg.connect(db_url) as conn:
        (all_postings,) = conn.execute("SELECT count(*) FROM lexical_posting").fetchone()
    assert terms_postings * 2 < all_postings, "the situation this test is about: the terms are a small share"
    assert _rows_read(db_url, name, params)["lexical_posting"] <= terms_postings, (name, terms_postings)


def test_the_cross_scores_of_a_hybrid_search_probe_each_candidate_without_statistics(unanalyzed, db_url,
                                                                                     monkeypatch):
    """lexical_scores_of reads at most one posting and one pointer per (candidate, term), whatever the tenant
    holds. As a plain join to search_pointer the planner, guessing one pointer, put the pointers outside and
    probed every candidate's postings once per pointer: 300 documents, 37,800 posting probes for 126."""
    sent = _sent(monkeypatch)
    fake = FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    hits = search(unanalyzed, fake, "policy applies team", tenant_id=TENANT, k=10, mode="hybrid", read=EVERYTHING)
    assert len(hits) == 10
    params = next(p for name, p in sent if name == "lexical_scores_of")
    probes = len(params["chunk_ids"]) * len(params["candidates"])
    assert probes > 0
    read = _rows_read(db_url, "lexical_scores_of", params)
    assert read["lexical_posting"] <= probes and read["search_pointer"] <= probes, (read, probes)
