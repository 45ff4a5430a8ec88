"""The HTTP reranker against the local fake server (bench/fake_embedding_server.py): both answer shapes, every
fault mapped to the HTTP providers' stable codes after bounded retries, every answer checked, the key and
transport rules of HTTP embedding providers. Nothing here calls a real provider."""

from __future__ import annotations

import math

import pytest

from bench.fake_embedding_server import FakeEmbeddingServer, overlap_score
from pipelines.domain.errors import EmbeddingInvalidResponse, EmbeddingUnavailable, InvalidRequest
from resources.http_embedder import ProviderConfig
from resources.http_reranker import HttpReranker, check_reranker, parse_rerank, rerank_endpoint

QUERY = "refund claim receipt"
DOCS = ["The harbour office opens at nine.", "A refund claim needs the receipt.", "Refunds within thirty days.",
        "Keep every receipt for a refund."]


def reranker(server: FakeEmbeddingServer, tmp_path, api_key_env: str | None = None, **options) -> HttpReranker:
    kwargs = {"timeout": 0.5, "max_attempts": 2, "backoff": 0.01, "window_seconds": 60.0, **options}
    return HttpReranker(ProviderConfig(url=server.url, model="fake-rerank", api_key_env=api_key_env), home=tmp_path, **kwargs)


@pytest.mark.parametrize("shape", ["cohere", "tei"])
def test_both_answer_shapes_rank_the_documents_by_the_servers_scores(tmp_path, shape, monkeypatch):
    monkeypatch.setenv("KBINDEX_EMBED_KEY_RERANK", "not-a-real-key")
    with FakeEmbeddingServer(rerank_shape=shape) as server:
        ranked = reranker(server, tmp_path, api_key_env="KBINDEX_EMBED_KEY_RERANK").rerank(QUERY, DOCS)
        (record,) = server.stats()["records"]
    expected = sorted(range(len(DOCS)), key=lambda i: (-overlap_score(QUERY, DOCS[i]), i))
    assert [i for i, _ in ranked] == expected and expected[0] == 1
    assert [s for _, s in ranked] == pytest.approx([overlap_score(QUERY, DOCS[i]) for i in expected])
    assert (record["kind"], record["query"], record["documents"], record["auth"]) == ("rerank", QUERY, DOCS, True)


@pytest.mark.parametrize(
    ("fault", "code", "requests"),
    [
        ("rate_limit", "EMBEDDING_RATE_LIMITED", 2),
        ("timeout", "EMBEDDING_TIMEOUT", 2),
        ("drop", "EMBEDDING_UNAVAILABLE", 2),
        ("unavailable", "EMBEDDING_UNAVAILABLE", 2),
        ("wrong_dimension", "EMBEDDING_INVALID_RESPONSE", 1),  # an index out of range
        ("wrong_count", "EMBEDDING_INVALID_RESPONSE", 1),  # an index twice
        ("nan", "EMBEDDING_INVALID_RESPONSE", 1),
    ],
)
def test_each_fault_raises_the_http_providers_stable_code_after_bounded_retries(tmp_path, fault, code, requests):
    with FakeEmbeddingServer(faults={fault: 1.0}, retry_after=0.05, hang=2.0) as server:
        with pytest.raises(Exception) as info:
            reranker(server, tmp_path).rerank(QUERY, DOCS)
        records = server.stats()["records"]
    assert getattr(info.value, "code", None) == code, info.value
    assert len(records) == requests, "transient faults retried max_attempts times, bad answers never"


def test_a_reversed_answer_is_valid_and_comes_back_best_first(tmp_path):
    with FakeEmbeddingServer(faults={"shuffled": 1.0}) as server:
        ranked = reranker(server, tmp_path).rerank(QUERY, DOCS)
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)


@pytest.mark.parametrize(
    "payload",
    [
        {"results": [{"index": 0, "relevance_score": 1.0}, {"index": 0, "relevance_score": 0.5}]},  # duplicate
        {"results": [{"index": 2, "relevance_score": 1.0}]},  # out of range
        {"results": [{"index": -1, "relevance_score": 1.0}]},
        {"results": [{"index": True, "relevance_score": 1.0}]},
        {"results": [{"index": "0", "relevance_score": 1.0}]},
        {"results": [{"index": 0, "relevance_score": math.inf}]},
        {"results": [{"index": 0, "relevance_score": "high"}]},
        {"results": [{"index": 0}]},  # no score
        [{"index": 0, "score": 1.0}, {"index": 1, "score": 0.5}, {"index": 1, "score": 0.1}],  # more than documents
        {"data": []},
        "nonsense",
        [1, 2],
    ],
)
def test_a_bad_answer_is_refused(payload):
    with pytest.raises(EmbeddingInvalidResponse):
        parse_rerank(payload, 2)


def test_a_partial_answer_is_accepted_and_sorted():
    assert parse_rerank([{"index": 1, "score": 0.2}, {"index": 0, "score": 0.9}], 3) == [(0, 0.9), (1, 0.2)]


def test_the_recipe_is_checked_like_an_http_embedding_providers(monkeypatch):
    monkeypatch.delenv("KBINDEX_EMBED_HTTP_HOSTS", raising=False)
    monkeypatch.delenv("KBINDEX_EMBED_KEY_VARS", raising=False)
    ok = ProviderConfig(url="http://127.0.0.1:8080", model="BAAI/bge-reranker-base")
    check_reranker(ok, 50)
    for config, candidates, match in [
        (ProviderConfig(url="http://reranker.internal:8080", model="m"), 50, "https"),
        (ProviderConfig(url="https://api.example.com", model="m", api_key_env="AWS_SECRET_ACCESS_KEY"), 50, "KBINDEX_EMBED_KEY_"),
        (ProviderConfig(url="https://api.example.com", model="m", api_key_env="sk-123 456"), 50, "NAME"),
        (ProviderConfig(url="https://user:pw@api.example.com", model="m"), 50, "credentials"),
        (ProviderConfig(url="ftp://api.example.com", model="m"), 50, "http"),
        (ProviderConfig(url="https://api.example.com", model=" "), 50, "model"),
        (ok, 0, "candidates"),
        (ok, 201, "candidates"),
    ]:
        with pytest.raises(InvalidRequest, match=match):
            check_reranker(config, candidates)
    assert rerank_endpoint("http://h:8080/") == "http://h:8080/rerank"
    assert rerank_endpoint("https://api.cohere.com/v2/rerank") == "https://api.cohere.com/v2/rerank"


def test_a_missing_key_fails_before_anything_is_sent(tmp_path, monkeypatch):
    monkeypatch.delenv("KBINDEX_EMBED_KEY_ABSENT", raising=False)
    with FakeEmbeddingServer() as server:
        with pytest.raises(EmbeddingUnavailable, match="KBINDEX_EMBED_KEY_ABSENT"):
            reranker(server, tmp_path, api_key_env="KBINDEX_EMBED_KEY_ABSENT").rerank(QUERY, DOCS)
        assert server.stats()["records"] == []
