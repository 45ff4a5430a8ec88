"""An HTTP reranker per profile (issue #35) on the real database, against the fake provider server: search returns
the reranker's order, falls back to the unreranked order with the stable code on every failure kind, never sends a
chunk the caller may not read, and the gate scores the profile through its reranker (a change makes it stale)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from bench.fake_embedding_server import FakeEmbeddingServer, overlap_score
from pipelines.domain.errors import IllegalTransition, InvalidRequest
from pipelines.domain.metadata import ReadScope
from resources import profiles
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder, checked_embed
from resources.http_embedder import ProviderConfig
from resources.http_reranker import HttpReranker
from resources.index_sink import IndexSink
from resources.search import search
from resources.task_queue import TaskQueue
from tests.integration.test_lexical_index import pieces

EVAL_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "eval" / "small-en"
TEXTS = [
    "Refunds are paid within thirty days of the claim.",
    "Refund refund refund: the desk handles every refund request.",
    "The harbour office opens at nine and closes at five.",
    "Claims about a late refund go to the harbour office.",
    "Receipts must be kept for seven years by law.",
    "The thirty day window starts when the claim is filed.",
    "Opening hours change in winter; the desk closes early.",
    "A refund claim needs the receipt and the order number.",
]
SECRET = "Secret refund claim receipt order number of the board."
QUERY = "refund claim receipt order number"
QUERIES = [QUERY, "when does the desk at the harbour office close", "is the refund paid in thirty days",
           "the claim is filed by the order of the law"]


@pytest.fixture
def fake() -> FakeEmbedder:
    return FakeEmbedder(model_name=DEFAULT_MODEL_NAME)


@pytest.fixture
def indexed(db, publisher):
    """One document per text under the active profile (and SECRET readable by group:board only), published."""
    queue = TaskQueue(db, lease_seconds=120)
    sink = IndexSink(db, queue)
    embedder = FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    docs = [(f"doc{i}", t, None) for i, t in enumerate(TEXTS)] + [("secret", SECRET, ["group:board"])]
    for doc, text, allow in docs:
        publisher.publish("acme", doc, text.encode(), f"{doc}.txt", allow=allow)
        (claimed,) = queue.claim("test-worker", limit=1)
        vectors = checked_embed(embedder, [text], expected_model=DEFAULT_MODEL_NAME, expected_dim=384, batch_size=8)
        sink.publish(claimed.lease, pieces("acme", doc, claimed.version_number, [text]), vectors)


def _reranker(server: FakeEmbeddingServer, tmp_path) -> HttpReranker:
    return HttpReranker(ProviderConfig(url=server.url, model="fake-rerank"), home=tmp_path, timeout=0.5,
                        max_attempts=2, backoff=0.01, window_seconds=60.0)


def test_search_returns_the_rerankers_order_of_the_profiles_candidates(db, indexed, fake, tmp_path, monkeypatch):
    monkeypatch.setenv("KBINDEX_HOME", str(tmp_path))
    plain = {q: search(db, fake, q, tenant_id="acme", k=3) for q in QUERIES}
    assert all(p.reranked is None and p.rerank_error is None for p in plain.values()), "no reranker: nothing said"
    with FakeEmbeddingServer() as server:
        profiles.set_rerank(db, "minilm-v1", url=server.url, model="fake-rerank", candidates=8, force=True)
        reranked = {q: search(db, fake, q, tenant_id="acme", k=3) for q in QUERIES}  # the profile's own reranker
        records = server.stats()["records"]
    differs = 0
    for q, record in zip(QUERIES, records, strict=True):
        candidates = search(db, fake, q, tenant_id="acme", k=8, reranker=_NoRerank())
        assert (record["query"], record["documents"]) == (q, [h.text for h in candidates]), "the top 8, in order"
        expected = sorted(candidates, key=lambda h: -overlap_score(q, h.text))[:3]
        hits = reranked[q]
        assert (hits.reranked, hits.rerank_error) == (True, None)
        assert [h.chunk_id for h in hits] == [h.chunk_id for h in expected], q
        differs += [h.chunk_id for h in hits] != [h.chunk_id for h in plain[q]]
    assert differs, "the data must tell the orders apart, or this test proves nothing"


class _NoRerank:
    """A reranker that keeps the order: what the candidates were before reranking."""

    def rerank(self, query, texts):
        return [(i, float(len(texts) - i)) for i in range(len(texts))]


class _Reverse:
    """A reranker that puts the candidates in the opposite order (best first, as every reranker answers)."""

    def rerank(self, query, texts):
        return [(i, float(i)) for i in reversed(range(len(texts)))]


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("timeout", "EMBEDDING_TIMEOUT"),
        ("unavailable", "EMBEDDING_UNAVAILABLE"),
        ("drop", "EMBEDDING_UNAVAILABLE"),
        ("rate_limit", "EMBEDDING_RATE_LIMITED"),
        ("wrong_dimension", "EMBEDDING_INVALID_RESPONSE"),
        ("wrong_count", "EMBEDDING_INVALID_RESPONSE"),
        ("nan", "EMBEDDING_INVALID_RESPONSE"),
    ],
)
def test_a_failing_reranker_falls_back_to_the_unreranked_order_and_says_so(db, indexed, fake, tmp_path, fault, code):
    plain = search(db, fake, QUERY, tenant_id="acme", k=3)
    with FakeEmbeddingServer(faults={fault: 1.0}, retry_after=0.05, hang=2.0) as server:
        profiles.set_rerank(db, "minilm-v1", url=server.url, model="fake-rerank", candidates=8, force=True)
        hits = search(db, fake, QUERY, tenant_id="acme", k=3, reranker=_reranker(server, tmp_path))
        assert server.stats()["records"], "the reranker was asked"
    assert (hits.reranked, hits.rerank_error) == (False, code)
    assert [(h.chunk_id, h.score) for h in hits] == [(h.chunk_id, h.score) for h in plain]


def test_a_chunk_the_caller_may_not_read_is_never_sent_to_the_reranker(db, indexed, fake, tmp_path):
    with FakeEmbeddingServer() as server:
        profiles.set_rerank(db, "minilm-v1", url=server.url, model="fake-rerank", candidates=50, force=True)
        reranker = _reranker(server, tmp_path)
        hits = search(db, fake, QUERY, tenant_id="acme", k=10, reranker=reranker)  # no principals: no allow-listed version
        board = search(db, fake, QUERY, tenant_id="acme", k=10, reranker=reranker, read=ReadScope.of(["group:board"]))
        outsider, member = server.stats()["records"]
    assert SECRET not in outsider["documents"] and len(outsider["documents"]) == len(TEXTS)
    assert "secret" not in {h.document_id for h in hits}
    assert SECRET in member["documents"], "the same search on behalf of the board does send it"
    assert "secret" in {h.document_id for h in board[:2]} and board.reranked


def test_the_gate_scores_a_profile_through_its_reranker_and_a_change_makes_it_stale(db, db_url, tmp_path, monkeypatch):
    monkeypatch.setenv("KBINDEX_HOME", str(tmp_path))
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    profiles.create_profile(db, "shadow", model="fake-384")  # no documents: coverage is complete
    embedders = {"fake-384": FakeEmbedder(model_name="fake-384")}
    with FakeEmbeddingServer() as server:
        profiles.set_rerank(db, "shadow", url=server.url, model="fake-rerank", candidates=5)  # shadow: no --force
        gate = profiles.run_gate(db, "shadow", EVAL_DIR, tolerance=1.0, embedders=embedders)
        asked = [r for r in server.stats()["records"] if r["kind"] == "rerank"]
    queries = sum(1 for line in (EVAL_DIR / "queries.jsonl").read_text().splitlines() if line.strip())
    assert len(asked) == queries and all(r["inputs"] == 5 for r in asked), "one request per query, 5 candidates"
    assert (gate["rerank_model"], gate["rerank_candidates"]) == ("fake-rerank", 5)
    shadow = db.fetch_one("index_profile_get", {"name": "shadow"})
    eval_set = profiles.load_eval_set(EVAL_DIR)
    reversed_ = profiles.evaluate_profile(shadow, eval_set, embedder=embedders["fake-384"], reranker=_Reverse())
    assert reversed_.ndcg < gate["shadow_ndcg"] - 0.05, "the reranker's order decides the score"

    with FakeEmbeddingServer(faults={"unavailable": 1.0}) as broken:  # a gate does not fall back: it fails
        profiles.set_rerank(db, "shadow", url=broken.url, model="fake-rerank", candidates=5)
        monkeypatch.setenv("KBINDEX_PROVIDER_TIMEOUT_SECONDS", "0.5")
        with pytest.raises(Exception) as info:
            profiles.evaluate_profile(db.fetch_one("index_profile_get", {"name": "shadow"}), eval_set,
                                      embedder=embedders["fake-384"],
                                      reranker=_reranker(broken, tmp_path))
    assert getattr(info.value, "code", None) == "EMBEDDING_UNAVAILABLE"

    profiles.set_rerank(db, "shadow", url=server.url, model="fake-rerank", candidates=6)
    with pytest.raises(IllegalTransition, match="reranker changed after its latest gate"):
        profiles.activate_profile(db, "shadow")


def test_the_active_profiles_reranker_changes_only_with_force_and_bad_recipes_are_refused(db):
    with pytest.raises(IllegalTransition, match="without a quality gate"):
        profiles.set_rerank(db, "minilm-v1", url="http://127.0.0.1:9/", model="m")
    with pytest.raises(InvalidRequest, match="https"):
        profiles.set_rerank(db, "minilm-v1", url="http://reranker.example:8080", model="m", force=True)
    with pytest.raises(InvalidRequest, match="candidates"):
        profiles.set_rerank(db, "minilm-v1", url="http://127.0.0.1:9", model="m", candidates=0, force=True)
    row = profiles.set_rerank(db, "minilm-v1", url="http://127.0.0.1:9", model="m", key_env="KBINDEX_EMBED_KEY_R",
                              force=True)
    assert (row["rerank_url"], row["rerank_candidates"], row["rerank_key_env"]) == ("http://127.0.0.1:9", 50, "KBINDEX_EMBED_KEY_R")
    event = db.fetch_all("index_profile_events", {"profile": "minilm-v1"})[-1]
    assert (event["action"], event["forced"], event["detail"]["to"]["rerank_model"]) == ("rerank", True, "m")
    assert profiles.set_rerank(db, "minilm-v1", url=None, force=True)["rerank_url"] is None


def test_the_cli_sets_shows_and_clears_a_reranker(db_url, monkeypatch):
    from pipelines.cli.app import app

    monkeypatch.setenv("KBINDEX_DATABASE_URL", db_url)
    runner = CliRunner()
    on = runner.invoke(app, ["profile", "rerank", "minilm-v1", "--url", "http://127.0.0.1:8080", "--model",
                             "BAAI/bge-reranker-base", "--candidates", "20", "--force"])
    assert on.exit_code == 0, on.output
    listed = runner.invoke(app, ["profile", "list"])
    assert "reranked by BAAI/bge-reranker-base at http://127.0.0.1:8080 (top 20)" in " ".join(listed.output.split())
    import json

    (active,) = [p for p in json.loads(runner.invoke(app, ["profile", "list", "--json"]).stdout) if p["is_active"]]
    assert active["rerank"] == {"url": "http://127.0.0.1:8080", "model": "BAAI/bge-reranker-base", "key_env": None,
                                "candidates": 20}
    assert runner.invoke(app, ["profile", "rerank", "minilm-v1", "--url", "http://127.0.0.1:8080", "--model", "m"]).exit_code == 3
    assert runner.invoke(app, ["profile", "rerank", "minilm-v1", "--off", "--url", "http://127.0.0.1:8080"]).exit_code != 0
    off = runner.invoke(app, ["profile", "rerank", "minilm-v1", "--off", "--force"])
    assert off.exit_code == 0 and "no reranker" in off.output


def test_cli_search_keeps_its_json_and_says_on_stderr_that_the_reranker_failed(db, db_url, indexed, tmp_path):
    import json

    from pipelines.cli.app import app

    runner = CliRunner()
    env = {"KBINDEX_DATABASE_URL": db_url, "KBINDEX_HOME": str(tmp_path)}
    args = ["search", QUERY, "--tenant", "acme", "-k", "3", "--mode", "lexical", "--json"]  # lexical: no model to load
    with FakeEmbeddingServer() as server:
        profiles.set_rerank(db, "minilm-v1", url=server.url, model="fake-rerank", candidates=8, force=True)
        good = runner.invoke(app, args, env=env)
        assert [r["kind"] for r in server.stats()["records"]] == ["rerank"]
    with FakeEmbeddingServer(faults={"unavailable": 1.0}) as broken:
        profiles.set_rerank(db, "minilm-v1", url=broken.url, model="fake-rerank", candidates=8, force=True)
        bad = runner.invoke(app, args, env=env)
        assert broken.stats()["records"], "the reranker was asked"
    assert good.exit_code == 0 and bad.exit_code == 0, (good.output, bad.output)
    assert len(json.loads(good.stdout)) == len(json.loads(bad.stdout)) == 3
    assert "rerank failed" not in good.stderr
    assert "rerank failed (EMBEDDING_UNAVAILABLE): results in the unreranked order" in " ".join(bad.stderr.split())
