"""The lexical analyzer per profile (issue #35, migration 0045): a profile created with ``english`` publishes
stemmed terms in the fenced transaction, search, the backfill and the quality gate read the profile's analyzer,
a new install's default profile is ``english`` (migration 0047) while a profile row from before keeps
``wordpiece``, and the CLI sets and shows it."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from pipelines.domain.lexical import CJK_BASE, LexicalParams, word_id
from resources import profiles
from resources.embedder import FakeEmbedder, checked_embed
from resources.index_sink import IndexSink
from resources.lexical import backfill_lexical_index
from resources.search import search
from resources.task_queue import TaskQueue
from tests.integration.test_lexical_index import pieces

MODEL = "fake-384"
EVAL_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "eval" / "small-en"
DOCS = {
    "engine": "The engine runs on diesel fuel.",
    "harbour": "The harbour office opens at nine.",
    "refunds": "Refunds are paid within thirty days; 退款将在十四天内退回。",
}


@pytest.fixture
def fake() -> FakeEmbedder:
    return FakeEmbedder(model_name=MODEL)


@pytest.fixture
def english(db, db_url):
    """The active profile on the fake model with ``wordpiece`` (as an install that indexed before migration 0047
    keeps it) and a building ``english`` profile beside it."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = %s, lexical_analyzer = 'wordpiece' WHERE is_active", (MODEL,))
    return profiles.create_profile(db, "english", model=MODEL, lexical=LexicalParams(analyzer="english"))


@pytest.fixture
def indexed(db, publisher, english, fake):
    """Every document published once and indexed under both profiles through the real fenced publish."""
    queue = TaskQueue(db, lease_seconds=120)
    sink = IndexSink(db, queue)
    for name, text in DOCS.items():
        publisher.publish("acme", name, text.encode(), f"{name}.txt")
    while claimed := queue.claim("test-worker", limit=8):
        for task in claimed:
            chunks = pieces("acme", task.document_id, task.version_number, [DOCS[task.document_id]], task.profile)
            vectors = checked_embed(fake, [c.embed_text for c in chunks], expected_model=MODEL, expected_dim=384,
                                    batch_size=8)
            sink.publish(task.lease, chunks, vectors)


def terms(db_url: str, profile: str, document: str, version: int = 1) -> list[int]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT terms FROM lexical_chunk WHERE profile = %s AND document_id = %s"
                            " AND version_number = %s", (profile, document, version)).fetchone()[0]


def test_a_new_installs_profile_is_english_and_the_column_is_checked(db, db_url):
    assert db.fetch_one("index_profile_active")["lexical_analyzer"] == "english"
    with psycopg.connect(db_url, autocommit=True) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE index_profile SET lexical_analyzer = 'porter'")


def test_an_english_profile_publishes_stemmed_terms_and_matches_other_inflections(db, db_url, indexed, fake):
    english_terms, wordpiece_terms = terms(db_url, "english", "engine"), terms(db_url, "minilm-v1", "engine")
    assert word_id("run") in english_terms and word_id("engin") in english_terms
    assert word_id("the") not in english_terms and word_id("on") not in english_terms, "stop words"
    assert all(t < CJK_BASE for t in wordpiece_terms), "the default profile's rows are word pieces as before"
    mixed = terms(db_url, "english", "refunds")
    assert CJK_BASE + ord("退") in mixed and word_id("refund") in mixed, "CJK n-grams kept beside the words"

    def lexical(query: str) -> list[str]:
        return [h.document_id for h in search(db, fake, query, tenant_id="acme", mode="lexical")]

    assert lexical("runs") == ["engine"], "the same inflection matches under word pieces"
    assert lexical("running") == [], "word pieces: 'running' shares no term with 'runs'"
    profiles.activate_profile(db, "english", force=True)
    assert lexical("running") == ["engine"], "search analyses the query with the active profile's analyzer"
    assert lexical("refund") == ["refunds"] and lexical("退款") == ["refunds"]
    assert [h.document_id for h in search(db, fake, "running engines", tenant_id="acme", mode="hybrid")][0] == "engine"
    profiles.rollback_profile(db)
    assert lexical("running") == [], "back to the word-piece rows and statistics"


def test_the_backfill_writes_rows_with_the_profiles_analyzer(db, db_url, indexed):
    before = {p: terms(db_url, p, "engine") for p in ("minilm-v1", "english")}
    with psycopg.connect(db_url, autocommit=True) as conn:  # as migration 0022 finds chunks without lexical rows
        conn.execute("DELETE FROM lexical_chunk; DELETE FROM lexical_term_stats; DELETE FROM lexical_document")
        conn.execute("INSERT INTO lexical_backfill DEFAULT VALUES")
    assert backfill_lexical_index(db) == 2 * len(DOCS)
    assert {p: terms(db_url, p, "engine") for p in before} == before


def test_the_gate_scores_and_records_each_profiles_analyzer(db, english):
    embedders = {MODEL: FakeEmbedder(model_name=MODEL)}
    eval_set = profiles.load_eval_set(EVAL_DIR)
    shadow = db.fetch_one("index_profile_get", {"name": "english"})
    own = profiles.evaluate_profile(shadow, eval_set, mode="lexical")
    as_wordpiece = profiles.evaluate_profile({**shadow, "lexical_analyzer": "wordpiece"}, eval_set, mode="lexical")
    assert own.ndcg != pytest.approx(as_wordpiece.ndcg), "the analyzers must rank small-en differently"

    assert shadow["lexical_analyzer"] == "english"
    gate = profiles.run_gate(db, "english", EVAL_DIR, tolerance=1.0, embedders=embedders)
    assert (gate["lexical_analyzer"], gate["baseline_lexical_analyzer"]) == ("english", "wordpiece")
    hybrid = profiles.evaluate_profile(shadow, eval_set, embedder=embedders[MODEL])
    assert gate["shadow_ndcg"] == pytest.approx(hybrid.ndcg), "the gate scored the shadow with its own analyzer"
    listed = {p["name"]: p for p in profiles.list_profiles(db)}
    assert listed["english"]["gate"]["lexical_analyzer"] == "english"


def test_cli_create_with_an_analyzer_and_list_shows_analyzer_and_fusion(cli):
    result = cli("profile", "create", "wp", "--model", MODEL, "--analyzer", "wordpiece", "--fusion", "rrf", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["lexical_analyzer"] == "wordpiece"
    result = cli("profile", "create", "plain", "--model", MODEL, "--json")
    assert json.loads(result.output)["lexical_analyzer"] == "english", "the CLI's default is the measured best"
    result = cli("profile", "create", "bad", "--model", MODEL, "--analyzer", "porter")
    assert result.exit_code != 0 and "analyzer must be one of wordpiece, english" in " ".join(result.output.split())

    rows = {r["name"]: r for r in json.loads(cli("profile", "list", "--json").output)}
    assert (rows["wp"]["lexical_analyzer"], rows["wp"]["fusion"], rows["wp"]["rrf_k"]) == ("wordpiece", "rrf", 60)
    assert (rows["minilm-v1"]["lexical_analyzer"], rows["minilm-v1"]["fusion"]) == ("english", "weighted")
    table = " ".join(cli("profile", "list").output.split())
    assert "wp: search hybrid (rrf k 60, lexical weight 0.5), lexical analyzer wordpiece" in table, table
    assert "minilm-v1: search hybrid (weighted, lexical weight 0.5), lexical analyzer english" in table, table


def test_a_copied_version_gets_lexical_rows_of_its_own_profiles_analyzer(db, db_url, publisher, indexed):
    """A metadata-only change copies chunks and vectors within each profile (resources/chunk_copy.py), never lexical
    rows: the publish writes them again with the profile's analyzer."""
    from resources.chunk_copy import FastPublish
    from resources.publisher import Publisher

    fast = Publisher(db, publisher.blobs, fast=FastPublish(db, TaskQueue(db, lease_seconds=60)))
    v2 = fast.publish("acme", "engine", DOCS["engine"].encode(), "engine.txt", metadata={"dept": "fleet"})
    assert v2.version == 2
    got = {p: terms(db_url, p, "engine", 2) for p in ("english", "minilm-v1")}
    assert got == {"english": terms(db_url, "english", "engine"), "minilm-v1": terms(db_url, "minilm-v1", "engine")}
    assert word_id("run") in got["english"] and all(t < CJK_BASE for t in got["minilm-v1"])
