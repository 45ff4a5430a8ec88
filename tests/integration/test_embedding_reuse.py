"""Embedding reuse across versions: exact vectors, only changed chunks embedded, never across profiles or tenants."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from pipelines.domain.chunking import Chunk, VersionIdentity, chunk_id, content_digest
from pipelines.domain.errors import EmbeddingInvalidResponse
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder, Fault
from resources.embedding_reuse import embed_digest, embed_with_reuse
from resources.index_sink import IndexSink
from resources.task_queue import TaskQueue

PROFILE = "minilm-v1"
MODEL = DEFAULT_MODEL_NAME  # the default profile's model: fakes stand in for it under its name
TEXTS = [f"Refunds for order type {i} are paid within {i + 3} days of the request." for i in range(40)]


def make_chunks(identity: VersionIdentity, texts: list[str], heading: tuple[str, ...] = ("Policy",)) -> list[Chunk]:
    prefix = " > ".join(heading) + "\n" if heading else ""
    out = []
    for i, text in enumerate(texts):
        digest = content_digest(text)
        out.append(
            Chunk(
                chunk_id=chunk_id(identity, i, heading, digest),
                ordinal=i,
                heading_path=heading,
                page=None,
                text=text,
                embed_text=prefix + text,
                token_count=len((prefix + text).split()),
                content_digest=digest,
            )
        )
    return out


class Indexer:
    """Publish a version, claim its task, embed with reuse and commit through the fenced publish."""

    def __init__(self, db, queue, publisher) -> None:
        self.db, self.queue, self.publisher = db, queue, publisher
        self.sink = IndexSink(db, queue)
        self.claimed: dict[tuple[str, str, str], object] = {}  # (tenant, document, profile) -> latest claim

    def index(self, texts, *, tenant="acme", document="policy", embedder=None, profile=PROFILE, model=MODEL,
              publish=True):
        """Publish ``texts`` as a new version (or, publish=False, take the version already claimed) and index it."""
        embedder = embedder or FakeEmbedder(model_name=model)
        if publish:
            self.publisher.publish(tenant, document, "\n\n".join(texts).encode(), f"{document}.txt")
            for c in self.queue.claim("w1", limit=10):
                self.claimed[(c.tenant_id, c.document_id, c.profile)] = c
        task = self.claimed.pop((tenant, document, profile))
        identity = VersionIdentity(tenant, document, task.version_number, profile)
        chunks = make_chunks(identity, texts)
        vectors, stats = embed_with_reuse(
            self.db,
            embedder,
            tenant_id=tenant,
            profile=profile,
            model=model,
            dimension=384,
            texts=[c.embed_text for c in chunks],
            batch_size=8,
        )
        outcome = self.sink.publish(task.lease, chunks, vectors)
        assert not outcome.superseded
        return vectors, stats, embedder, chunks


@pytest.fixture
def indexer(db, publisher) -> Indexer:
    # The database's clock, not a pinned one: every freshly published task is due however slow the machine.
    return Indexer(db, TaskQueue(db, lease_seconds=60), publisher)


def stored(db_url, tenant="acme", document="policy", version=None):
    with psycopg.connect(db_url) as conn:
        from pgvector.psycopg import register_vector

        register_vector(conn)
        return conn.execute(
            "SELECT ordinal, embed_digest, embedding FROM chunk WHERE tenant_id = %s AND document_id = %s "
            "AND version_number = %s ORDER BY ordinal",
            (tenant, document, version),
        ).fetchall()


def as_array(value) -> np.ndarray:
    return np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)


def test_only_changed_chunks_are_embedded_and_reused_vectors_are_exact(indexer, db_url):
    v1_vectors, v1_stats, v1_embedder, _ = indexer.index(TEXTS)
    assert (v1_stats.reused, v1_stats.embedded) == (0, len(TEXTS))
    assert sum(v1_embedder.calls) == len(TEXTS)

    changed = list(TEXTS)
    changed[7] = "Refunds for order type 7 are paid within 2 days of the request."
    changed.append("A brand new paragraph about store credit.")
    v2_vectors, stats, embedder, chunks = indexer.index(changed)

    assert (stats.reused, stats.embedded) == (len(TEXTS) - 1, 2)
    assert embedder.calls == [2] and stats.calls == 1  # one batch with exactly the two new texts
    for i in range(len(TEXTS)):
        if i != 7:
            assert v2_vectors[i].tobytes() == v1_vectors[i].tobytes()
    # what was written for v2 is byte for byte what v1 stored, and each row names its embedded text
    rows_v1, rows_v2 = stored(db_url, version=1), stored(db_url, version=2)
    assert [r[1] for r in rows_v2] == [embed_digest(c.embed_text) for c in chunks]
    compared = 0
    for (o1, _, e1), (o2, _, e2) in zip(rows_v1, rows_v2, strict=False):
        assert o1 == o2
        if o1 != 7:
            assert as_array(e1).tobytes() == as_array(e2).tobytes() == v1_vectors[o1].tobytes()
            compared += 1
    assert compared == len(TEXTS) - 1


def test_an_unchanged_version_embeds_nothing(indexer):
    indexer.index(TEXTS)
    vectors, stats, embedder, _ = indexer.index(TEXTS + [TEXTS[0]])  # new bytes, same chunk texts (+ a duplicate)
    assert (stats.reused, stats.embedded, stats.calls) == (len(TEXTS) + 1, 0, 0)
    assert embedder.calls == []
    assert vectors.shape == (len(TEXTS) + 1, 384) and vectors.dtype == np.float32


def test_reuse_never_crosses_tenants(indexer):
    indexer.index(TEXTS, tenant="acme")
    _, stats, embedder, _ = indexer.index(TEXTS, tenant="globex")
    assert (stats.reused, stats.embedded) == (0, len(TEXTS))
    assert sum(embedder.calls) == len(TEXTS)


def test_reuse_never_crosses_profiles_even_with_the_same_model(indexer, db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, building) "
            "VALUES ('shadow', %s, 384, 200, 32, true)",
            (MODEL,),
        )
    indexer.index(TEXTS)  # publishes v1 with a task per profile, claims both, indexes under minilm-v1
    _, stats, embedder, _ = indexer.index(TEXTS, profile="shadow", publish=False)  # same version, shadow profile
    assert (stats.reused, stats.embedded) == (0, len(TEXTS))
    assert sum(embedder.calls) == len(TEXTS)


def test_reuse_never_crosses_models(indexer, db):
    """A task whose model differs from what its profile names gets no stored vector (invariant 6)."""
    indexer.index(TEXTS)
    fake = FakeEmbedder(model_name="fake-384")
    _, stats = embed_with_reuse(
        db, fake, tenant_id="acme", profile=PROFILE, model="fake-384", dimension=384,
        texts=["Policy\n" + t for t in TEXTS], batch_size=16,
    )
    assert (stats.reused, stats.embedded) == (0, len(TEXTS))
    assert sum(fake.calls) == len(TEXTS)


def test_new_texts_still_go_through_the_checked_path(indexer, db):
    indexer.index(TEXTS)
    bad = FakeEmbedder(model_name=MODEL, schedule={1: Fault.WRONG_ORDER})
    with pytest.raises(EmbeddingInvalidResponse):
        embed_with_reuse(
            db, bad, tenant_id="acme", profile=PROFILE, model=MODEL, dimension=384,
            texts=["Policy\n" + TEXTS[0], "new one", "new two"], batch_size=8,
        )


def test_a_stored_vector_that_does_not_fit_is_embedded_again(indexer, db, db_url):
    indexer.index(TEXTS)
    with psycopg.connect(db_url, autocommit=True) as conn:  # corrupt one stored vector: not unit length
        conn.execute(
            "UPDATE chunk SET embedding = (SELECT array_agg(0.5::real) FROM generate_series(1, 384))::vector(384) "
            "WHERE ordinal = 3"
        )
    fake = FakeEmbedder(model_name=MODEL)
    vectors, stats = embed_with_reuse(
        db, fake, tenant_id="acme", profile=PROFILE, model=MODEL, dimension=384,
        texts=["Policy\n" + t for t in TEXTS], batch_size=64,
    )
    assert (stats.reused, stats.embedded) == (len(TEXTS) - 1, 1)
    assert abs(float(np.linalg.norm(vectors[3])) - 1.0) < 1e-3


def test_progress_counts_reused_and_embedded_texts(indexer, db):
    indexer.index(TEXTS)
    seen: list[tuple[int, int]] = []
    texts = ["Policy\n" + t for t in TEXTS] + [f"new text {i}" for i in range(10)]
    embed_with_reuse(
        db, FakeEmbedder(model_name=MODEL), tenant_id="acme", profile=PROFILE, model=MODEL, dimension=384,
        texts=texts, batch_size=4, on_batch=lambda done, total: seen.append((done, total)),
    )
    assert seen[0] == (len(TEXTS), len(texts))
    assert seen[-1] == (len(texts), len(texts))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_chunks_without_embed_text_are_never_reused(db, db_url, publisher):
    """A caller that does not say what it embedded (no embed_text) stores NULL: nothing to reuse."""
    from tests.integration.test_index_sink import embed
    from tests.integration.test_index_sink import make_chunks as sink_chunks

    queue = TaskQueue(db, lease_seconds=60)
    publisher.publish("acme", "policy", b"v1", "policy.txt")
    (claimed,) = queue.claim("w1", limit=1)
    from types import SimpleNamespace

    chunks = [SimpleNamespace(**{f: getattr(c, f) for f in c.__slots__ if f != "embed_text"})
              for c in sink_chunks("acme", "policy", 1, TEXTS)]
    IndexSink(db, queue).publish(claimed.lease, chunks, embed(chunks))
    assert {r[1] for r in stored(db_url, version=1)} == {None}
    _, stats = embed_with_reuse(
        db, FakeEmbedder(model_name=MODEL), tenant_id="acme", profile=PROFILE, model=MODEL, dimension=384,
        texts=TEXTS, batch_size=64,
    )
    assert stats.reused == 0


def test_sql_digest_matches_python_digest(db_url):
    text = "Überschrift > Rückerstattung\nRefunds — within 14 days 退款"
    with psycopg.connect(db_url) as conn:
        (sql_digest,) = conn.execute("SELECT encode(sha256(convert_to(%s, 'UTF8')), 'hex')", (text,)).fetchone()
    assert sql_digest == embed_digest(text)


@pytest.mark.parametrize("corpus", ["shared", "generated"])
def test_incremental_bench_smoke(db_url, corpus, monkeypatch, tmp_path):
    """bench.incremental at CI size (fake model): v2 embeds only the chunks holding the edited paragraphs."""
    from bench.incremental import __main__ as bench
    from bench.incremental.__main__ import report, run

    if corpus == "generated":
        monkeypatch.setattr(bench, "CORPUS", tmp_path / "absent")
    lines: list[str] = []
    v1, v2, edited = run(db_url, paragraphs=40, change=0.05, model="fake-384", batch_size=16, out=lines.append)
    assert v1.chunks > 20 and v1.embedded == v1.chunks and v1.reused == 0
    assert edited >= 1 and v2.chunks == v1.chunks
    assert 1 <= v2.embedded <= 2 * edited and v2.reused + v2.embedded == v2.chunks
    report(v1, v2, edited, 40, out=lines.append)
    assert any("texts embedded" in line for line in lines)


def test_a_profile_with_chunks_cannot_change_its_model(indexer, db_url):
    """Reuse trusts that a profile's stored vectors are of its model: the database keeps that true."""
    indexer.index(TEXTS)
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE name = %s", (PROFILE,))
        conn.execute("UPDATE index_profile SET chunk_tokens = 180 WHERE name = %s", (PROFILE,))  # other fields may
