"""The lexical (BM25) index: fenced with the chunks, statistics that follow the pointer, retention and
rollback, backfill, verify, and `kbindex search --mode` (issue #13)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from pipelines.domain.chunking import Chunk, VersionIdentity, chunk_id, content_digest
from pipelines.domain.lexical import MODES
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder, checked_embed
from resources.index_sink import IndexSink
from resources.lexical import backfill_lexical_index
from resources.migrations import LEXICAL_BACKFILL, migrate, pending
from resources.search import search
from resources.task_queue import TaskQueue
from resources.verifier import verify

PROFILE = "minilm-v1"
MODEL = DEFAULT_MODEL_NAME  # the default profile's model: the fake embedder stands in for it


def pieces(tenant: str, document: str, version: int, texts: list[str], profile: str = PROFILE) -> list[Chunk]:
    identity = VersionIdentity(tenant, document, version, profile)
    out = []
    for i, text in enumerate(texts):
        digest = content_digest(text)
        out.append(Chunk(chunk_id(identity, i, (document,), digest), i, (document,), None, text, text, 10, digest))
    return out


def vectors(texts: list[str]):
    return checked_embed(FakeEmbedder(model_name=MODEL), texts, expected_model=MODEL, expected_dim=384, batch_size=8)


def stats(db_url: str, tenant: str = "acme") -> dict[int, int]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT term, df FROM lexical_term_stats WHERE tenant_id = %s AND df <> 0 ORDER BY term", (tenant,)
        ).fetchall()
    return dict(rows)


def count(db_url: str, table: str, version: int) -> int:
    with psycopg.connect(db_url) as conn:
        return conn.execute(f"SELECT count(*) FROM {table} WHERE version_number = %s", (version,)).fetchone()[0]


@pytest.fixture
def queue(db) -> TaskQueue:
    return TaskQueue(db, lease_seconds=120)


@pytest.fixture
def fake() -> FakeEmbedder:
    return FakeEmbedder(model_name=MODEL)


@pytest.fixture
def index(db, queue, publisher):
    sink = IndexSink(db, queue)

    def make(tenant: str, document: str, texts: list[str], *, publish: bool = True):
        publisher.publish(tenant, document, "\n\n".join(texts).encode(), f"{document}.txt")
        (claimed,) = queue.claim("test-worker", limit=1)
        chunks = pieces(tenant, document, claimed.version_number, texts)
        if publish:
            sink.publish(claimed.lease, chunks, vectors(texts))
        return claimed, chunks

    return make


def assert_clean(db) -> None:
    report = verify(db)
    assert report.ok, report.to_dict()


def test_rows_are_written_with_the_chunks_and_statistics_follow_the_pointer(db, db_url, index, fake):
    index("acme", "refunds", ["Refunds take 30 days.", "The refund desk opens at nine.", "Keep the receipt."])
    one = stats(db_url)
    assert one[-1] == 3 and count(db_url, "lexical_chunk", 1) == 3
    assert_clean(db)
    index("acme", "refunds", ["Refunds take 14 days.", "退款将在十四天内退回。"])
    two = stats(db_url)
    assert two[-1] == 2, "only the pointed version counts"
    assert count(db_url, "lexical_chunk", 1) == 3, "the superseded version's rows stay with its chunks"
    assert_clean(db)
    hits = search(db, fake, "退款", tenant_id="acme", mode="lexical")
    assert [h.text for h in hits] == ["退款将在十四天内退回。"] and hits[0].version_number == 2
    index("globex", "refunds", ["Refunds take 30 days."])
    assert stats(db_url) == two, "another tenant has its own statistics"


def bounds(db_url: str, *, kept: bool) -> dict[int, tuple[int, float]]:
    """Each term's (largest tf, smallest length / tf): as the statistics keep it, or recounted over the
    pointed versions' lexical rows."""
    with psycopg.connect(db_url) as conn:
        return {t: (m, lt) for t, m, lt in conn.execute(
            "SELECT term, max_tf, min_length_per_tf FROM lexical_term_stats WHERE tenant_id = 'acme' AND term >= 0"
            if kept else
            "SELECT t.term, max(t.tf), min(l.length::float8 / t.tf) FROM lexical_chunk l JOIN search_pointer p"
            " USING (tenant_id, document_id, profile, version_number), unnest(l.terms, l.tfs) AS t (term, tf)"
            " WHERE l.tenant_id = 'acme' GROUP BY t.term").fetchall()}


def test_each_terms_bound_covers_the_pointed_versions_and_only_widens(db, db_url, index):
    """Publish keeps each term's largest tf and smallest length / tf (migration 0052) over the pointed
    versions; an edit that lowers a term's tf leaves its bound where it was (loose, never short), one that
    raises it widens it; reconciling again touches no statistics row; verify holds."""
    # The heading path (the document id) is indexed with each chunk: "handbook" adds one term to each length.
    index("acme", "handbook", ["refund refund refund policy", "the policy desk opens at nine every day"])
    assert bounds(db_url, kept=True) == bounds(db_url, kept=False)
    (term,) = [t for t, (m, _) in bounds(db_url, kept=True).items() if m == 3]
    assert bounds(db_url, kept=True)[term] == (3, pytest.approx(5 / 3))
    index("acme", "handbook", ["refund policy", "refund desk"])  # the term's df changes, its tf drops
    kept, now = bounds(db_url, kept=True), bounds(db_url, kept=False)
    assert now[term] == (1, 3.0) and kept[term] == (3, pytest.approx(5 / 3)), "loose, where the old version put it"
    assert all(kept[t][0] >= m and kept[t][1] <= lt for t, (m, lt) in now.items())
    index("acme", "handbook", ["refund " * 5 + "policy", "refund desk"])  # the same df, a higher tf
    assert bounds(db_url, kept=True)[term] == (5, pytest.approx(7 / 5)), "widened by the new version"
    with db.transaction() as tx:
        row = tx.fetch_one("lexical_stats_reconcile", {"tenant_id": "acme", "profile": PROFILE,
                                                       "document_ids": ["handbook"]})
    assert row["terms_changed"] == 0 and row["ledgers"] == 1
    assert_clean(db)


def test_a_superseded_publish_writes_no_lexical_rows(db, db_url, publisher, queue):
    sink = IndexSink(db, queue)
    v1 = publisher.publish("acme", "policy", b"one", "policy.md")
    v2 = publisher.publish("acme", "policy", b"two", "policy.md")
    leases = {c.lease.task_id: c for c in queue.claim("w1", limit=2)}
    newer, older = leases[v2.task_id], leases[v1.task_id]
    sink.publish(newer.lease, pieces("acme", "policy", 2, ["Version two text."]), vectors(["Version two text."]))
    before = stats(db_url)
    outcome = sink.publish(older.lease, pieces("acme", "policy", 1, ["Version one text."]), vectors(["Version one text."]))
    assert outcome.superseded and count(db_url, "lexical_chunk", 1) == 0 and stats(db_url) == before
    assert_clean(db)


def test_a_publish_failing_after_all_its_writes_leaves_neither_side_visible(db, db_url, index, queue, fake, monkeypatch):
    index("acme", "refunds", ["Refunds take 30 days."])
    before = stats(db_url)
    claimed, chunks = index("acme", "refunds", ["Refunds now take 14 days, harbour."], publish=False)

    def die(*args, **kwargs):  # everything is written (chunks, lexical rows, statistics): then the publish dies
        raise RuntimeError("killed before commit")

    monkeypatch.setattr(queue, "complete_published", die)
    with pytest.raises(RuntimeError):
        IndexSink(db, queue).publish(claimed.lease, chunks, vectors([c.text for c in chunks]))
    assert count(db_url, "chunk", 2) == 0 and count(db_url, "lexical_chunk", 2) == 0
    assert stats(db_url) == before
    for mode in MODES:
        assert {h.version_number for h in search(db, fake, "refunds take days harbour", tenant_id="acme", mode=mode)} == {1}
    assert search(db, fake, "harbour", tenant_id="acme", mode="lexical") == []


def _publish_and_hang(db_url: str, lease, texts: list[str], ready: str) -> None:
    """Child process: the whole publish transaction, then hang before commit until killed."""
    from resources.database import Database

    db = Database(db_url, max_size=2)
    queue = TaskQueue(db, lease_seconds=120)

    def hang(*args, **kwargs):
        Path(ready).write_text("written")
        time.sleep(600)

    queue.complete_published = hang  # type: ignore[method-assign]
    IndexSink(db, queue).publish(lease, pieces("acme", "refunds", 2, texts), vectors(texts))


def test_a_killed_publish_process_leaves_neither_side_visible(db, db_url, index, fake, tmp_path):
    index("acme", "refunds", ["Refunds take 30 days."])
    before = stats(db_url)
    texts = ["Refunds now take 14 days, harbour."]
    claimed, _ = index("acme", "refunds", texts, publish=False)
    ready = tmp_path / "ready"
    child = multiprocessing.get_context("spawn").Process(
        target=_publish_and_hang, args=(db_url, claimed.lease, texts, str(ready))
    )
    child.start()
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert child.is_alive() and time.monotonic() < deadline, "the child never reached the end of its writes"
            time.sleep(0.1)
        # Mid-transaction: readers see version 1 on both sides.
        assert {h.version_number for h in search(db, fake, "refunds harbour", tenant_id="acme")} == {1}
        assert search(db, fake, "harbour", tenant_id="acme", mode="lexical") == []
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    deadline = time.monotonic() + 30
    while count(db_url, "lexical_chunk", 2) and time.monotonic() < deadline:  # the server notices the dead client
        time.sleep(0.2)
    assert count(db_url, "chunk", 2) == 0 and count(db_url, "lexical_chunk", 2) == 0 and stats(db_url) == before
    for mode in MODES:
        assert {h.version_number for h in search(db, fake, "refunds harbour", tenant_id="acme", mode=mode)} == {1}


def test_retention_and_rollback_keep_the_statistics_right(db, db_url, index, fake):
    from resources.profiles import activate_profile, create_profile, rollback_profile
    from resources.retention import apply_retention

    index("acme", "refunds", ["Refunds take 30 days.", "Old desk hours."])
    index("acme", "refunds", ["Refunds take 14 days."])
    current = stats(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE superseded_version SET superseded_at = now() - interval '2 hours'")
    assert apply_retention(db, window_seconds=3600).chunks_deleted == 2
    assert count(db_url, "lexical_chunk", 1) == 0, "retention's delete cascades to the lexical rows"
    assert stats(db_url) == current
    assert_clean(db)
    before = search(db, fake, "refunds days", tenant_id="acme", mode="lexical")
    create_profile(db, "shadow", model="fake-384", chunk_tokens=64, overlap=8)
    activate_profile(db, "shadow", force=True)
    assert search(db, FakeEmbedder(), "refunds days", tenant_id="acme", mode="lexical") == [], "nothing indexed yet"
    rollback_profile(db)
    assert search(db, fake, "refunds days", tenant_id="acme", mode="lexical") == before
    assert_clean(db)


def test_backfill_writes_rows_for_chunks_indexed_before_the_lexical_index(db, db_url, index, fake):
    index("acme", "refunds", ["Refunds take 30 days.", "退款将在十四天内退回。"])
    index("acme", "desk", ["The refund desk opens at nine."])
    expected = stats(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:  # as migration 0022 finds a database indexed before it
        conn.execute("DELETE FROM lexical_chunk; DELETE FROM lexical_term_stats; DELETE FROM lexical_document")
        conn.execute("INSERT INTO lexical_backfill DEFAULT VALUES")
    assert "lexical_index_mismatch" in {v.check for v in verify(db).violations}
    assert LEXICAL_BACKFILL in pending(db_url)

    class Crash(Exception):
        pass

    def crash(written: int) -> None:
        raise Crash(written)

    with pytest.raises(Crash):  # the process dies after its first batch: that batch and its position are kept
        backfill_lexical_index(db, batch=2, on_batch=crash)
    assert count(db_url, "lexical_chunk", 1) == 2
    assert LEXICAL_BACKFILL in pending(db_url)
    migrate(db_url)  # resumes after the recorded position, finishes, removes the marker
    assert count(db_url, "lexical_chunk", 1) == 3
    assert pending(db_url) == []
    assert stats(db_url) == expected
    assert_clean(db)
    assert backfill_lexical_index(db) == 0


def test_cli_search_mode(db_url, index):
    from typer.testing import CliRunner

    from pipelines.cli import app

    index("acme", "handbook", ["Expense reports must be filed within thirty days.", "Parking is free."])
    runner = CliRunner()
    env = {"KBINDEX_DATABASE_URL": db_url}
    result = runner.invoke(app, ["search", "parking", "--tenant", "acme", "--mode", "lexical", "--json"], env=env)
    assert result.exit_code == 0, result.output
    (hit,) = json.loads(result.stdout)
    assert hit["text"] == "Parking is free."
    assert runner.invoke(app, ["search", "parking", "--tenant", "acme", "--mode", "fuzzy"], env=env).exit_code == 2


def test_the_gate_scores_the_mode_search_uses(db, db_url):
    from resources import profiles

    eval_dir = Path(__file__).resolve().parents[1] / "fixtures" / "eval" / "small-en"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    profiles.create_profile(db, "tiny", model="fake-384", chunk_tokens=16, overlap=0)
    tiny = db.fetch_one("index_profile_get", {"name": "tiny"})
    eval_set = profiles.load_eval_set(eval_dir)
    scores = {mode: profiles.evaluate_profile(tiny, eval_set, mode=mode) for mode in MODES}
    assert len({round(s.ndcg, 6) for s in scores.values()}) > 1, "the modes rank differently"
    row = profiles.run_gate(db, "tiny", eval_dir, tolerance=1)
    assert (row["mode"], row["baseline_mode"]) == ("hybrid", "hybrid"), "hybrid is what search uses by default"
    assert row["shadow_ndcg"] == pytest.approx(scores["hybrid"].ndcg)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET search_mode = 'lexical', bm25_k1 = 0.9 WHERE name = 'tiny'")
    row = profiles.run_gate(db, "tiny", eval_dir, tolerance=1)
    relexed = profiles.evaluate_profile(db.fetch_one("index_profile_get", {"name": "tiny"}), eval_set)
    assert row["mode"] == "lexical" and row["shadow_ndcg"] == pytest.approx(relexed.ndcg)


def test_a_migration_sets_the_search_mode_and_fusion_parameters_of_its_profile(db, db_url):
    from typer.testing import CliRunner

    from pipelines.cli import app
    from pipelines.domain.errors import InvalidRequest
    from pipelines.domain.lexical import LexicalParams
    from resources.profiles import create_profile

    env = {"KBINDEX_DATABASE_URL": db_url}
    result = CliRunner().invoke(app, ["profile", "create", "lexy", "--model", "fake-384", "--chunk-tokens", "64",
                                      "--overlap", "8", "--search-mode", "lexical", "--lexical-weight", "0.3",
                                      "--bm25-k1", "0.9", "--bm25-b", "0.4", "--json"], env=env)
    assert result.exit_code == 0, result.output
    row = db.fetch_one("index_profile_get", {"name": "lexy"})
    assert (row["search_mode"], row["lexical_weight"], row["bm25_k1"], row["bm25_b"]) == ("lexical", 0.3, 0.9, 0.4)
    assert create_profile(db, "plain", model="fake-384", chunk_tokens=64, overlap=8)["search_mode"] == "hybrid"
    for bad in (["--search-mode", "fuzzy"], ["--lexical-weight", "1.5"], ["--bm25-b", "-0.1"], ["--bm25-k1", "-1"]):
        result = CliRunner().invoke(app, ["profile", "create", "bad", "--model", "fake-384", *bad], env=env)
        assert result.exit_code == 2, (bad, result.output)
    assert db.fetch_one("index_profile_get", {"name": "bad"}) is None
    with pytest.raises(InvalidRequest):
        create_profile(db, "bad", model="fake-384", lexical=LexicalParams(search_mode="x"))


class _ShiftedPieces:
    """A tokenizer whose ids are the real ones + 1: what a changed term extraction does to a row's terms."""

    def __init__(self, real) -> None:
        self.real = real

    def pieces(self, text: str):
        return [(i + 1, s, e) for i, s, e in self.real.pieces(text)]


def _shifted(model: str):
    """The word-piece analysis of ``model`` with every id + 1 (``_ShiftedPieces``)."""
    from functools import partial

    from pipelines.domain.lexical import term_counts
    from resources.lexical import tokenizer_for

    return partial(term_counts, tokenizer=_ShiftedPieces(tokenizer_for(model)))


def postings(db_url: str) -> set[tuple[str, int]]:
    with psycopg.connect(db_url) as conn:
        return set(conn.execute("SELECT chunk_id, term FROM lexical_posting").fetchall())


def listed(db_url: str) -> set[tuple[str, int]]:
    with psycopg.connect(db_url) as conn:
        return set(conn.execute("SELECT chunk_id, unnest(terms) FROM lexical_chunk").fetchall())


def test_postings_go_with_their_rows_when_chunks_are_deleted(db, db_url, index, queue):
    """No foreign key carries the delete any more (migration 0025): the lexical row's trigger does."""
    claimed, chunks = index("acme", "refunds", ["Refunds take 30 days.", "Old desk hours.", "Keep receipts."])
    assert postings(db_url) == listed(db_url) and len(postings(db_url)) > 6
    with psycopg.connect(db_url, autocommit=True) as conn:  # what chunk_delete_stale and retention do
        conn.execute("DELETE FROM chunk WHERE chunk_id = %s", (chunks[1].chunk_id,))
    assert postings(db_url) == listed(db_url)
    assert not any(c == chunks[1].chunk_id for c, _ in postings(db_url))
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM chunk")
    assert postings(db_url) == set()


def test_a_rewritten_row_loses_exactly_the_postings_of_the_terms_it_lost(db, db_url, index):
    from resources.lexical import profile_analyzer, write_lexical

    claimed, chunks = index("acme", "refunds", ["Refunds take 30 days.", "The refund desk opens at nine."])
    before = postings(db_url)
    key = {"tenant_id": "acme", "document_id": "refunds", "profile": PROFILE, "version_number": claimed.version_number}
    with db.transaction() as tx:
        write_lexical(tx, [key] * 2, chunks, _shifted(MODEL))
    after = postings(db_url)
    assert after == listed(db_url) and after != before
    assert {c for c, _ in after} == {c.chunk_id for c in chunks}
    with db.transaction() as tx:  # and back: the same terms as a first write, nothing else
        write_lexical(tx, [key] * 2, chunks, profile_analyzer(db.fetch_one("index_profile_get", {"name": PROFILE})))
    assert postings(db_url) == before == listed(db_url)


def test_pruning_never_touches_a_row_of_another_version(db, db_url, index):
    """A chunk id clash (refused by the publish's row count): the other version's postings stay whole."""
    from resources.lexical import write_lexical

    claimed, chunks = index("acme", "refunds", ["Refunds take 30 days."])
    before = postings(db_url)
    other = {"tenant_id": "acme", "document_id": "refunds", "profile": PROFILE,
             "version_number": claimed.version_number + 1}
    with db.transaction() as tx:
        write_lexical(tx, [other], chunks, _shifted(MODEL))
    assert postings(db_url) == before == listed(db_url)


def _recording(tx, names: list[str]):
    """``tx`` with the names of the statements lexical_search runs on it recorded."""

    class Recording:
        def fetch_all(self, name, params=None):
            names.append(name)
            return tx.fetch_all(name, params)

        def submit(self, name, params=None):
            names.append(name)
            return tx.submit(name, params)

    return Recording()


def test_lexical_search_probes_the_best_chunks_first_and_reads_every_pointer_only_when_it_must(
    db, publisher, queue, monkeypatch
):
    """lexical_hits probes pointers in score order only; when its probes run out short of k (a reader who
    may read little, superseded versions) or under a metadata filter, lexical_hits_all_pointers answers.
    Every path gives the all-pointers answer: the same chunks, current and readable."""
    from pipelines.domain.lexical import LexicalParams
    from pipelines.domain.metadata import EVERYTHING, ReadScope
    from resources import lexical
    from resources.search import profile_analyzer

    sink = IndexSink(db, queue)
    for d in range(12):
        allow = ["group:finance"] if d % 3 else None  # a third open, the rest finance only
        for edit in range(2):  # version 1 superseded: its postings stay and score as high
            text = f"Refund policy {d}: refunds of grade {d % 4} take {edit + 14} days. " * (1 + d % 3)
            publisher.publish("acme", f"doc-{d}", text.encode(), f"doc-{d}.txt",
                              metadata={"dept": "hr" if d % 4 else "legal"}, allow=allow)
            (claimed,) = queue.claim("test-worker", limit=1)
            sink.publish(claimed.lease, pieces("acme", f"doc-{d}", claimed.version_number, [text]), vectors([text]))
    profile = db.fetch_one("index_profile_active")
    params = LexicalParams.of(profile)
    scope = {"tenant_id": "acme", "profile": profile["name"]}
    weights = lexical.query_weights(db, profile_analyzer(profile), "refund policy grade days", **scope)

    def run(read: ReadScope, k: int) -> tuple[list[str], list[str]]:
        names: list[str] = []
        with db.transaction() as tx:
            got = lexical.lexical_search(_recording(tx, names), weights, params, k=k, read=read.params(), **scope)
            query = {**read.params(), **weights, "k1": params.bm25_k1, "b": params.bm25_b, **scope, "k": k,
                     "query": None}
            want = tx.fetch_all("lexical_hits_all_pointers", query)
        scores = [[(r["chunk_id"][:6], r["bm25"]) for r in rows] for rows in (got, want)]
        assert [r["chunk_id"] for r in got] == [r["chunk_id"] for r in want], (names, scores)
        assert all(r["version_number"] == 2 for r in got), "a superseded version scored"
        return names, [r["chunk_id"] for r in got]

    assert run(EVERYTHING, 3)[0] == ["lexical_hits"], "the probes found k current chunks: no pointer scan"
    names, hits = run(ReadScope(), 12)  # no principals: the 4 open documents only
    assert len(hits) == 4 and names == ["lexical_hits"], "the walk ran out before the probes did"
    monkeypatch.setattr(lexical, "PROBES_AT_LEAST", 1)
    monkeypatch.setattr(lexical, "PROBES_PER_HIT", 2)
    names, hits = run(ReadScope(), 3)  # 6 probes: superseded and finance-only chunks use them up
    assert names == ["lexical_hits", "lexical_hits_all_pointers"] and len(hits) == 3
    # The product's search reads lexical_hits with its COMMIT: come back short, it searches once more, in a
    # snapshot of its own, with lexical_hits_all_pointers straight away, and answers the same.
    from resources import database
    from resources.embedder import FakeEmbedder
    from resources.search import search

    ran: list[str] = []
    real_run = database.Session._run
    monkeypatch.setattr(database.Session, "_run", lambda self, name, params=None: (
        ran.append(name) if name.startswith("lexical_hits") else None) or real_run(self, name, params))
    found = search(db, FakeEmbedder(model_name=profile["model"]), "refund policy grade days", tenant_id="acme",
                   k=3, mode="lexical", read=ReadScope())
    assert ran == ["lexical_hits", "lexical_hits_all_pointers"]
    assert sorted(h.chunk_id for h in found) == sorted(hits)
    names, hits = run(ReadScope.of(see_all=True, filters=("dept=legal",)), 5)
    assert names == ["lexical_hits_all_pointers"] and len(hits) == 3
