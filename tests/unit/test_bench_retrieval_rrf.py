"""bench.retrieval prints reciprocal rank fusion of the dense and lexical rankings beside hybrid (README:
"It beat reciprocal rank fusion on our eval sets")."""

from __future__ import annotations

from types import SimpleNamespace

import bench.retrieval.__main__ as retrieval


def test_rrf_sums_reciprocal_ranks_and_breaks_ties_by_id():
    # c: 1/63 + 1/61 = 0.032266 > b: 1/62 + 1/62 = 0.032258 > a: 1/61
    assert retrieval.rrf(["a", "b", "c"], ["c", "b"], k=60) == ["c", "b", "a"]
    assert retrieval.rrf(["a", "b"], ["b", "a"]) == ["a", "b"]  # equal sums: by id
    assert retrieval.rrf(["x"], ["y"]) == ["x", "y"]
    assert retrieval.rrf() == []


def test_rank_queries_fuses_the_same_querys_dense_and_lexical_chunks(monkeypatch):
    ranked = {"dense": ["c1", "c2", "c3"], "lexical": ["c3", "c4"], "hybrid": ["c2"]}
    doc = {"c1": "d1", "c2": "d2", "c3": "d3", "c4": "d1"}

    def fake_search(db, embedder, query, *, tenant_id, k, mode):
        return [SimpleNamespace(chunk_id=c, document_id=doc[c]) for c in ranked[mode]]

    monkeypatch.setattr(retrieval, "search", fake_search)
    corpus = SimpleNamespace(name="t", queries={"q1": "question"})
    out = retrieval.rank_queries(None, None, corpus, ["q1"], chunk_k=50)
    rankings, latencies = out["rrf(dense,lexical)"]
    assert latencies == []  # untimed: it runs no query of its own
    assert rankings == {"q1": ["d3", "d1", "d2"]}  # c3 in both lists first; d1 by c1 (rank 1) before d2
    assert out["dense"][0]["q1"] == ["d1", "d2", "d3"] and len(out["dense"][1]) == 1
