"""Parse, chunk and embed overlap within a run (issue #15), and every failure still lands on its own task.

The parse step starts ``RunAhead`` (resources/run_ahead.py): a thread parses and chunks the run's tasks
while another embeds what is already chunked. These tests drive IndexingRun the way the assets do.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from pipelines.domain.errors import EmbeddingTimeout
from resources import run_ahead
from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.embedder import FakeEmbedder
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.publisher import Publisher
from resources.run_state import RunState
from resources.task_queue import TaskQueue


class Recording(FakeEmbedder):
    """The fake model, noting when each batch arrives and which texts; ``fail_first`` raises on the first call."""

    def __init__(self, model_name: str, fail_first: bool = False) -> None:
        super().__init__(model_name=model_name)
        self.seen: list[tuple[float, list[str]]] = []
        self.fail_first = fail_first
        self.lock = threading.Lock()

    def respond(self, texts):
        with self.lock:
            self.seen.append((time.monotonic(), list(texts)))
            if self.fail_first and len(self.seen) == 1:
                raise EmbeddingTimeout("the provider did not answer in time")
        return super().respond(texts)


@pytest.fixture
def world(db, db_url, tmp_path):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    blobs = BlobStore(str(tmp_path / "blobs"))
    return {"db": db, "db_url": db_url, "blobs": blobs, "publisher": Publisher(db, blobs),
            "queue": TaskQueue(db, lease_seconds=60), "store": ArtifactStore(tmp_path / "artifacts")}


def publish_and_claim(world, bodies: dict[str, bytes]):
    for name, body in bodies.items():
        world["publisher"].publish("acme", name, body, name)
    claimed = world["queue"].claim("sensor", limit=len(bodies), for_run=True)
    with psycopg.connect(world["db_url"]) as conn:
        keys = [k for (k,) in conn.execute("SELECT partition_key FROM document_version ORDER BY partition_key")]
    return [(c.lease.task_id, c.lease.attempt) for c in claimed], keys


def run_with_ahead(world, leases, keys, embedder) -> dict[str, dict]:
    queue = world["queue"]
    run = IndexingRun(db=world["db"], queue=queue, keeper=LeaseKeeper(queue), owner="run-ahead", granted_by="sensor",
                      blobs=world["blobs"], embedder_for=lambda model: embedder, state=RunState(world["store"]),
                      tagged=leases, batch_size=8)
    run.start_ahead(keys)
    results = {}
    for step in (run.parse, run.chunk, run.embed, run.publish):
        results[step.__name__] = step(keys)
    run.close()
    return results


def statuses(world) -> dict[str, tuple[str, str | None]]:
    with psycopg.connect(world["db_url"]) as conn:
        return {d: (s, c) for d, s, c in conn.execute("SELECT document_id, status, error_code FROM index_task")}


def body(i: int, paragraphs: int = 6) -> bytes:
    return "\n\n".join(f"Document {i} paragraph {p}: refunds of class {p} take {i + p} days." for p in range(paragraphs)).encode()


def test_embedding_starts_while_the_run_is_still_parsing(world, monkeypatch):
    import pipelines.domain.parsing as parsing

    parsed_at: list[float] = []
    real = parsing.parse_document

    def slow_parse(*args, **kwargs):
        time.sleep(0.05)
        out = real(*args, **kwargs)
        parsed_at.append(time.monotonic())
        return out

    monkeypatch.setattr(parsing, "parse_document", slow_parse)
    monkeypatch.setattr(run_ahead, "GROUP_TEXTS", 8)
    leases, keys = publish_and_claim(world, {f"doc-{i:02d}.txt": body(i) for i in range(20)})
    embedder = Recording("fake-384")
    results = run_with_ahead(world, leases, keys, embedder)
    assert all(r.outcome == "ok" for rs in results["publish"].values() for r in rs)
    assert embedder.seen and embedder.seen[0][0] < max(parsed_at), "the model waited for every parse"
    embedded = [t for _, texts in embedder.seen for t in texts]
    assert len(embedded) == len(set(embedded))  # each text once, ahead or not
    assert set(statuses(world).values()) == {("SUCCEEDED", None)}


def test_a_bad_file_fails_alone_at_its_own_step_while_the_others_run_ahead(world):
    bodies = {f"doc-{i:02d}.txt": body(i) for i in range(6)}
    bodies["broken.pdf"] = b"%PDF-1.7 this is not a PDF at all"
    leases, keys = publish_and_claim(world, bodies)
    embedder = Recording("fake-384")
    results = run_with_ahead(world, leases, keys, embedder)
    failed = [r for rs in results["parse"].values() for r in rs if r.outcome == "failed"]
    states = statuses(world)
    assert states.pop("broken.pdf")[0] in ("DEAD", "RETRY_WAIT")
    assert set(states.values()) == {("SUCCEEDED", None)}
    assert len(failed) == 1 and failed[0].error_code  # reported at the parse step, with its code
    assert not any("not a PDF" in t for _, texts in embedder.seen for t in texts)


def test_a_cancelled_task_is_never_published_and_its_batch_mates_are(world):
    leases, keys = publish_and_claim(world, {f"doc-{i:02d}.txt": body(i) for i in range(8)})
    world["queue"].cancel(leases[3][0])
    results = run_with_ahead(world, leases, keys, Recording("fake-384"))
    outcomes = sorted(r.outcome for rs in results["publish"].values() for r in rs)
    assert outcomes.count("ok") == 7
    states = statuses(world)
    assert sorted(s for s, _ in states.values()) == ["CANCELLED"] + ["SUCCEEDED"] * 7
    with psycopg.connect(world["db_url"]) as conn:
        (pointed,) = conn.execute("SELECT count(*) FROM search_pointer").fetchone()
    assert pointed == 7


def test_trouble_while_embedding_ahead_leaves_the_rest_to_the_embed_step(world, monkeypatch):
    monkeypatch.setattr(run_ahead, "GROUP_TEXTS", 8)
    leases, keys = publish_and_claim(world, {f"doc-{i:02d}.txt": body(i) for i in range(10)})
    embedder = Recording("fake-384", fail_first=True)
    results = run_with_ahead(world, leases, keys, embedder)
    assert all(r.outcome == "ok" for rs in results["publish"].values() for r in rs)
    assert set(statuses(world).values()) == {("SUCCEEDED", None)}
    counts = [r.details for rs in results["embed"].values() for r in rs]
    assert sum(c["embedded"] + c["shared"] for c in counts) == sum(c["vectors"] for c in counts)


class Silent(FakeEmbedder):
    """An embedding service that stopped answering: every call fails as a cut link does, after the client's bound
    (here just above the outage's slow-failure threshold, which the test lowers)."""

    def respond(self, texts):
        self.calls.append(len(texts))
        time.sleep(0.06)
        raise TimeoutError("the embedding service did not answer within its bound")


def test_an_embedder_that_stops_answering_costs_the_run_two_calls_not_one_per_task(world, monkeypatch):
    """Issue #32: a silent embedder used to be met once ahead, once by the embed step's shared pass and once per
    task: a run of N versions held its slot for N + 2 client bounds. Two failures in a row trip the model for
    the run (resources/embed_outage.py), and every task is failed at once, retryable, to be retried later."""
    from resources import embed_outage

    monkeypatch.setattr(run_ahead, "GROUP_TEXTS", 8)
    monkeypatch.setattr(embed_outage, "SLOW_FAILURE_S", 0.05)
    leases, keys = publish_and_claim(world, {f"doc-{i:02d}.txt": body(i) for i in range(10)})
    embedder = Silent(model_name="fake-384")
    results = run_with_ahead(world, leases, keys, embedder)
    assert len(embedder.calls) == 2, embedder.calls  # the pass ahead, the embed step's shared pass: then none
    failed = [r for rs in results["embed"].values() for r in rs]
    assert len(failed) == 10 and {r.error_code for r in failed} == {"EMBEDDING_UNAVAILABLE"}
    assert set(statuses(world).values()) == {("RETRY_WAIT", "EMBEDDING_UNAVAILABLE")}
    assert "2 slow calls in a row in this run" in failed[-1].reason
