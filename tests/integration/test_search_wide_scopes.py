"""A filtered scope the probe found too wide for the exact path is walked at once by the next searches of the same
scope (resources/search.py WIDE_SCOPES, WIDE_SCOPE_SECONDS); a narrow scope keeps its exact answer every time."""

from __future__ import annotations

import time

import pytest

import resources.search as search_module
from pipelines.domain.chunking import Chunk, VersionIdentity, chunk_id, content_digest
from pipelines.domain.metadata import ReadScope
from resources.database import Session
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder, checked_embed
from resources.index_sink import IndexSink
from resources.search import WideScopes, search
from resources.task_queue import TaskQueue

PROFILE = "minilm-v1"
HR = ReadScope.of(see_all=True, filters=["dept=hr"])
LEGAL = ReadScope.of(see_all=True, filters=["dept=legal"])


@pytest.fixture
def fake() -> FakeEmbedder:
    return FakeEmbedder(model_name=DEFAULT_MODEL_NAME)


@pytest.fixture
def corpus(db, publisher, fake):
    """Four hr documents and one legal one, two chunks each, indexed; at most two documents go the exact way."""
    queue, sink = TaskQueue(db, lease_seconds=120), IndexSink(db, TaskQueue(db, lease_seconds=120))
    docs = {f"hr-{i}": "hr" for i in range(4)} | {"legal-0": "legal"}
    for document, dept in docs.items():
        texts = [f"{dept} policy {document} part {n}: refunds and leave" for n in range(2)]
        publisher.publish("acme", document, "\n\n".join(texts).encode(), f"{document}.txt", metadata={"dept": dept})
        (claimed,) = queue.claim("test-worker", limit=1)
        identity = VersionIdentity("acme", document, claimed.version_number, PROFILE)
        chunks = [Chunk(chunk_id(identity, n, (document,), content_digest(t)), n, (document,), None, t, t, 10,
                        content_digest(t)) for n, t in enumerate(texts)]
        vectors = checked_embed(fake, texts, expected_model=DEFAULT_MODEL_NAME, expected_dim=384, batch_size=8)
        sink.publish(claimed.lease, chunks, vectors)
    return docs


@pytest.fixture
def probes(monkeypatch) -> list[str]:
    """The names of the scope probes searches run from here on; a fresh memory of wide scopes; two documents
    at most for the exact path, so dept=hr (four) is too wide and dept=legal (one) is not."""
    monkeypatch.setattr(search_module, "WIDE_SCOPES", WideScopes(60.0))
    monkeypatch.setattr(search_module, "EXACT_SCOPE_POINTERS", 2)
    ran: list[str] = []
    real = Session.fetch_all

    def spy(self, query_name, params=None):
        if query_name == "search_hits_scoped":
            ran.append(query_name)
        return real(self, query_name, params)

    monkeypatch.setattr(Session, "fetch_all", spy)
    return ran


def docs_of(hits) -> list[tuple[str, str]]:
    return [(h.document_id, h.chunk_id) for h in hits]


@pytest.mark.parametrize("mode", ["dense", "hybrid"])
def test_a_scope_found_too_wide_is_walked_at_once_next_time(db, fake, corpus, probes, mode):
    first = search(db, fake, "refunds", tenant_id="acme", k=3, mode=mode, read=HR)
    assert probes == ["search_hits_scoped"]
    again = search(db, fake, "refunds", tenant_id="acme", k=3, mode=mode, read=HR)
    assert probes == ["search_hits_scoped"], "the remembered wide scope was probed again"
    assert docs_of(again) == docs_of(first) and {h.metadata["dept"] for h in again} == {"hr"}


def test_a_narrow_scope_keeps_its_exact_answer_every_time(db, fake, corpus, probes):
    for _ in range(2):
        hits = search(db, fake, "refunds", tenant_id="acme", k=3, mode="dense", read=LEGAL)
        assert {h.document_id for h in hits} == {"legal-0"}
    assert probes == ["search_hits_scoped"] * 2, "an exact verdict is never remembered"


def test_another_reader_or_tenant_of_the_same_filters_probes_for_itself(db, fake, corpus, probes):
    search(db, fake, "refunds", tenant_id="acme", k=3, mode="dense", read=HR)
    search(db, fake, "refunds", tenant_id="acme", k=3, mode="dense",
           read=ReadScope.of(["group:hr"], filters=["dept=hr"]))
    search(db, fake, "refunds", tenant_id="other", k=3, mode="dense", read=HR)
    assert probes == ["search_hits_scoped"] * 3


def test_the_verdict_expires_and_zero_seconds_remembers_nothing(db, fake, corpus, probes, monkeypatch):
    monkeypatch.setattr(search_module, "WIDE_SCOPES", WideScopes(0.3))
    search(db, fake, "refunds", tenant_id="acme", k=3, mode="dense", read=HR)
    time.sleep(0.5)
    search(db, fake, "refunds", tenant_id="acme", k=3, mode="dense", read=HR)
    assert probes == ["search_hits_scoped"] * 2, "an expired verdict still skipped the probe"
    probes.clear()
    monkeypatch.setattr(search_module, "WIDE_SCOPES", WideScopes(0.0))
    for _ in range(2):
        search(db, fake, "refunds", tenant_id="acme", k=3, mode="dense", read=HR)
    assert probes == ["search_hits_scoped"] * 2


def test_a_full_memory_forgets_its_expired_verdicts_first():
    wide = WideScopes(60.0, size=2)
    wide._until[("old",)] = time.monotonic() - 1  # expired
    wide.remember(("a",))
    wide.remember(("b",))
    assert wide.known(("a",)) and wide.known(("b",)) and ("old",) not in wide._until
    wide.remember(("c",))  # full of live verdicts: starts over
    assert wide.known(("c",)) and not wide.known(("a",))
