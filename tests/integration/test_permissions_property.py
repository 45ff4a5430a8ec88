"""Tests that would catch a leak (issue 30, item 4; DESIGN.md invariant 8).

1. A property test: random documents with random allow lists and metadata (some narrowed or widened by a later
   metadata-only version, so superseded versions with other allow lists sit in the index), random principals
   and filters. Every hit of every mode is a current version the principals may read and whose metadata passes
   the filters, with that version's metadata; for small k, dense hits equal a brute-force reference computed in
   Python from the document_version rows (not the pointer), and lexical hits are exactly the in-scope chunks
   that contain a query term.
2. Concurrency: while one thread publishes versions that narrow and widen a document's allow list in a loop
   (the fast path: each flips the pointer within milliseconds), searches as a restricted principal in every
   mode, from other threads, never see a chunk of a version whose allow list excludes them.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.domain.metadata import EVERYTHING, Filter, ReadScope
from resources.chunk_copy import FastPublish
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder
from resources.publisher import Publisher
from resources.search import search
from resources.task_queue import TaskQueue
from tests.integration.test_delete import CountingBlobs, index, rows

MODES = ("dense", "lexical", "hybrid")
PRINCIPALS = ["group:finance", "group:hr", "group:legal", "user:alice", "user:bob"]
DEPTS = ["hr", "finance", "legal", "sales"]
WORDS = ["salary", "refund", "holiday", "travel", "contract", "pension", "parking", "laptop", "invoice", "audit"]


@pytest.fixture
def kb(db, tmp_path):
    blobs = CountingBlobs(str(tmp_path / "blobs"))
    queue = TaskQueue(db, lease_seconds=60)
    return {"blobs": blobs, "queue": queue, "fake": FakeEmbedder(model_name=DEFAULT_MODEL_NAME),
            "publisher": Publisher(db, blobs), "fast": Publisher(db, blobs, fast=FastPublish(db, queue))}


def random_allow(rng: random.Random) -> list[str] | None:
    return None if rng.random() < 0.4 else rng.sample(PRINCIPALS, rng.randint(1, 2))


def random_metadata(rng: random.Random) -> dict:
    meta: dict = {}
    if rng.random() < 0.8:
        meta["dept"] = rng.choice(DEPTS)
    if rng.random() < 0.7:
        meta["year"] = rng.randint(2020, 2027)
    if rng.random() < 0.6:
        meta["effective"] = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if rng.random() < 0.5:
        meta["tags"] = rng.sample(WORDS, rng.randint(1, 3))
    if rng.random() < 0.3:
        meta["draft"] = rng.random() < 0.5
    return meta


def document(rng: random.Random, n: int) -> bytes:
    paragraphs = [" ".join(rng.choices(WORDS, k=8)) + f" clause {n}-{p}." for p in range(rng.randint(1, 3))]
    return "\n\n".join(paragraphs).encode()


@pytest.fixture
def corpus(db, db_url, kb):
    """24 documents indexed through runs; a third of them then changed metadata/allow list only (copied)."""
    rng = random.Random(30)
    for n in range(24):
        data = document(rng, n)
        first = kb["publisher"].publish("acme", f"doc-{n}", data, f"doc-{n}.txt", metadata=random_metadata(rng),
                                        allow=random_allow(rng))
        index(db, db_url, kb, first.task_id, f"doc-{n}", 1, owner=f"run-{n}")
        if n % 3 == 0:
            again = kb["publisher"].publish("acme", f"doc-{n}", data, f"doc-{n}.txt", metadata=random_metadata(rng),
                                            allow=random_allow(rng))
            index(db, db_url, kb, again.task_id, f"doc-{n}", 2, owner=f"run-{n}b")
    # A pending version (never indexed) with a wide-open allow list must not open anything either.
    kb["publisher"].publish("acme", "doc-0", b"pending salary text", "doc-0.txt", allow=None)
    return current_versions(db_url)


def current_versions(db_url: str) -> dict[str, tuple[int, dict, list[str] | None]]:
    """document -> (pointed version, its metadata, its allow list), read from document_version (not the pointer)."""
    got = rows(db_url, "SELECT p.document_id, p.version_number, v.metadata, v.allow_principals FROM search_pointer p "
                       "JOIN document_version v USING (tenant_id, document_id, version_number)")
    return {d: (n, m, a) for d, n, m, a in got}


filters = st.one_of(
    st.builds(lambda d: Filter("dept", "eq", tuple(d)), st.lists(st.sampled_from(DEPTS), min_size=1, max_size=2)),
    st.builds(lambda d: Filter("dept", "ne", (d,)), st.sampled_from(DEPTS)),
    st.builds(lambda op, y: Filter("year", op, (y,)), st.sampled_from(["gt", "ge", "lt", "le"]), st.integers(2019, 2028)),
    st.builds(lambda op, m: Filter("effective", op, (f"2026-{m:02d}-15",)), st.sampled_from(["gt", "ge", "lt", "le"]),
              st.integers(1, 12)),
    st.builds(lambda w: Filter("tags", "eq", (w,)), st.sampled_from(WORDS)),
    st.builds(lambda b: Filter("draft", "eq", (b,)), st.booleans()),
    st.builds(lambda k: Filter(k, "exists"), st.sampled_from(["dept", "tags", "draft"])),
    st.builds(lambda k: Filter(k, "missing"), st.sampled_from(["dept", "tags", "draft"])),
)
scopes = st.builds(
    lambda principals, fs, see_all: ReadScope(tuple(sorted(principals)), see_all, tuple(fs)),
    st.sets(st.sampled_from(PRINCIPALS), max_size=3), st.lists(filters, max_size=2), st.just(False),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(read=scopes, words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3), k=st.integers(1, 6))
def test_every_hit_of_every_mode_is_readable_and_matches_and_small_k_equals_brute_force(db, db_url, kb, corpus,
                                                                                        read, words, k):
    query = " ".join(words)
    in_scope = {d for d, (_, meta, allow) in corpus.items() if read.matches(meta, allow)}
    for mode in MODES:
        hits = search(db, kb["fake"], query, tenant_id="acme", k=k, mode=mode, read=read)
        for hit in hits:
            version, meta, allow = corpus[hit.document_id]
            assert hit.version_number == version, f"{mode}: a version no pointer names"
            assert read.may_read(allow), f"LEAK ({mode}): {hit.document_id} allows {allow}, reader {read.principals}"
            assert all(f.matches(meta) for f in read.filters), f"{mode}: {meta} fails {read.filters}"
            assert hit.metadata == meta
    # Dense, small k: the brute-force top k over every in-scope current chunk, by exact cosine distance.
    vector = kb["fake"].embed([query])[0]
    candidates = rows(db_url, "SELECT c.chunk_id, c.document_id, c.embedding::text FROM chunk c JOIN search_pointer p "
                              "USING (tenant_id, document_id, profile, version_number)")
    scored = []
    for chunk_id, document_id, text in candidates:
        if document_id in in_scope:
            emb = np.array(text.strip("[]").split(","), dtype=np.float64)
            distance = 1 - float(emb @ vector) / (np.linalg.norm(emb) * np.linalg.norm(vector))
            scored.append((round(distance, 6), chunk_id))
    expected = [cid for _, cid in sorted(scored)[:k]]
    dense = [h.chunk_id for h in search(db, kb["fake"], query, tenant_id="acme", k=k, mode="dense", read=read)]
    assert len(dense) == len(expected) and set(dense) == set(expected)
    # Lexical: every in-scope chunk that has a query term can score; with k >= their number, all of them come back.
    lexical = search(db, kb["fake"], query, tenant_id="acme", k=1000, mode="lexical", read=read)
    assert {h.document_id for h in lexical} <= in_scope


def test_the_corpus_has_restricted_open_and_changed_versions(corpus, db_url):
    """The property test above is only as good as its corpus: it holds each kind of version it must tell apart."""
    allows = [allow for _, _, allow in corpus.values()]
    assert any(a is None for a in allows) and any(a for a in allows)
    changed = rows(db_url, "SELECT count(*) FROM search_pointer WHERE version_number = 2")[0][0]
    superseded_restricted = rows(db_url, "SELECT count(*) FROM chunk c JOIN document_version v USING (tenant_id, "
                                         "document_id, version_number) WHERE version_number = 1 AND document_id IN "
                                         "(SELECT document_id FROM search_pointer WHERE version_number = 2)")[0][0]
    assert changed == 8 and superseded_restricted > 0


def test_without_principals_only_open_versions_and_all_sees_everything(db, kb, corpus):
    open_docs = {d for d, (_, _, allow) in corpus.items() if allow is None}
    for mode in MODES:
        default = {h.document_id for h in search(db, kb["fake"], "salary refund", tenant_id="acme", k=200, mode=mode)}
        assert default and default <= open_docs
        everything = {h.document_id for h in search(db, kb["fake"], "salary refund", tenant_id="acme", k=200,
                                                    mode=mode, read=EVERYTHING)}
        assert everything - open_docs, "--all shows restricted versions too"


def test_allow_lists_flipping_under_concurrent_searches_never_leak(db, db_url, kb):
    """Real threads against the real database: a writer flips doc 'salaries' between group:hr and group:finance
    (each a metadata-only version published by the fast path); readers search as group:hr in every mode."""
    data = ("\n\n".join(f"Salary band {i}: grade {i} earns between {i}0k and {i + 1}0k." for i in range(6))).encode()
    first = kb["publisher"].publish("acme", "salaries", data, "salaries.txt", allow=["group:hr"], metadata={"flip": 0})
    index(db, db_url, kb, first.task_id, "salaries", 1)
    stop = threading.Event()
    flips, searches, leaks, errors = [0], [0], [], []

    def writer() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            allow = ["group:finance"] if n % 2 else ["group:hr"]
            result = kb["fast"].publish("acme", "salaries", data, "salaries.txt", allow=allow, metadata={"flip": n})
            if result.status != "SUCCEEDED":
                errors.append(f"version {result.version} not fast-published: {result.status}")
                return
            flips[0] += 1

    def reader(mode: str) -> None:
        read = ReadScope.of(["group:hr"])
        while not stop.is_set():
            for hit in search(db, kb["fake"], "salary band grade", tenant_id="acme", k=5, mode=mode, read=read):
                (allow,) = rows(db_url, "SELECT allow_principals FROM document_version WHERE document_id = "
                                        "'salaries' AND version_number = %s", [hit.version_number])[0]
                if "group:hr" not in allow or hit.metadata.get("flip", 0) % 2:
                    leaks.append((mode, hit.version_number, allow, hit.metadata))
            searches[0] += 1

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(m,)) for m in MODES]
    for t in threads:
        t.start()
    time.sleep(6)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert leaks == [], f"{len(leaks)} leaks in {searches[0]} searches over {flips[0]} flips: {leaks[:3]}"
    assert flips[0] >= 20 and searches[0] >= 20, (flips, searches)
    final_allow = rows(db_url, "SELECT allow_principals FROM search_pointer WHERE document_id = 'salaries'")[0][0]
    assert final_allow in (["group:hr"], ["group:finance"])
    with psycopg.connect(db_url) as conn:  # every flip was a new version, copied, never embedded
        versions, chunked = conn.execute("SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM chunk c "
                                         "WHERE c.document_id = v.document_id AND c.version_number = v.version_number))"
                                         " FROM document_version v").fetchone()
    assert versions == flips[0] + 1 and chunked == versions
