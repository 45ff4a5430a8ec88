"""The warm embedding service: same vectors as the model in-process, a key to talk to it, a pool of
worker processes that survives a killed worker, and runs that fall back to their own model when it is
missing, refuses them, dies or hangs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import threading
from pathlib import Path

import numpy as np
import pytest

from pipelines.domain.errors import EmbeddingInvalidResponse, EmbeddingTimeout, EmbeddingUnavailable
from resources.dagster_resources import EmbedderResource
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder, checked_embed, embedder_for_model
from resources.embedding_service import (
    ServiceEmbedder,
    ServiceOrLocal,
    default_workers,
    serve,
    service_available,
    socket_path,
    deal,
    start_service,
    undeal,
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
    """A service on a thread of this process with 2 worker processes, serving the fake model."""
    with _serving(home, preload=[], workers=2):
        yield home


@contextlib.contextmanager
def _serving(home: Path, **kwargs):
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(home,), kwargs={**kwargs, "ready": ready, "stop": stop}, daemon=True)
    thread.start()
    assert ready.wait(180)
    try:
        yield home
    finally:
        stop.set()
        thread.join(10)
        assert not thread.is_alive()


def test_the_service_answers_what_the_model_answers_and_checked_embed_accepts_it(service):
    client = ServiceEmbedder("fake-384", service)
    vectors = checked_embed(client, TEXTS, expected_model="fake-384", expected_dim=384, batch_size=2)
    np.testing.assert_array_equal(vectors, FakeEmbedder(model_name="fake-384").embed(TEXTS))
    assert client.ping()["requests"] == 3  # a batch of 2 split over the 2 workers, then a batch of 1
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
        workers = ServiceEmbedder("", home).ping()["worker_pids"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        second = checked_embed(embedder, TEXTS, expected_model="fake-384", expected_dim=384)
    finally:
        proc.kill()
    np.testing.assert_array_equal(first, second)
    assert len(fallbacks) == 1 and isinstance(fallbacks[0], EmbeddingUnavailable)
    assert len(workers) == default_workers()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers)  # orphaned workers notice and exit; they hold a model each


def test_a_run_goes_back_to_the_service_once_it_answers_again(home):
    """After a fallback the run retries the service (a quick ping first) and returns to it, freeing its own model."""
    proc = _service_process(home)
    try:
        fallbacks: list[Exception] = []
        embedder = ServiceOrLocal(ServiceEmbedder("fake-384", home), lambda: FakeEmbedder(model_name="fake-384"),
                                  fallbacks.append, retry_seconds=0.5)
        served = checked_embed(embedder, TEXTS, expected_model="fake-384", expected_dim=384)
        proc.kill()
        proc.wait(10)
        local = checked_embed(embedder, TEXTS, expected_model="fake-384", expected_dim=384)
        time.sleep(0.6)
        still_local = checked_embed(embedder, TEXTS, expected_model="fake-384", expected_dim=384)  # nobody answers yet
        assert len(fallbacks) == 1 and embedder.returns == 0
        proc = _service_process(home)
        before = ServiceEmbedder("", home).ping()["requests"]
        time.sleep(0.6)
        back = checked_embed(embedder, TEXTS, expected_model="fake-384", expected_dim=384)
        assert embedder.returns == 1 and ServiceEmbedder("", home).ping()["requests"] > before  # served there
        assert embedder._local is None  # its own copy of the model is let go
    finally:
        proc.kill()
    for vectors in (local, still_local, back):
        np.testing.assert_array_equal(vectors, served)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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


def test_every_run_uses_the_service_when_it_answers_unless_limited(service, home):
    big_run = [(i, 1) for i in range(1, 13)]
    assert EmbedderResource(service_home=str(service))._service_fits(big_run)  # issue 15: no size limit by default
    assert EmbedderResource(service_home=str(service))._service_fits([])  # a backfill without leases too
    limited = EmbedderResource(service_home=str(service), service_max_versions=2)
    assert limited._service_fits([(1, 1), (2, 1)])
    assert not limited._service_fits([(1, 1), (2, 1), (3, 1)])  # a bulk run loads its own model
    assert not limited._service_fits([])  # a backfill without leases: its size is unknown
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
    from resources.publisher import Publisher
    from resources.search import search
    from resources.task_queue import TaskQueue

    for name, value in {"KBINDEX_DATABASE_URL": db_url, "KBINDEX_BLOB_URL": str(tmp_path / "blobs"),
                        "KBINDEX_ARTIFACTS": str(tmp_path / "artifacts"), "KBINDEX_EMBED_SERVICE": str(home),
                        "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(name, value)
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(home,), kwargs={"ready": ready, "stop": stop}, daemon=True)
    thread.start()  # preloads the default model, as `kbindex embed-service` does
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
        (hit, *_) = search(db, embedder_for_model(DEFAULT_MODEL_NAME), "how long do I have to ask for a refund", tenant_id="acme", k=1)
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


# -- the worker pool (issue 15) ---------------------------------------------------------------------


def test_a_batch_is_dealt_to_the_workers_and_put_back_in_order():
    for count in range(0, 9):
        batch = [f"text {i} " * (1 + i % 5) for i in range(count)]  # distinct, of mixed lengths
        for workers in (1, 2, 3, 5):
            parts = deal(batch, workers)
            assert len(parts) == max(1, min(workers, count)) and (count == 0 or all(parts))
            assert sorted(t for part in parts for t in part) == sorted(batch)
            rows = [np.array([[batch.index(t), 0.0] for t in part], dtype=np.float32).reshape(-1, 2) for part in parts]
            assert undeal(rows, parts)[:, 0].tolist() == list(range(count))


def test_a_part_answered_with_the_wrong_rows_is_an_invalid_response(monkeypatch):
    client = ServiceEmbedder("fake-384", "/nonexistent")
    client._workers = 2
    short = [("fake-384", np.zeros((1, 384), np.float32)), ("fake-384", np.zeros((0, 384), np.float32))]
    monkeypatch.setattr(client, "_call_many", lambda requests: short)
    with pytest.raises(EmbeddingInvalidResponse, match="shapes"):
        client.respond(TEXTS[:2])


def test_the_worker_count_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("KBINDEX_EMBED_WORKERS", "3")
    assert default_workers() == 3
    monkeypatch.delenv("KBINDEX_EMBED_WORKERS")
    assert default_workers() == len(os.sched_getaffinity(0))


def test_two_workers_answer_two_clients_at_once(home, monkeypatch):
    monkeypatch.setenv("KBINDEX_FAKE_DELAY", "1.5")  # each request sleeps in its worker (inherited at spawn)
    with _serving(home, preload=[], workers=2):
        ping = ServiceEmbedder("", home).ping()
        assert ping["workers"] == 2 and len(ping["worker_pids"]) == 2
        results: dict[int, np.ndarray] = {}

        def ask(n: int) -> None:
            results[n] = ServiceEmbedder("fake-384", home, timeout=20).embed([f"client {n}: {TEXTS[n]}"])

        started = time.monotonic()
        clients = [threading.Thread(target=ask, args=(n,)) for n in (0, 1)]
        for client in clients:
            client.start()
        for client in clients:
            client.join(30)
        elapsed = time.monotonic() - started
    fake = FakeEmbedder(model_name="fake-384")
    for n in (0, 1):
        np.testing.assert_array_equal(results[n], fake.embed([f"client {n}: {TEXTS[n]}"]))
    assert elapsed < 2.9  # side by side (1.5 s), not one after the other (3 s)


def test_a_killed_worker_fails_the_request_cleanly_and_the_next_one_succeeds(home, monkeypatch):
    monkeypatch.setenv("KBINDEX_FAKE_DELAY", "5")
    with _serving(home, preload=[], workers=2):
        client = ServiceEmbedder("fake-384", home, timeout=30)
        before = client.ping()["worker_pids"]
        outcome: list[BaseException] = []

        def in_flight() -> None:
            try:
                client.embed(TEXTS[:2])  # one text on each worker
            except BaseException as exc:  # noqa: BLE001 - asserted below
                outcome.append(exc)

        started = time.monotonic()
        request = threading.Thread(target=in_flight)
        request.start()
        time.sleep(0.7)  # both parts are asleep in their workers
        os.kill(before[0], signal.SIGKILL)
        request.join(30)
        failed_after = time.monotonic() - started
        assert not request.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], EmbeddingUnavailable), outcome
        assert "worker died" in str(outcome[0])
        assert failed_after < 4.5  # at once, not after the 5 s sleep or the 30 s timeout
        vectors = client.embed(TEXTS[:2])  # a fresh pool answers
        np.testing.assert_array_equal(vectors, FakeEmbedder(model_name="fake-384").embed(TEXTS[:2]))
        deadline = time.monotonic() + 20
        while len(client.ping()["worker_pids"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the fresh pool's warm-up reports its pids once both workers are up
        after = client.ping()["worker_pids"]
        assert len(after) == 2 and not set(after) & set(before)


def test_a_stopped_service_takes_its_workers_with_it(home):
    proc = _service_process(home)
    try:
        workers = ServiceEmbedder("", home).ping()["worker_pids"]
        proc.terminate()  # as `kbindex dev` stops it
        proc.wait(20)
    finally:
        proc.kill()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert workers and not any(_alive(pid) for pid in workers)
    assert not socket_path(home).exists()


def test_a_stop_does_not_wait_for_the_request_being_embedded(home, monkeypatch):
    """`kbindex dev` stopped while a run embeds: the service exits at once and the request fails cleanly. It
    used to finish the request first (the interpreter joins the worker pool's threads): a run's whole batch,
    16-19.5 s of a stop under load with a real document in tests/acceptance/test_dev_command.py."""
    delay = 20.0
    monkeypatch.setenv("KBINDEX_FAKE_DELAY", str(delay))  # the request sleeps this long in its worker
    proc = _service_process(home)
    try:
        client = ServiceEmbedder("fake-384", home, timeout=60)
        workers = client.ping()["worker_pids"]
        outcome: list[BaseException] = []

        def in_flight() -> None:
            try:
                client.embed(TEXTS)
            except BaseException as exc:  # noqa: BLE001 - asserted below
                outcome.append(exc)

        request = threading.Thread(target=in_flight)
        request.start()
        time.sleep(1.0)  # asleep in its worker
        sent = time.monotonic()
        proc.terminate()  # as `kbindex dev` stops it
        proc.wait(delay + 20)
        took = time.monotonic() - sent
        request.join(30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert took < delay / 4, f"the stop waited {took:.1f} s for the request in flight"
    assert len(outcome) == 1 and isinstance(outcome[0], EmbeddingUnavailable), outcome
    assert not any(_alive(pid) for pid in workers)
    assert not socket_path(home).exists()


def test_a_service_whose_workers_cannot_load_the_model_does_not_start(home):
    with pytest.raises(EmbeddingUnavailable, match="workers could not start"):
        serve(home, preload=["./no/such/model"], workers=1)
    assert not socket_path(home).exists()


@pytest.fixture(scope="module")
def real_service():
    """Two workers with the real packaged torch model loaded at start (as `kbindex embed-service` runs)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="kbes-"))
    try:
        with _serving(folder, preload=["all-MiniLM-L6-v2"], workers=2):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_a_split_request_gives_the_local_models_vectors(real_service):
    from resources.embedder import SentenceTransformerEmbedder

    texts = [f"{TEXTS[i % 3]} Paragraph {i} " + "more words " * (i % 7) for i in range(20)]
    client = ServiceEmbedder("all-MiniLM-L6-v2", real_service)
    before = client.ping()["requests"]
    served = client.embed(texts)
    assert client.ping()["requests"] == before + 2  # one part per worker
    np.testing.assert_allclose(served, SentenceTransformerEmbedder().embed(texts), atol=1e-5)


RUN_THROUGH_THE_RESOURCE = """
import json, sys, types
from resources.dagster_resources import LEASES_TAG, MODELS_TAG, EmbedderResource, encode_leases
resource = EmbedderResource(service_home=sys.argv[1])
run = types.SimpleNamespace(tags={LEASES_TAG: encode_leases([(i, 1) for i in range(1, 13)]), MODELS_TAG: "all-MiniLM-L6-v2"})
resource.setup_for_execution(types.SimpleNamespace(dagster_run=run))
resource.preload({"all-MiniLM-L6-v2"})  # as the parse step does
vectors = resource.for_model("all-MiniLM-L6-v2").embed(json.loads(sys.argv[2]))
print(json.dumps({"torch": "torch" in sys.modules, "sentence_transformers": "sentence_transformers" in sys.modules,
                  "vectors": vectors.tolist()}))
"""


@pytest.mark.slow
def test_a_run_of_twelve_versions_embeds_through_the_service_without_importing_torch(real_service):
    from resources.embedder import SentenceTransformerEmbedder

    client = ServiceEmbedder("", real_service)
    before = client.ping()["requests"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    import json

    out = subprocess.run([sys.executable, "-c", RUN_THROUGH_THE_RESOURCE, str(real_service), json.dumps(TEXTS)],
                         env=env, capture_output=True, text=True, timeout=120, check=True,
                         cwd=str(Path(__file__).resolve().parents[2]))
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert client.ping()["requests"] > before  # the run's batch went to the service
    assert answer["torch"] is False and answer["sentence_transformers"] is False
    np.testing.assert_allclose(np.array(answer["vectors"], dtype=np.float32), SentenceTransformerEmbedder().embed(TEXTS),
                               atol=1e-5)
