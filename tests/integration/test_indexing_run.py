"""The typed indexing run without Dagster: two profiles of one version with two different models,
in one run and in two concurrent runs sharing one artifact store (issue #12, defects 1 and 2), and
an invalid embedding that never reaches the index through the real step path."""

from __future__ import annotations

import threading

import numpy as np
import psycopg
import pytest

from pipelines.domain.chunking import VersionIdentity, chunk_id
from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.embedder import FakeEmbedder, Fault, fake_vector
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.profiles import create_profile
from resources.publisher import Publisher
from resources.run_state import RunState
from resources.task_queue import TaskQueue

BODY = "\n\n".join(
    f"Section {i}. Refunds of order class {i} are paid within {i % 9 + 3} days, by the original payment method."
    for i in range(40)
).encode()


class Rotated(FakeEmbedder):
    """A second, really different model: the fake's vectors with their components reversed."""

    def respond(self, texts: list[str]):
        response = super().respond(texts)
        return response.__class__(model=response.model, vectors=np.ascontiguousarray(response.vectors[:, ::-1]),
                                  echo=response.echo)


def embedder_for(model: str):
    return Rotated(model_name=model) if model == "fake-b" else FakeEmbedder(model_name=model)


def expected_vector(model: str, text: str) -> np.ndarray:
    vector = fake_vector(text, model=model)  # each fake model but fake-384 has its own vectors
    return vector[::-1] if model == "fake-b" else vector


@pytest.fixture
def migration(db, db_url, tmp_path):
    """One version with two tasks: INDEX under the active profile (model fake-a, 200 tokens) and
    REINDEX under a building profile (model fake-b, 48 tokens)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-a' WHERE is_active")
    blobs = BlobStore(str(tmp_path / "blobs"))
    published = Publisher(db, blobs).publish("acme", "refunds.txt", BODY, "refunds.txt")
    create_profile(db, "shadow-b", model="fake-b", chunk_tokens=48, overlap=8)
    queue = TaskQueue(db, lease_seconds=60)
    tasks = db_rows(db_url, "SELECT task_id, profile, task_type FROM index_task ORDER BY task_id")
    assert [(p, t) for _, p, t in tasks] == [("minilm-v1", "INDEX"), ("shadow-b", "REINDEX")]
    key = db_rows(db_url, "SELECT partition_key FROM document_version")[0][0]
    return {"queue": queue, "blobs": blobs, "key": key, "tasks": {p: t for t, p, _ in tasks},
            "store": ArtifactStore(tmp_path / "artifacts"), "published": published}


def db_rows(db_url: str, sql: str, params: list | None = None) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(sql, params or []).fetchall()


def make_run(db, m, owner: str, leases, *, embedder=embedder_for) -> IndexingRun:
    queue = m["queue"]
    return IndexingRun(db=db, queue=queue, keeper=LeaseKeeper(queue), owner=owner, blobs=m["blobs"],
                       embedder_for=embedder, state=RunState(m["store"]), tagged=leases, batch_size=16)


def claim(m, profile: str, owner: str) -> tuple[int, int]:
    claimed = m["queue"].claim_task(m["tasks"][profile], owner)
    assert claimed is not None
    return claimed.lease.task_id, claimed.lease.attempt


def assert_each_profile_has_its_own_chunks_and_vectors(db_url: str) -> None:
    rows = db_rows(db_url, "SELECT profile, chunk_id, ordinal, heading_path, content_digest, text, token_count,"
                           " embedding::text FROM chunk c JOIN index_profile p ON p.name = c.profile ORDER BY 1, 3")
    by_profile: dict[str, list[tuple]] = {}
    for row in rows:
        by_profile.setdefault(row[0], []).append(row)
    assert set(by_profile) == {"minilm-v1", "shadow-b"}
    assert len(by_profile["shadow-b"]) > len(by_profile["minilm-v1"])  # 48-token chunks: more of them
    models = {"minilm-v1": "fake-a", "shadow-b": "fake-b"}
    limits = {"minilm-v1": 200, "shadow-b": 48}
    for profile, profile_rows in by_profile.items():
        identity = VersionIdentity("acme", "refunds.txt", 1, profile)
        for _, cid, ordinal, heading, digest, _text, tokens, embedding in profile_rows:
            assert cid == chunk_id(identity, ordinal, tuple(heading), digest)
            assert tokens <= limits[profile]
        # The stored vector is the profile's own model's vector of the chunk's embed text (no heading here).
        _, _, _, _, _, text, _, embedding = profile_rows[0]
        stored = np.array([float(x) for x in embedding.strip("[]").split(",")], dtype=np.float32)
        assert np.allclose(stored, expected_vector(models[profile], text), atol=1e-5)


def run_all(run: IndexingRun, keys: list[str]) -> None:
    for step in (run.parse, run.chunk, run.embed, run.publish):
        step(keys)


def test_one_run_holding_both_profiles_of_a_version_indexes_each_with_its_own_model(db, db_url, migration):
    m = migration
    leases = [claim(m, "minilm-v1", "batch-both"), claim(m, "shadow-b", "batch-both")]
    run = make_run(db, m, "batch-both", leases)
    works = run.acquire([m["key"]])[m["key"]]
    assert sorted(w.profile for w in works) == ["minilm-v1", "shadow-b"]  # both adopted, not only the first
    run_all(run, [m["key"]])
    statuses = db_rows(db_url, "SELECT profile, status FROM index_task ORDER BY profile")
    assert statuses == [("minilm-v1", "SUCCEEDED"), ("shadow-b", "SUCCEEDED")]
    assert_each_profile_has_its_own_chunks_and_vectors(db_url)


def test_two_runs_on_one_version_under_two_profiles_never_exchange_run_state(db, db_url, migration):
    """R1 (active) embeds; R2 (building) processes the same partition key and writes its outputs into
    the same artifact store; then R1's publish (a fresh process: re-execution from the publish step)
    reads its own task's outputs, not R2's, and both tasks succeed."""
    m = migration
    r1_lease = claim(m, "minilm-v1", "run-1")
    r2_lease = claim(m, "shadow-b", "run-2")
    r1 = make_run(db, m, "run-1", [r1_lease])
    for step in (r1.parse, r1.chunk, r1.embed):
        step([m["key"]])
    r2 = make_run(db, m, "run-2", [r2_lease])
    run_all(r2, [m["key"]])
    r1_again = make_run(db, m, "run-1", [r1_lease])  # nothing in memory: everything from the store
    r1_again.publish([m["key"]])
    statuses = db_rows(db_url, "SELECT profile, status FROM index_task ORDER BY profile")
    assert statuses == [("minilm-v1", "SUCCEEDED"), ("shadow-b", "SUCCEEDED")]
    assert_each_profile_has_its_own_chunks_and_vectors(db_url)


def test_two_concurrent_runs_in_threads_each_publish_their_own_profile(db, db_url, migration):
    m = migration
    runs = [make_run(db, m, f"run-{p}", [claim(m, p, f"run-{p}")]) for p in ("minilm-v1", "shadow-b")]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def go(run: IndexingRun) -> None:
        try:
            for step in (run.parse, run.chunk, run.embed, run.publish):
                barrier.wait(timeout=60)  # both runs at the same step, on the same key, at once
                step([m["key"]])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    statuses = db_rows(db_url, "SELECT profile, status FROM index_task ORDER BY profile")
    assert statuses == [("minilm-v1", "SUCCEEDED"), ("shadow-b", "SUCCEEDED")]
    assert_each_profile_has_its_own_chunks_and_vectors(db_url)


def test_an_invalid_embedding_never_reaches_the_index_through_the_real_steps(db, db_url, migration):
    m = migration
    lease = claim(m, "minilm-v1", "run-bad")
    wrong = FakeEmbedder(model_name="fake-a", schedule={1: Fault.WRONG_DIMENSION})
    run = make_run(db, m, "run-bad", [lease], embedder=lambda model: wrong)
    run_all(run, [m["key"]])
    task = m["queue"].get(lease[0])
    assert (task["status"], task["error_code"]) == ("DEAD", "EMBEDDING_INVALID_RESPONSE")
    assert db_rows(db_url, "SELECT count(*) FROM chunk")[0][0] == 0
    assert db_rows(db_url, "SELECT count(*) FROM search_pointer")[0][0] == 0
    publish = run.publish([m["key"]])[m["key"]]
    assert [r.outcome for r in publish] == ["skipped"] and publish[0].error_code == "EMBEDDING_INVALID_RESPONSE"


def test_a_profile_with_ocr_off_leaves_scanned_pages_unread(db, db_url, tmp_path):
    """OCR is a profile setting (index_profile.ocr): off, a scanned PDF ends EMPTY_DOCUMENT saying so,
    and the parse fingerprint keeps an OCR-off parse from being reused by an OCR-on profile."""
    from pathlib import Path

    scan = Path(__file__).resolve().parents[1] / "fixtures" / "documents" / "scanned-zh-debian-reference.pdf"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-a', ocr = false WHERE is_active")
    blobs = BlobStore(str(tmp_path / "blobs"))
    published = Publisher(db, blobs).publish("acme", "scan.pdf", scan.read_bytes(), "scan.pdf")
    queue = TaskQueue(db, lease_seconds=60)
    (claimed,) = queue.claim("run-ocr", limit=1)
    key = db_rows(db_url, "SELECT partition_key FROM document_version")[0][0]
    run = IndexingRun(db=db, queue=queue, keeper=LeaseKeeper(queue), owner="run-ocr", blobs=blobs,
                      embedder_for=embedder_for, tagged=[(claimed.lease.task_id, claimed.lease.attempt)])
    (work,) = run.acquire([key])[key]
    assert work.ocr is False and work.fingerprint("parsed_document")[-1] is False
    (result,) = run.parse([key])[key]
    task = queue.get(published.task_id)
    assert (result.outcome, task["status"], task["error_code"]) == ("failed", "DEAD", "EMPTY_DOCUMENT")
    assert "OCR" in task["error_message"]


@pytest.mark.parametrize("keep_seconds, stored", [
    (60.0, ["chunk_embeddings.pickle"]),  # parse and chunk took less: recomputed on re-execution, never stored
    (0.0, ["chunk_embeddings.pickle", "document_chunks.pickle", "parsed_document.pickle"]),
])
def test_only_outputs_dearer_to_remake_than_to_store_are_stored(db, db_url, migration, monkeypatch, keep_seconds,
                                                                stored):
    """A cheap parse or chunk output is held in memory only (KEEP_ARTIFACT_SECONDS); vectors are always stored.
    A re-execution from the publish step (a fresh run, nothing in memory) then remakes the chunks and reads
    the vectors back, and publishes the same rows."""
    from resources import indexing_run

    monkeypatch.setattr(indexing_run, "KEEP_ARTIFACT_SECONDS", keep_seconds)
    m = migration
    leases = [claim(m, "minilm-v1", "run-1"), claim(m, "shadow-b", "run-1")]
    run = make_run(db, m, "run-1", leases)
    for step in (run.parse, run.chunk, run.embed):
        step([m["key"]])
    for task_id, _ in leases:
        assert sorted(p.name for p in m["store"].task_folder(task_id).iterdir()) == stored

    def no_model(model: str):
        raise AssertionError("a re-execution from publish embedded again instead of reading the stored vectors")

    make_run(db, m, "run-1", leases, embedder=no_model).publish([m["key"]])
    statuses = db_rows(db_url, "SELECT profile, status FROM index_task ORDER BY profile")
    assert statuses == [("minilm-v1", "SUCCEEDED"), ("shadow-b", "SUCCEEDED")]
    assert_each_profile_has_its_own_chunks_and_vectors(db_url)
