"""The warm embedding service: same vectors as the model in-process, a key to talk to it, and runs that
fall back to their own model when it is missing, refuses them, dies or hangs."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from pipelines.domain.errors import EmbeddingTimeout, EmbeddingUnavailable
from resources.dagster_resources import EmbedderResource
from resources.embedder import FakeEmbedder, checked_embed
from resources.embedding_service import (
    ServiceEmbedder,
    ServiceOrLocal,
    serve,
    service_available,
    socket_path,
    start_service,
)

TEXTS = ["Refunds are paid within 30 days.", "Hotel nights up to the city rate.", "退款在三十天内支付。"]


@pytest.fixture
def home(tmp_path) -> Path:
    # Unix socket paths are limited to ~100 bytes: keep the folder short.
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="kbes-"))
    yield folder
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def service(home):
    """A service on a thread of this process, serving the fake model (and the real one if asked)."""
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(home,), kwargs={"preload": [], "ready": ready, "stop": stop}, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield home
    stop.set()
    thread.join(10)
    assert not thread.is_alive()


def test_the_service_answers_what_the_model_answers_and_checked_embed_accepts_it(service):
    client = ServiceEmbedder("fake-384", service)
    vectors = checked_embed(client, TEXTS, expected_model="fake-384", expected_dim=384, batch_size=2)
    np.testing.assert_array_equal(vectors, FakeEmbedder(model_name="fake-384").embed(TEXTS))
    assert client.ping()["requests"] == 2  # two batches
    assert service_available(service)


def test_a_client_without_the_key_is_refused(service):
    (service / "embedder.key").write_text("0" * 64)  # a well-formed, private, wrong key
    with pytest.raises(EmbeddingUnavailable, match="cannot be reached"):
        ServiceEmbedder("fake-384", service).embed(TEXTS)
    assert not service_available(service)


def test_the_socket_and_key_are_private_to_the_owner(service):
    assert (socket_path(service).stat().st_mode & 0o777) == 0o600
    assert ((service / "embedder.key").stat().st_mode & 0o777) == 0o600


def test_no_service_is_unavailable_not_a_crash(home):
    assert not service_available(home)
    with pytest.raises(EmbeddingUnavailable):
        ServiceEmbedder("fake-384", home).embed(TEXTS)


def test_an_unknown_model_is_reported_with_its_code(service):
    with pytest.raises(EmbeddingUnavailable, match="EMBEDDING_UNAVAILABLE"):
        ServiceEmbedder("./no/such/model", service).embed(TEXTS)


def _service_process(home: Path):
    env = {**os.environ, "KBINDEX_EMBED_SERVICE_PRELOAD": ""}
    return start_service(home, env, timeout=60)


def test_runs_fall_back_to_their_own_model_when_the_service_is_killed(home):
    proc = _service_process(home)
    try:
        fallbacks: list[Exception] = []
        embedder = ServiceOrLocal(ServiceEmbedder("fake-384", home), lambda: FakeEmbedder(model_name="fake-384"),
                                  fallbacks.append)
        first = checked_embed(embedder, TEXTS, expected_model="fake-384", expected_dim=384)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        second = checked_embed(embedder, TEXTS, expected_model="fake-384", expected_dim=384)
    finally:
        proc.kill()
    np.testing.assert_array_equal(first, second)
    assert len(fallbacks) == 1 and isinstance(fallbacks[0], EmbeddingUnavailable)


def test_a_hung_service_times_out_and_the_run_falls_back(home):
    proc = _service_process(home)
    try:
        proc.send_signal(signal.SIGSTOP)
        fallbacks: list[Exception] = []
        service = ServiceEmbedder("fake-384", home, timeout=1.0)
        with pytest.raises((EmbeddingTimeout, EmbeddingUnavailable)):
            service.embed(TEXTS)  # the handshake or the answer never comes
        embedder = ServiceOrLocal(ServiceEmbedder("fake-384", home, timeout=1.0),
                                  lambda: FakeEmbedder(model_name="fake-384"), fallbacks.append)
        vectors = checked_embed(embedder, TEXTS, expected_model="fake-384", expected_dim=384)
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    assert vectors.shape == (3, 384) and len(fallbacks) == 1


def test_only_small_runs_use_the_service_and_only_when_it_answers(service, home):
    resource = EmbedderResource(service_home=str(service), service_max_versions=2)
    assert resource._service_fits([(1, 1), (2, 1)])
    assert not resource._service_fits([(1, 1), (2, 1), (3, 1)])  # a bulk run loads its own model
    assert not resource._service_fits([])  # a backfill without leases: its size is unknown
    assert not EmbedderResource(service_home="")._service_fits([(1, 1)])


def test_a_run_with_no_service_answering_embeds_on_its_own(home):
    assert not EmbedderResource(service_home=str(home))._service_fits([(1, 1)])


@pytest.mark.slow
def test_a_small_run_embeds_through_the_service_and_publishes_the_models_vectors(db_url, tmp_path, home, monkeypatch):
    """The resource wiring end to end: a one-version run with the real model asks the service, never loads torch itself."""
    import dagster as dg

    from pipelines.assets import indexing_assets
    from pipelines.partitions import VERSIONS_PARTITIONS_NAME
    from resources.blob_store import BlobStore
    from resources.dagster_resources import LEASES_TAG, OWNER_TAG, default_resources, encode_leases
    from resources.database import Database
    from resources.embedder import SentenceTransformerEmbedder
    from resources.publisher import Publisher
    from resources.search import search
    from resources.task_queue import TaskQueue

    for name, value in {"KBINDEX_DATABASE_URL": db_url, "KBINDEX_BLOB_URL": str(tmp_path / "blobs"),
                        "KBINDEX_ARTIFACTS": str(tmp_path / "artifacts"), "KBINDEX_EMBED_SERVICE": str(home),
                        "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(name, value)
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(home,), kwargs={"ready": ready, "stop": stop}, daemon=True)
    thread.start()  # preloads the packaged model, as `kbindex embed-service` does
    assert ready.wait(120)
    db = Database(db_url)
    try:
        published = Publisher(db, BlobStore(str(tmp_path / "blobs"))).publish(
            "acme", "refunds.md", b"# Refunds\n\nCustomers may ask for a refund within 30 days of purchase.", "refunds.md")
        (claimed,) = TaskQueue(db, lease_seconds=60).claim("small-run", limit=1)
        (key,) = [r["partition_key"] for r in db.fetch_all("document_version_partition_keys", {"task_ids": [claimed.lease.task_id]})]
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, [key])
        before = ServiceEmbedder("", home).ping()["requests"]
        result = dg.materialize(indexing_assets, resources=default_resources(), instance=instance, partition_key=key,
                                tags={LEASES_TAG: encode_leases([(claimed.lease.task_id, claimed.lease.attempt)]),
                                      OWNER_TAG: "small-run"})
        assert result.success
        assert ServiceEmbedder("", home).ping()["requests"] > before  # the run's batches went to the service
        assert TaskQueue(db).get(published.task_id)["status"] == "SUCCEEDED"
        (hit, *_) = search(db, SentenceTransformerEmbedder(), "how long do I have to ask for a refund", tenant_id="acme", k=1)
        assert hit.document_id == "refunds.md" and hit.score > 0.5
    finally:
        db.close()
        stop.set()
        thread.join(10)


def test_a_silent_client_does_not_block_the_service(service, monkeypatch):
    """Issue #17: the handshake runs on the connection's own thread, with a timeout."""
    import socket
    import time

    from resources import embedding_service

    monkeypatch.setattr(embedding_service, "HANDSHAKE_TIMEOUT", 1.0)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(socket_path(service)))  # connects, then never answers the challenge
    try:
        started = time.monotonic()
        client = ServiceEmbedder("fake-384", service, timeout=5)
        assert client.ping()["pid"] == os.getpid()
        assert time.monotonic() - started < 3
        client.close()
        silent.settimeout(5)
        silent.recv(4096)  # the challenge
        assert silent.recv(4096) == b""  # then the service hangs up on it after HANDSHAKE_TIMEOUT
    finally:
        silent.close()
