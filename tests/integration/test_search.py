"""Search: current versions only, tenant-isolated, exact order, correct under filtering at scale (invariant 4)."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql as pgsql

from pipelines.domain.chunking import Chunk, VersionIdentity, chunk_id, content_digest
from pipelines.domain.errors import EmbeddingInvalidResponse, InvalidRequest
from resources.database import Database, Session
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder, checked_embed, embedder_for_model
from resources.index_sink import IndexSink
from pipelines.domain.lexical import MODES
from pipelines.domain.metadata import EVERYTHING, ReadScope
from resources.search import SearchHit, search
from resources.task_queue import TaskQueue
from sql import queries

PROFILE = "minilm-v1"
MODEL = DEFAULT_MODEL_NAME  # the default profile's model: the fake embedder stands in for it


def pieces(tenant: str, document: str, version: int, texts: list[str]) -> list[Chunk]:
    """Chunks with the real stable ids (the sink re-derives and checks them), headed by the document id."""
    identity = VersionIdentity(tenant, document, version, PROFILE)
    out = []
    for i, text in enumerate(texts):
        digest = content_digest(text)
        out.append(Chunk(chunk_id(identity, i, (document,), digest), i, (document,), None, text, text, 10, digest))
    return out


@pytest.fixture
def fake() -> FakeEmbedder:
    """The deterministic fake, answering as the active profile's model."""
    return FakeEmbedder(model_name=MODEL)


@pytest.fixture
def queue(db) -> TaskQueue:
    """A queue on the database's own clock (these tests do not move time)."""
    return TaskQueue(db, lease_seconds=120)


@pytest.fixture
def index(db, queue, publisher, fake):
    """Factory: publish a version of a document and (unless ``publish=False``) index it to completion."""
    sink = IndexSink(db, queue)

    def make(tenant: str, document: str, texts: list[str], *, embedder=None, publish: bool = True):
        published = publisher.publish(tenant, document, "\n\n".join(texts).encode(), f"{document}.txt")
        (claimed,) = queue.claim("test-worker", limit=1)
        assert claimed.lease.task_id == published.task_id
        chunks = pieces(tenant, document, claimed.version_number, texts)
        if not publish:
            return claimed, chunks
        vectors = checked_embed(
            embedder or fake, [c.text for c in chunks], expected_model=MODEL, expected_dim=384, batch_size=32
        )
        return sink.publish(claimed.lease, chunks, vectors)

    return make


def versions(hits: list[SearchHit]) -> set[tuple[str, int]]:
    return {(h.document_id, h.version_number) for h in hits}


@pytest.mark.parametrize("mode", MODES)
def test_only_the_pointed_version_is_searchable(db, fake, index, queue, mode):
    """Every mode (the lexical side too) reads exactly the version the pointer names."""
    index("acme", "refunds", ["Refunds take 30 days in version one.", "Old refund desk hours."])
    assert versions(search(db, fake, "refund desk days", tenant_id="acme", mode=mode)) == {("refunds", 1)}
    index("acme", "refunds", ["Refunds take 14 days in version two.", "New refund desk hours."])
    hits = search(db, fake, "refund desk days", tenant_id="acme", k=10, mode=mode)
    assert versions(hits) == {("refunds", 2)} and len(hits) == 2
    claimed, _ = index("acme", "refunds", ["Refunds take 7 days in version three."], publish=False)
    assert versions(search(db, fake, "refund desk days", tenant_id="acme", mode=mode)) == {("refunds", 2)}, "v3 in progress"
    queue.fail(claimed.lease, "EMBEDDING_INVALID_RESPONSE", "bad batch")
    assert versions(search(db, fake, "refund desk days", tenant_id="acme", mode=mode)) == {("refunds", 2)}, "v3 failed"
    # A term only the superseded version had finds nothing, lexically or otherwise.
    assert search(db, fake, "30", tenant_id="acme", mode="lexical") == []


@pytest.mark.parametrize("mode, waits", [("dense", 1), ("lexical", 2), ("hybrid", 3)])
def test_a_search_reads_its_last_statement_with_the_commit(db, fake, index, mode, waits, pipeline_waits):
    """Counted exactly (psycopg's pipeline waits): dense, once this process has read the tenant's size, waits only
    for COMMIT, which brings the walk's rows and the size again (2 while it waited for the size first); lexical for
    its statistics and COMMIT; hybrid for the statistics, both sides' candidates and COMMIT, which brings the dense
    candidates' BM25. One wait more each while the last statement was read before COMMIT. (60 chunks: a hybrid's
    candidates are at least 50 a side, and a side with fewer runs its exhaustive statement too.)"""
    texts = [f"policy clause {i} about {'refunds ' * (i % 4)} shipping" for i in range(60)]
    index("acme", "policy", texts)
    search(db, fake, "warm up", tenant_id="acme", k=5, mode=mode)  # the active profile remembered: no wait of its own
    before = pipeline_waits[0]
    hits = search(db, fake, "refunds shipping clause 7", tenant_id="acme", k=10, mode=mode)
    assert pipeline_waits[0] - before == waits
    assert len(hits) == 10 and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


@pytest.mark.parametrize("mode, waits", [("dense", 1), ("hybrid", 3)])
def test_a_tenant_with_fewer_chunks_than_asked_for_is_measured_at_once(db, fake, index, monkeypatch, mode, waits,
                                                                     pipeline_waits):
    """The tenant's size (read with the first statements, or by a dense search as the last search read it) says a
    walk would come back short: search_hits_exact runs straight away, with no walk before it and no second
    transaction after it (a hybrid asks for 50 a side)."""
    index("acme", "policy", [f"policy clause {i} about refunds and shipping" for i in range(5)])
    search(db, fake, "warm up", tenant_id="acme", k=10, mode=mode)
    ran: list[str] = []
    real_run = Session._run
    monkeypatch.setattr(Session, "_run", lambda self, name, params=None: (
        ran.append(name) if name.startswith("search_hits") else None) or real_run(self, name, params))
    before = pipeline_waits[0]
    hits = search(db, fake, "refunds shipping clause 3", tenant_id="acme", k=10, mode=mode)
    assert pipeline_waits[0] - before == waits and ran == ["search_hits_exact"]
    assert len(hits) == 5 and hits[0].text == "policy clause 3 about refunds and shipping"


def test_a_dense_search_waits_for_the_tenants_size_only_the_first_time(db, fake, index, pipeline_waits):
    """A process's first dense search of a tenant waits for its size, then for COMMIT; the next ones plan from the
    size the last one read with its COMMIT and wait once. Another tenant, or the same tenant through another
    Database, starts with two again."""
    texts = [f"policy clause {i} about refunds and shipping" for i in range(30)]
    index("acme", "policy", texts)
    index("globex", "policy", texts)
    counted = []
    for tenant, database in (("acme", db), ("acme", db), ("acme", db), ("globex", db)):
        before = pipeline_waits[0]
        assert len(search(database, fake, "refunds clause 3", tenant_id=tenant, k=10, mode="dense")) == 10
        counted.append(pipeline_waits[0] - before)
    with Database(db.url) as other:
        search(other, fake, "warm up", tenant_id="acme", k=10, mode="dense")  # reads the active profile
        before = pipeline_waits[0]
        search(other, fake, "refunds clause 3", tenant_id="acme", k=10, mode="dense")
        counted.append(pipeline_waits[0] - before)
    assert counted == [2, 1, 1, 2, 1]


def test_a_remembered_size_never_changes_a_dense_answer(db, fake, index, monkeypatch):
    """The size only chooses the plan. Remembered too big (a tenant of 5 chunks taken for a million: the graph walk
    comes back short), the search runs the exhaustive statement and answers all 5; remembered too small (taken for
    empty while it has 30 chunks: the exhaustive statement), it answers the exact 10. Either way the next search
    plans from the size read with the last one's COMMIT."""
    from resources.search import TENANT_SIZES

    index("acme", "small", [f"small clause {i} about refunds" for i in range(5)])
    index("globex", "big", [f"big clause {i} about refunds" for i in range(30)])
    ran: list[str] = []
    real_run = Session._run
    monkeypatch.setattr(Session, "_run", lambda self, name, params=None: (
        ran.append(name) if name.startswith("search_hits") else None) or real_run(self, name, params))
    exact = {}
    for tenant in ("acme", "globex"):
        exact[tenant] = search(db, fake, "refunds clause 3", tenant_id=tenant, k=10, mode="dense")
    assert [len(exact["acme"]), len(exact["globex"])] == [5, 10]
    scope = {"tenant_id": "acme", "profile": PROFILE}
    TENANT_SIZES.put(db, scope, {"tenant_chunks": 10**6, "index_rows": 10**6})
    ran.clear()
    assert search(db, fake, "refunds clause 3", tenant_id="acme", k=10, mode="dense") == exact["acme"]
    assert ran == ["search_hits", "search_hits_exact"]  # walked, came back short, measured every chunk
    assert TENANT_SIZES.get(db, scope)["tenant_chunks"] == 5
    TENANT_SIZES.put(db, {"tenant_id": "globex", "profile": PROFILE}, {"tenant_chunks": 0, "index_rows": 35})
    ran.clear()
    assert search(db, fake, "refunds clause 3", tenant_id="globex", k=10, mode="dense") == exact["globex"]
    assert ran == ["search_hits_exact"]
    assert TENANT_SIZES.get(db, {"tenant_id": "globex", "profile": PROFILE})["tenant_chunks"] == 30


def test_hits_are_exactly_ordered_and_scored(db, fake, index):
    texts = [f"policy clause {i} about {'refunds ' * (i % 4)} shipping" for i in range(30)]
    index("acme", "policy", texts)
    query = texts[7]
    hits = search(db, fake, query, tenant_id="acme", k=10, mode="dense")
    assert hits[0].text == query and hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    q = fake.embed([query])[0]
    exact = sorted(texts, key=lambda t: (-float(q @ fake.embed([t])[0])))[:10]
    assert [h.text for h in hits][:5] == exact[:5]
    assert hits[0].heading_path == ("policy",) and hits[0].page is None and len(hits[0].chunk_id) == 32


@pytest.mark.parametrize("mode", MODES)
def test_tenants_never_see_each_other(db, fake, index, mode):
    index("acme", "secret", ["The acme launch code is swordfish."])
    index("globex", "secret", ["The globex launch code is marlin."])
    acme = search(db, fake, "launch code marlin", tenant_id="acme", k=10, mode=mode)
    assert [h.text for h in acme] == ["The acme launch code is swordfish."]
    assert search(db, fake, "launch code", tenant_id="initech", mode=mode) == []


def test_bad_requests_and_mismatched_embedders_are_refused(db, fake, index):
    index("acme", "doc", ["text"])
    for bad in (dict(k=0), dict(k=1001), dict(tenant_id="bad tenant!")):
        with pytest.raises(InvalidRequest):
            search(db, fake, "text", **{"tenant_id": "acme", **bad})
    with pytest.raises(InvalidRequest):
        search(db, fake, "   ", tenant_id="acme")
    with pytest.raises(InvalidRequest):
        search(db, fake, "text", tenant_id="acme", mode="fuzzy")
    with pytest.raises(EmbeddingInvalidResponse):
        search(db, FakeEmbedder(), "text", tenant_id="acme")  # fake-384 is not the active profile's model


def _explain(db_url: str, params: dict) -> str:
    with psycopg.connect(db_url) as conn:
        from pgvector.psycopg import register_vector

        register_vector(conn)
        with conn.transaction():
            conn.execute(queries["search_settings"], {"ef_search": 64, "max_scan_tuples": 20000})
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + queries["search_hits"], params).fetchone()[0]
    return json.dumps(plan)


def test_at_scale_hnsw_is_used_and_a_small_tenant_still_gets_k_hits(db, db_url, fake, index, monkeypatch):
    with psycopg.connect(db_url, autocommit=True) as conn:  # bulk-load fast, then build the graph once
        (definition,) = conn.execute("SELECT pg_get_indexdef('chunk_embedding_hnsw_idx'::regclass)").fetchone()
        conn.execute("DROP INDEX chunk_embedding_hnsw_idx")
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"]
    rng = np.random.default_rng(1)
    for d in range(60):
        texts = [" ".join(rng.choice(words, 6)) + f" big{d}x{i}" for i in range(200)]
        index("big", f"doc-{d}", texts)
    small = ["refund window for damaged goods", "refund to the original card", "refund of shipping fees"]
    index("small", "refunds", small)
    index("small", "other", ["holiday calendar", "parking rules"])
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(definition)
        conn.execute("ANALYZE chunk")
        conn.execute("ANALYZE search_pointer")
        assert conn.execute("SELECT count(*) FROM chunk").fetchone()[0] == 12005

    query_vec = fake.embed(["alpha bravo charlie"])[0]
    plan = _explain(db_url, {"query": query_vec, "tenant_id": "big", "profile": PROFILE, "k": 10, **EVERYTHING.params()})
    assert "chunk_embedding_hnsw_idx" in plan, plan

    hits = search(db, fake, "alpha bravo charlie", tenant_id="big", k=10)
    assert len(hits) == 10 and all(h.document_id.startswith("doc-") for h in hits)

    # The small tenant's 5 chunks sit among 12,000 others: it still gets all of them, best first...
    hits = search(db, fake, "refund", tenant_id="small", k=5)
    assert len(hits) == 5 and {h.text for h in hits[:3]} == set(small)
    dense = search(db, fake, "refund", tenant_id="small", k=5, mode="dense")
    assert len(dense) == 5 and {h.text for h in dense[:3]} == set(small)
    lexical = search(db, fake, "refund alpha", tenant_id="small", k=5, mode="lexical")
    assert {h.text for h in lexical} == set(small), "the lexical side stays in the tenant too"
    # The planner rightly reads so small a tenant exhaustively. Make it walk the graph instead (sorts
    # forbidden): iterative scans must still find all 5 among 12,000, and when the walk is cut short
    # at max_scan_tuples the exact fallback gives the same answer.
    with psycopg.connect(db_url, autocommit=True) as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(pgsql.SQL("ALTER DATABASE {} SET enable_sort = off").format(pgsql.Identifier(name)))
    forced = Database(db_url, max_size=2)
    try:
        plan = _explain(db_url, {"query": fake.embed(["refund"])[0], "tenant_id": "small", "profile": PROFILE, "k": 5,
                                 **EVERYTHING.params()})
        assert "chunk_embedding_hnsw_idx" in plan, plan
        ran: list[str] = []
        real_run = Session._run

        def spy(self, query_name, params=None):
            if query_name.startswith("search_hits"):
                ran.append(query_name)
            return real_run(self, query_name, params)

        monkeypatch.setattr(Session, "_run", spy)
        assert search(forced, fake, "refund", tenant_id="small", k=5, mode="dense") == dense
        assert ran == ["search_hits"], "iterative scan found all 5 without help"
        ran.clear()
        # Cut short, the walk's rows (read after COMMIT) are not used: the search runs again with the exact one.
        assert search(forced, fake, "refund", tenant_id="small", k=5, max_scan_tuples=10, mode="dense") == dense
        assert ran == ["search_hits", "search_hits_exact"]
    finally:
        forced.close()


@pytest.fixture(scope="module")
def real_model() -> Any:
    """The default profile's real model (what ``kbindex search`` embeds queries with), loaded once per module."""
    return embedder_for_model(DEFAULT_MODEL_NAME)


def test_real_model_finds_english_by_meaning_and_chinese_text(db, index, real_model):
    index(
        "acme",
        "handbook",
        [
            "Employees may work from home up to three days per week with manager approval.",
            "Expense reports must be filed within thirty days of the purchase.",
            "The office closes at 6 pm on Fridays.",
        ],
        embedder=real_model,
    )
    index(
        "acme",
        "zh-policy",
        ["退款将在收到退货后十四天内退回原支付方式。", "办公室周五下午六点关门。"],
        embedder=real_model,
    )
    hits = search(db, real_model, "Can I do remote work?", tenant_id="acme", k=3)
    assert hits[0].text.startswith("Employees may work from home")
    hits = search(db, real_model, "退款将在收到退货后十四天内退回原支付方式", tenant_id="acme", k=5)
    assert hits[0].document_id == "zh-policy" and hits[0].text.startswith("退款") and hits[0].score > 0.95
    hits = search(db, real_model, "退款退回原支付方式", tenant_id="acme", k=5)
    assert hits[0].text.startswith("退款"), [h.text for h in hits]


def test_cli_search_prints_hits_and_json(db_url, index, real_model):
    from typer.testing import CliRunner

    from pipelines.cli import app

    index("acme", "handbook", ["Expense reports must be filed within thirty days.", "Parking is free."], embedder=real_model)
    runner = CliRunner()
    env = {"KBINDEX_DATABASE_URL": db_url}
    result = runner.invoke(app, ["search", "when are expense reports due", "--tenant", "acme", "-k", "1", "--json"], env=env)
    assert result.exit_code == 0, result.output
    (hit,) = json.loads(result.stdout)
    assert hit["document_id"] == "handbook" and hit["text"].startswith("Expense") and hit["version_number"] == 1
    assert set(hit) == {"document_id", "version_number", "heading_path", "text", "score", "chunk_id", "page",
                        "metadata"}
    result = runner.invoke(app, ["search", "parking", "--tenant", "acme"], env=env)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()  # a block per hit: rank, score, document, version; then the snippet
    assert lines[0].split()[0] == "1" and lines[0].split()[2:4] == ["handbook", "v1"], result.stdout
    assert lines[1].strip() == "Parking is free." and lines[2] == "", result.stdout
    assert runner.invoke(app, ["search", "x", "--tenant", "bad tenant!"], env=env).exit_code == 2
    assert runner.invoke(app, ["search", "x"], env=env).exit_code == 2


def _out_of_line_vectors(db_url: str, document: str) -> list[bool]:
    with psycopg.connect(db_url) as conn:
        return [row[0] for row in conn.execute(
            "SELECT pg_column_toast_chunk_id(embedding) IS NOT NULL FROM chunk WHERE document_id = %s ORDER BY ordinal",
            [document])]


def test_vectors_stay_in_their_rows_beside_chunk_length_text(db_url, index):
    """Migration 0051: a chunk of real length (~1,100 characters, what 254 word pieces make) keeps its vector inline,
    so a distance computed from the heap costs no TOAST lookup. pgvector's own placement (STORAGE external), set
    back for a second document, moves the same rows' vectors out of line: the check can tell the two apart."""
    rng = random.Random(51)  # prose-like: as little repetition as English has (a repeated line compresses away)
    words = ["".join(rng.choice("etaoinshrdlucmfwypvbgk") for _ in range(rng.randint(2, 9))) for _ in range(400)]
    paragraph = " ".join(rng.choice(words) for _ in range(400))
    texts = [paragraph[:1100], paragraph[1100:2200], "A short closing line."]
    index("acme", "inline", texts)
    assert _out_of_line_vectors(db_url, "inline") == [False, False, False]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE chunk ALTER COLUMN embedding SET STORAGE EXTERNAL")
    index("acme", "external", texts)
    assert _out_of_line_vectors(db_url, "external") == [True, True, False]


def test_a_tenant_big_enough_a_share_of_the_graph_walks_it(db, db_url, fake, index, monkeypatch):
    """WALK_MIN_SHARE: the planner reads a tenant of a few percent of a big index exhaustively; search forbids sorts
    for search_hits alone when the tenant's current chunks (lexical_term_stats, kept by publish) are a big enough share
    of the chunk table (ANALYZE's estimate), so the graph is walked, and allows them again for what follows. The
    thresholds are lowered here so a 5-chunk tenant among 3,005 qualifies: the planner, left alone, measures it."""
    import resources.search as search_module

    rng = np.random.default_rng(2)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    for d in range(15):
        index("big", f"doc-{d}", [" ".join(rng.choice(words, 6)) + f" big{d}x{i}" for i in range(200)])
    small = ["refund window for damaged goods", "refund to the original card", "refund of shipping fees"]
    index("small", "refunds", small)
    index("small", "other", ["holiday calendar", "parking rules"])
    ran: list[tuple[str, Any]] = []
    for method in ("fetch_one", "fetch_all", "submit"):  # submit: the set_config statements of a pipelined search
        real = getattr(Session, method)

        def spy(self, query_name, params=None, _real=real):
            ran.append((query_name, (params or {}).get("enable_sort")))
            return _real(self, query_name, params)

        monkeypatch.setattr(Session, method, spy)
    statements = lambda: [name for name, _ in ran  # noqa: E731
                          if name.startswith("search_") and name not in ("search_settings", "search_snapshot")]

    before = search(db, fake, "refund", tenant_id="small", k=5, mode="dense")
    assert statements() == ["search_tenant_size", "search_hits"], "never analyzed: no row estimate, the planner decides"

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ANALYZE chunk")
    monkeypatch.setattr(search_module, "WALK_MIN_CHUNKS", 5)
    monkeypatch.setattr(search_module, "WALK_MIN_SHARE", 0.001)
    search(db, fake, "refund", tenant_id="small", k=5, mode="dense")  # plans from the size read before ANALYZE
    ran.clear()
    walked = search(db, fake, "refund", tenant_id="small", k=5, mode="dense")  # from the one read with that COMMIT
    assert walked == before, "the walk (iterative scan) finds the same 5 as the exhaustive plan"
    assert [(n, v) for n, v in ran if n in ("search_sort_enabled", "search_hits")] == [
        ("search_sort_enabled", "off"), ("search_hits", None), ("search_sort_enabled", "on")]
    with psycopg.connect(db_url) as conn:
        from pgvector.psycopg import register_vector

        register_vector(conn)
        with conn.transaction():
            conn.execute(queries["search_settings"], {"ef_search": 64, "max_scan_tuples": 20000})
            params = {"query": fake.embed(["refund"])[0], "tenant_id": "small", "profile": PROFILE, "k": 5,
                      **EVERYTHING.params()}
            left_alone = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + queries["search_hits"], params).fetchone()[0])
            conn.execute(queries["search_sort_enabled"], {"enable_sort": "off"})
            forced = json.dumps(conn.execute("EXPLAIN (FORMAT JSON) " + queries["search_hits"], params).fetchone()[0])
    assert "chunk_embedding_hnsw_idx" not in left_alone and "chunk_embedding_hnsw_idx" in forced

    monkeypatch.setattr(search_module, "WALK_MIN_SHARE", 0.01)  # 5 of 3,005 rows is below 1%: the planner decides
    ran.clear()
    assert search(db, fake, "refund", tenant_id="small", k=5, mode="dense") == before
    assert "search_sort_enabled" not in statements()
    ran.clear()  # a filtered search keeps its own path (the scope decides), never the forced walk
    search(db, fake, "refund", tenant_id="small", k=5, mode="dense", read=ReadScope.of(see_all=True, filters=["a=b"]))
    assert "search_sort_enabled" not in statements()
