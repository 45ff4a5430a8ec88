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
    (service / "embedder.key").write_text("not-the-key")
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
