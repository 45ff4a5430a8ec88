"""Hybrid fusion chosen per profile (issue #35): search fuses by the active profile's ``fusion`` on the real
database, changing it re-indexes nothing, a changed fusion makes the gate stale, and the CLI flags."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from pipelines.domain.errors import IllegalTransition
from pipelines.domain.lexical import fuse, fuse_rrf
from resources import profiles
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder, checked_embed
from resources.index_sink import IndexSink
from resources.search import hybrid_depth, search
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
QUERIES = ["refund claim receipt", "harbour office hours", "thirty days refund", "desk closes"]


@pytest.fixture
def fake() -> FakeEmbedder:
    return FakeEmbedder(model_name=DEFAULT_MODEL_NAME)  # stands in for the default profile's model


@pytest.fixture
def indexed(db, publisher):
    """One document per text under the active profile, through the real fenced publish."""
    queue = TaskQueue(db, lease_seconds=120)
    sink = IndexSink(db, queue)
    embedder = FakeEmbedder(model_name=DEFAULT_MODEL_NAME)
    for i, text in enumerate(TEXTS):
        publisher.publish("acme", f"doc{i}", text.encode(), f"doc{i}.txt")
        (claimed,) = queue.claim("test-worker", limit=1)
        vectors = checked_embed(embedder, [text], expected_model=DEFAULT_MODEL_NAME, expected_dim=384, batch_size=8)
        sink.publish(claimed.lease, pieces("acme", f"doc{i}", claimed.version_number, [text]), vectors)


def _expected(db, fake, query: str, fusion: str) -> list[tuple[str, float]]:
    """What each fusion makes of the two sides' own answers (search's dense and lexical modes at the hybrid depth)."""
    depth = hybrid_depth(10)
    dense = {h.chunk_id: h.score for h in search(db, fake, query, tenant_id="acme", k=depth, mode="dense")}
    lexical = {h.chunk_id: h.score for h in search(db, fake, query, tenant_id="acme", k=depth, mode="lexical")}
    if fusion == "rrf":
        return fuse_rrf(dense, lexical, 60, 0.5)[:10]
    return fuse(dense, lexical, 0.5)[:10]  # every chunk is a candidate of the dense side here: both scored


def test_a_profile_with_rrf_returns_rrf_ordered_hybrid_results(db, db_url, indexed, fake):
    chunks_before = _count(db_url)
    weighted = {q: [(h.chunk_id, h.score) for h in search(db, fake, q, tenant_id="acme", mode="hybrid")] for q in QUERIES}
    for q in QUERIES:
        assert [c for c, _ in weighted[q]] == [c for c, _ in _expected(db, fake, q, "weighted")], q

    row = profiles.set_fusion(db, "minilm-v1", fusion="rrf", rrf_k=60, force=True)
    assert (row["fusion"], row["rrf_k"], row["is_active"]) == ("rrf", 60, True)
    assert _count(db_url) == chunks_before, "query-time only: nothing re-indexed"
    differs = 0
    for q in QUERIES:
        hits = search(db, fake, q, tenant_id="acme", mode="hybrid")
        expected = _expected(db, fake, q, "rrf")
        assert [h.chunk_id for h in hits] == [c for c, _ in expected], q
        assert [h.score for h in hits] == pytest.approx([s for _, s in expected]), q
        differs += [h.chunk_id for h in hits] != [c for c, _ in weighted[q]]
    assert differs, "the data must tell the fusions apart, or this test proves nothing"
    # The profile's default mode is hybrid: a search without a mode fuses by the profile's choice too.
    assert [h.chunk_id for h in search(db, fake, QUERIES[0], tenant_id="acme")] == [c for c, _ in _expected(db, fake, QUERIES[0], "rrf")]

    profiles.set_fusion(db, "minilm-v1", fusion="weighted", force=True)
    assert [(h.chunk_id, h.score) for h in search(db, fake, QUERIES[0], tenant_id="acme", mode="hybrid")] == weighted[QUERIES[0]]


def test_a_search_reads_the_profile_in_its_own_transaction_and_starts_over_when_it_changed(
        db, db_url, indexed, fake, monkeypatch):
    """A process that has seen the active profile sends no index_profile_active of its own (one round trip less
    over a slow link): the search reads it with its first statements. A change made by another process is seen
    by the next search, which starts over under the new profile and answers as it says."""
    import resources.search as search_module

    search(db, fake, QUERIES[0], tenant_id="acme")  # this process has now seen the profile
    alone: list[str] = []
    real_fetch_one = type(db).fetch_one
    monkeypatch.setattr(type(db), "fetch_one",
                        lambda self, name, params=None: alone.append(name) or real_fetch_one(self, name, params))
    search(db, fake, QUERIES[0], tenant_id="acme", mode="dense")
    assert alone == [], "read in the search's own transaction"
    tries: list[str] = []
    real_under = search_module._search_under
    monkeypatch.setattr(search_module, "_search_under", lambda db, embedder, profile, *a:
                        tries.append(profile["fusion"]) or real_under(db, embedder, profile, *a))
    weighted = search(db, fake, QUERIES[0], tenant_id="acme", mode="hybrid")
    assert (alone, tries) == ([], ["weighted"])
    with psycopg.connect(db_url, autocommit=True) as conn:  # another process changes the active profile
        conn.execute("UPDATE index_profile SET fusion = 'rrf', rrf_k = 60 WHERE is_active")
    hits = search(db, fake, QUERIES[0], tenant_id="acme", mode="hybrid")
    assert (alone, tries) == ([], ["weighted", "weighted", "rrf"]), "started over once, under the new profile"
    expected = _expected(db, fake, QUERIES[0], "rrf")
    assert [(h.chunk_id, h.score) for h in hits] == [(c, pytest.approx(s)) for c, s in expected]
    assert [h.score for h in hits] != [h.score for h in weighted]
    search(db, fake, QUERIES[0], tenant_id="acme", mode="hybrid")
    assert tries[-1] == "rrf" and len(tries) == 6 and alone == [], "the next search starts from the new profile"


def test_a_search_whose_profile_changes_at_every_try_gives_up_and_one_with_none_active_is_refused(
        db, db_url, indexed, fake, monkeypatch):
    import resources.search as search_module
    from pipelines.domain.errors import InternalError, InvalidRequest

    search(db, fake, QUERIES[0], tenant_id="acme")  # this process has now seen the profile
    real_under = search_module._search_under
    tries: list[int] = []

    def changed_every_time(*a):
        hits, active = real_under(*a)
        tries.append(1)
        return hits, {**active, "rrf_k": 100 + len(tries)}  # as if activated again each time

    monkeypatch.setattr(search_module, "_search_under", changed_every_time)
    with pytest.raises(InternalError, match="changed during each of 3 tries"):
        search(db, fake, QUERIES[0], tenant_id="acme")
    assert len(tries) == search_module.PROFILE_TRIES == 3
    monkeypatch.undo()
    with psycopg.connect(db_url, autocommit=True) as conn:  # another process leaves no profile active
        conn.execute("UPDATE index_profile SET is_active = false")
    with pytest.raises(InvalidRequest, match="no active index profile"):
        search(db, fake, QUERIES[0], tenant_id="acme")


def _count(db_url: str) -> tuple[int, int]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT (SELECT count(*) FROM chunk), (SELECT count(*) FROM lexical_chunk)").fetchone()


def test_the_active_profiles_fusion_changes_only_with_force_and_is_recorded(db):
    with pytest.raises(IllegalTransition, match="without a quality gate"):
        profiles.set_fusion(db, "minilm-v1", fusion="rrf")
    assert db.fetch_one("index_profile_active")["fusion"] == "weighted"
    profiles.set_fusion(db, "minilm-v1", fusion="rrf", rrf_k=30, force=True)
    event = db.fetch_all("index_profile_events", {"profile": "minilm-v1"})[-1]
    assert event["action"] == "fusion" and event["forced"]
    assert (event["detail"]["from"]["fusion"], event["detail"]["to"]["fusion"], event["detail"]["to"]["rrf_k"]) == ("weighted", "rrf", 30)


def test_a_fusion_change_after_the_gate_makes_it_stale_and_the_gate_scores_the_profiles_fusion(db, db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    profiles.create_profile(db, "shadow", model="fake-384")  # no documents: coverage is complete
    embedders = {"fake-384": FakeEmbedder(model_name="fake-384")}
    gate = profiles.run_gate(db, "shadow", EVAL_DIR, tolerance=1.0, embedders=embedders)
    assert (gate["fusion"], gate["passed"]) == ("weighted", True)
    assert gate["shadow_ndcg"] == pytest.approx(gate["active_ndcg"]), "same recipe, same fusion, same score"

    profiles.set_fusion(db, "shadow", fusion="rrf", rrf_k=5)  # a shadow profile: no --force needed
    with pytest.raises(IllegalTransition, match="fusion changed after its latest gate"):
        profiles.activate_profile(db, "shadow")

    gate = profiles.run_gate(db, "shadow", EVAL_DIR, tolerance=1.0, embedders=embedders)
    assert (gate["fusion"], gate["rrf_k"]) == ("rrf", 5)
    assert gate["shadow_ndcg"] != pytest.approx(gate["active_ndcg"]), "the gate scored the shadow's own fusion"
    assert profiles.activate_profile(db, "shadow")["name"] == "shadow"


def test_cli_create_and_fusion_flags(cli):
    result = cli("profile", "create", "rrf-one", "--model", "fake-384", "--fusion", "rrf", "--rrf-k", "20", "--json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)
    assert (row["fusion"], row["rrf_k"]) == ("rrf", 20)

    result = cli("profile", "fusion", "rrf-one", "--fusion", "weighted", "--lexical-weight", "0.3")
    assert result.exit_code == 0, result.output
    assert "fusion weighted, lexical weight 0.3 (gate it again before activating)" in " ".join(result.output.split())

    result = cli("profile", "fusion", "minilm-v1", "--fusion", "rrf")
    assert result.exit_code == 3, result.output  # the active profile: refused without --force
    result = cli("profile", "fusion", "minilm-v1", "--fusion", "rrf", "--rrf-k", "0", "--force")
    assert result.exit_code != 0 and "rrf_k" in result.output
    result = cli("profile", "create", "bad", "--model", "fake-384", "--fusion", "max")
    assert result.exit_code != 0 and "fusion must be one of weighted, rrf" in " ".join(result.output.split())
    result = cli("profile", "fusion", "minilm-v1", "--fusion", "rrf", "--force", "--json")
    assert result.exit_code == 0 and json.loads(result.output)["fusion"] == "rrf"
