"""GET /search says what the active profile's reranker did (issue #35): ``reranked`` null without one, true in its
order, false with ``rerank_error`` (the stable code) when it failed and the hits are in the unreranked order."""

from __future__ import annotations

from bench.fake_embedding_server import FakeEmbeddingServer
from resources.profiles import set_rerank
from tests.api.conftest import ACME, index_task, publish

TEXTS = {"a.md": "the harbour office opens at nine", "b.md": "refund claim receipt: the order number is needed"}


def test_search_reports_the_rerank_stage(client, db, queue, embedder, tmp_path, monkeypatch):
    monkeypatch.setenv("KBINDEX_HOME", str(tmp_path))
    monkeypatch.setenv("KBINDEX_PROVIDER_TIMEOUT_SECONDS", "0.5")
    for name, text in TEXTS.items():
        task = publish(client, name, text.encode(), filename=name).json()
        index_task(db, queue, embedder, task["task_id"], [text])
    body = client.get("/search", params={"q": "refund claim receipt"}, headers=ACME).json()
    assert (body["reranked"], body["rerank_error"]) == (None, None)

    with FakeEmbeddingServer() as server:
        set_rerank(db, "minilm-v1", url=server.url, model="fake-rerank", candidates=10, force=True)
        body = client.get("/search", params={"q": "refund claim receipt"}, headers=ACME).json()
        assert [r["kind"] for r in server.stats()["records"]] == ["rerank"]
    assert (body["reranked"], body["rerank_error"]) == (True, None)
    assert body["hits"][0]["document_id"] == "b.md"

    with FakeEmbeddingServer(faults={"unavailable": 1.0}) as broken:
        set_rerank(db, "minilm-v1", url=broken.url, model="fake-rerank", candidates=10, force=True)
        response = client.get("/search", params={"q": "refund claim receipt"}, headers=ACME)
    assert response.status_code == 200
    body = response.json()
    assert (body["reranked"], body["rerank_error"]) == (False, "EMBEDDING_UNAVAILABLE")
    assert {h["document_id"] for h in body["hits"]} == set(TEXTS)
