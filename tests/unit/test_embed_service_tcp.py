"""The embedding service over TCP (issue #32): where it may listen and how clients name it (refusals included),
which key each side uses, the client's network bounds, and the key handshake on a TCP connection.

The handshake tests run the real service (``serve``) on a thread with one spawned worker process and the
fake model, on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipelines.domain.errors import EmbeddingUnavailable
from pipelines.domain.service_address import ServiceAddress, parse_listen, parse_service_address
from resources import embedding_service
from resources.embedding_service import ServiceEmbedder, serve, service_available, served_embedder, ServiceOrLocal
from resources.settings import EmbedServiceBounds, embed_service_fallback, embed_service_listen

# -- addresses ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("/var/run/kbindex-embed", ServiceAddress(folder="/var/run/kbindex-embed")),
    (".kbindex", ServiceAddress(folder=".kbindex")),
    ("tcp://10.0.3.7:7311", ServiceAddress(host="10.0.3.7", port=7311)),
    ("TCP://embed.internal:7311", ServiceAddress(host="embed.internal", port=7311)),
    ("tcp://[fd00::7]:7311", ServiceAddress(host="fd00::7", port=7311)),
])
def test_a_client_names_the_service_by_folder_or_tcp_address(value, expected):
    address = parse_service_address(value)
    assert address == expected
    assert address.is_tcp == (expected.host is not None)
    if address.is_tcp:
        assert parse_service_address(str(address)) == address  # round trip (the CLI prints it)


@pytest.mark.parametrize(("value", "why"), [
    ("", "empty"),
    ("tcp://10.0.3.7", "no port"),
    ("tcp://:7311", "no host"),
    ("tcp://10.0.3.7:0", "port 0"),
    ("tcp://10.0.3.7:65536", "1 to 65535"),
    ("tcp://10.0.3.7:http", "1 to 65535"),
    ("tcp://user@10.0.3.7:7311", "nothing else"),
    ("tcp://10.0.3.7:7311/embed", "nothing else"),
    ("tcp://fd00::7:7311", "brackets"),
    ("tcp://[not-v6]:7311", "not an IPv6"),
    ("tcp://bad_host!:7311", "neither an IP address nor a host name"),
    ("http://10.0.3.7:7311", "only scheme is tcp"),
])
def test_a_malformed_service_address_is_refused_naming_the_variable(value, why):
    with pytest.raises(ValueError, match=why) as refused:
        parse_service_address(value)
    assert "KBINDEX_EMBED_SERVICE" in str(refused.value)


@pytest.mark.parametrize(("value", "expected"), [
    ("127.0.0.1:7311", ("127.0.0.1", 7311)),
    ("10.77.1.1:7311", ("10.77.1.1", 7311)),  # a private interface: named explicitly, so allowed
    ("localhost:0", ("localhost", 0)),  # port 0: any free port (printed by the service)
    ("[::1]:7311", ("::1", 7311)),
])
def test_the_service_listens_on_an_explicit_address(value, expected):
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["0.0.0.0:7311", "[::]:7311", "0:7311"])
def test_a_wildcard_listen_address_is_refused_without_its_own_consent(value):
    if value == "0:7311":  # not an IP literal, not a host name: refused as such
        with pytest.raises(ValueError, match="neither"):
            parse_listen(value)
        return
    with pytest.raises(ValueError, match="every interface.*KBINDEX_EMBED_SERVICE_LISTEN_ANY=1"):
        parse_listen(value)
    assert parse_listen(value, allow_any=True)[1] == 7311


@pytest.mark.parametrize("value", ["7311", ":7311", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "host/x:1"])
def test_a_malformed_listen_address_is_refused(value):
    with pytest.raises(ValueError, match="KBINDEX_EMBED_SERVICE_LISTEN"):
        parse_listen(value)


def test_the_service_listens_on_tcp_only_when_told():
    assert embed_service_listen({}) is None and embed_service_listen({"KBINDEX_EMBED_SERVICE_LISTEN": " "}) is None
    assert embed_service_listen({"KBINDEX_EMBED_SERVICE_LISTEN": "127.0.0.1:7311"}) == ("127.0.0.1", 7311)
    with pytest.raises(ValueError, match="every interface"):
        embed_service_listen({"KBINDEX_EMBED_SERVICE_LISTEN": "0.0.0.0:7311"})
    assert embed_service_listen({"KBINDEX_EMBED_SERVICE_LISTEN": "0.0.0.0:7311",
                                 "KBINDEX_EMBED_SERVICE_LISTEN_ANY": "1"}) == ("0.0.0.0", 7311)


def test_the_cli_refuses_a_wildcard_listen_address_before_starting_anything(tmp_path, monkeypatch):
    from pipelines.cli import app

    monkeypatch.setenv("KBINDEX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KBINDEX_EMBED_SERVICE_LISTEN_ANY", raising=False)
    monkeypatch.setattr(embedding_service, "serve", lambda *a, **k: pytest.fail("the service was started"))
    result = CliRunner().invoke(app, ["embed-service", "--listen", "0.0.0.0:7311"])
    assert result.exit_code == 2 and "every interface" in result.output


# -- fallback and bounds -----------------------------------------------------------------------------


def test_a_remote_service_fails_the_step_instead_of_loading_the_model_by_default():
    assert embed_service_fallback(is_tcp=False, env={}) == "local"
    assert embed_service_fallback(is_tcp=True, env={}) == "none"
    assert embed_service_fallback(is_tcp=True, env={"KBINDEX_EMBED_SERVICE_FALLBACK": "local"}) == "local"
    with pytest.raises(ValueError, match="local or none"):
        embed_service_fallback(is_tcp=True, env={"KBINDEX_EMBED_SERVICE_FALLBACK": "maybe"})


def test_served_embedder_is_the_bare_client_for_tcp_and_falls_back_for_a_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("KBINDEX_EMBED_SERVICE_FALLBACK", raising=False)
    assert type(served_embedder("fake-384", "tcp://127.0.0.1:7311", object)) is ServiceEmbedder
    assert type(served_embedder("fake-384", str(tmp_path), object)) is ServiceOrLocal


def test_the_client_network_bounds_are_finite_by_default_and_configurable():
    default = EmbedServiceBounds.from_env({})
    assert default.silent_bound_s() == 17.0 and default.connect_timeout_s == 5.0
    fast = EmbedServiceBounds.from_env({"KBINDEX_EMBED_SERVICE_KEEPALIVES_IDLE_S": "1",
                                        "KBINDEX_EMBED_SERVICE_KEEPALIVES_INTERVAL_S": "1",
                                        "KBINDEX_EMBED_SERVICE_TCP_USER_TIMEOUT_MS": "3000"})
    assert fast.silent_bound_s() == 4.0
    no_keepalives = EmbedServiceBounds.from_env({"KBINDEX_EMBED_SERVICE_KEEPALIVES_IDLE_S": "0"})
    assert no_keepalives.silent_bound_s() == 60.0  # only the per-batch read deadline is left
    assert math.isfinite(EmbedServiceBounds.from_env({"KBINDEX_EMBED_SERVICE_KEEPALIVES_IDLE_S": "0",
                                                     "KBINDEX_EMBED_SERVICE_TIMEOUT": "0"}).silent_bound_s())
    with pytest.raises(ValueError, match="KBINDEX_EMBED_SERVICE_CONNECT_TIMEOUT_S"):
        EmbedServiceBounds.from_env({"KBINDEX_EMBED_SERVICE_CONNECT_TIMEOUT_S": "soon"})


# -- the key ------------------------------------------------------------------------------------------


def test_the_key_comes_from_the_environment_then_a_named_file_then_the_home(tmp_path):
    from resources.embedding_service import _key

    home = tmp_path / "home"
    made = _key(home, create=True, env={})
    assert len(made) == 64 and (os.stat(home / "embedder.key").st_mode & 0o777) == 0o600
    assert _key(home, create=False, env={"KBINDEX_EMBED_SERVICE_KEY": "k" * 40}) == b"k" * 40
    copy = tmp_path / "copy.key"
    copy.write_bytes(made)
    os.chmod(copy, 0o600)
    assert _key(tmp_path / "elsewhere", create=False, env={"KBINDEX_EMBED_SERVICE_KEY_FILE": str(copy)}) == made
    os.chmod(copy, 0o640)  # a copy others may read is refused like the original
    with pytest.raises(EmbeddingUnavailable, match="readable or writable by others"):
        _key(tmp_path / "elsewhere", create=False, env={"KBINDEX_EMBED_SERVICE_KEY_FILE": str(copy)})
    with pytest.raises(EmbeddingUnavailable, match="too short"):
        _key(home, create=False, env={"KBINDEX_EMBED_SERVICE_KEY": "short"})


# -- the handshake over TCP ---------------------------------------------------------------------------


@contextlib.contextmanager
def tcp_service(home: Path, **kwargs):
    """The real service on a thread: one worker process, the fake model, TCP on 127.0.0.1 and a free port."""
    ready, stop, bound = threading.Event(), threading.Event(), []
    thread = threading.Thread(target=serve, args=(home,), daemon=True, kwargs={
        "preload": [], "workers": 1, "ready": ready, "stop": stop, "listening": bound, **kwargs})
    thread.start()
    assert ready.wait(60)
    try:
        yield bound
    finally:
        stop.set()
        thread.join(10)
        assert not thread.is_alive()


@pytest.fixture
def home():
    folder = Path(tempfile.mkdtemp(prefix="kbes-tcp-"))  # short: Unix socket paths are limited to ~100 bytes
    yield folder
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def test_over_tcp_the_right_key_is_served_and_a_wrong_key_is_refused_both_ways(home, monkeypatch):
    monkeypatch.delenv("KBINDEX_EMBED_SERVICE_KEY", raising=False)
    with tcp_service(home, listen=("127.0.0.1", 0)) as bound:
        address = f"tcp://127.0.0.1:{bound[0][1]}"
        monkeypatch.setenv("KBINDEX_EMBED_SERVICE_KEY_FILE", str(home / "embedder.key"))
        client = ServiceEmbedder("fake-384", address, timeout=5)
        assert client.embed(["refunds", "hotels"]).shape == (2, 384)
        assert service_available(address)
        # Its TCP connection carries the client's bounds (a silent link errors instead of waiting for hours).
        with socket.socket(fileno=os.dup(client._conns[0].fileno())) as sock:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == client.bounds.tcp_user_timeout_ms
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == int(client.bounds.keepalives_idle_s)
        client.close()

        monkeypatch.delenv("KBINDEX_EMBED_SERVICE_KEY_FILE")
        monkeypatch.setenv("KBINDEX_EMBED_SERVICE_KEY", "0" * 64)  # well-formed, wrong
        with pytest.raises(EmbeddingUnavailable, match="cannot be reached \\(AuthenticationError\\)"):
            ServiceEmbedder("fake-384", address, timeout=5).embed(["refunds"])
        assert not service_available(address)

        monkeypatch.delenv("KBINDEX_EMBED_SERVICE_KEY")  # the service was not harmed by the stranger
        monkeypatch.setenv("KBINDEX_EMBED_SERVICE_KEY_FILE", str(home / "embedder.key"))
        assert service_available(address)


def test_a_silent_tcp_client_is_hung_up_on_after_the_handshake_timeout(home, monkeypatch):
    monkeypatch.setattr(embedding_service, "HANDSHAKE_TIMEOUT", 1.0)
    with tcp_service(home, listen=("127.0.0.1", 0)) as bound, socket.create_connection(bound[0], timeout=5) as silent:
        started = time.monotonic()
        assert silent.recv(4096)  # the challenge
        assert silent.recv(4096) == b""  # never answered: the service hangs up
        assert time.monotonic() - started < 4


def test_without_a_listen_address_the_service_opens_no_tcp_port(home, monkeypatch):
    monkeypatch.delenv("KBINDEX_EMBED_SERVICE_LISTEN", raising=False)
    with tcp_service(home) as bound:
        assert bound == [] and service_available(home)


def test_a_dagster_run_with_a_tcp_service_embeds_there_without_asking_first_and_never_loads_the_model(monkeypatch):
    """EmbedderResource: a tcp:// service is used even if it does not answer at setup (the run's embed step then
    fails retryably), and its embedder is the bare client: no ServiceOrLocal, so no model load in the run."""
    from resources.dagster_resources import EmbedderResource

    monkeypatch.delenv("KBINDEX_EMBED_SERVICE_FALLBACK", raising=False)
    resource = EmbedderResource(service_home="tcp://127.0.0.1:9")  # nothing listens on the discard port
    assert resource._service_fits([]) is True
    resource._use_service = True
    embedder = resource.for_model("all-MiniLM-L6-v2")
    assert type(embedder) is ServiceEmbedder and embedder.address == ServiceAddress(host="127.0.0.1", port=9)
    monkeypatch.setenv("KBINDEX_EMBED_SERVICE_KEY", "k" * 40)
    with pytest.raises(EmbeddingUnavailable, match="cannot be reached \\(ConnectionRefusedError\\)"):
        embedder.embed(["refunds"])
    monkeypatch.setenv("KBINDEX_EMBED_SERVICE_FALLBACK", "local")  # the operator's choice: ask, and fall back
    assert EmbedderResource(service_home="tcp://127.0.0.1:9")._service_fits([]) is False


def test_a_run_with_a_tcp_service_embeds_even_the_fake_model_there_and_one_on_this_machine_keeps_it_local(
        monkeypatch, tmp_path):
    """bench.chaos --network cuts the embedding host mid-batch under the fake model: its runs must embed across that
    link (a ``tcp://`` service), while a service on this machine still leaves the fake in the run."""
    from resources.dagster_resources import EmbedderResource
    from resources.embedder import FakeEmbedder

    monkeypatch.delenv("KBINDEX_EMBED_SERVICE_FALLBACK", raising=False)
    monkeypatch.delenv("KBINDEX_FAKE_DELAY", raising=False)
    remote = EmbedderResource(service_home="tcp://127.0.0.1:9")
    remote._use_service = True
    served = remote.for_model("fake-384")
    assert type(served) is ServiceEmbedder and served.model_name == "fake-384"
    local = EmbedderResource(service_home=str(tmp_path))
    local._use_service = True
    assert isinstance(local.for_model("fake-384"), FakeEmbedder)
    assert isinstance(EmbedderResource(service_home="tcp://127.0.0.1:9").for_model("fake-384"), FakeEmbedder)


def test_the_services_fake_injects_the_faults_asked_for_and_answers_them_with_their_codes(monkeypatch):
    """A worker's fake honours KBINDEX_FAKE_FAULTS as a run's does; a timeout comes back as EMBEDDING_TIMEOUT and a
    rate limit as EMBEDDING_RATE_LIMITED (the client raises those codes), not as an unclassified failure."""
    monkeypatch.setattr(embedding_service, "_WORKER", {"threads": 1})
    monkeypatch.setenv("KBINDEX_FAKE_DELAY", "0")
    monkeypatch.setenv("KBINDEX_FAKE_FAULTS", "timeout=1.0")
    assert embedding_service._worker_answer("embed", "fake-384", ["refunds"])[:2] == ("error", "EMBEDDING_TIMEOUT")
    monkeypatch.setattr(embedding_service, "_WORKER", {"threads": 1})
    monkeypatch.setenv("KBINDEX_FAKE_FAULTS", "rate_limit=1.0")
    assert embedding_service._worker_answer("embed", "fake-384", ["refunds"])[:2] == ("error", "EMBEDDING_RATE_LIMITED")
    monkeypatch.setattr(embedding_service, "_WORKER", {"threads": 1})
    monkeypatch.setenv("KBINDEX_FAKE_FAULTS", "wrong_dimension=1.0")
    status, (model, vectors) = embedding_service._worker_answer("embed", "fake-384", ["refunds"])
    assert (status, model, vectors.shape) == ("ok", "fake-384", (1, 385))  # the run's checked_embed refuses it
    monkeypatch.setattr(embedding_service, "_WORKER", {"threads": 1})
    monkeypatch.delenv("KBINDEX_FAKE_FAULTS")
    assert embedding_service._worker_answer("embed", "fake-384", ["refunds"])[1][1].shape == (1, 384)


def test_the_client_raises_the_code_the_service_answered(monkeypatch):
    from pipelines.domain.errors import EmbeddingRateLimited, EmbeddingTimeout

    client = ServiceEmbedder("fake-384", "tcp://127.0.0.1:9")

    class Answers:  # a connection whose service answered with an error
        def __init__(self, code):
            self.code = code

        def send(self, request):
            pass

        def poll(self, timeout):
            return True

        def recv(self):
            return ("error", self.code, "no")

        def close(self):
            pass

    for code, error in (("EMBEDDING_TIMEOUT", EmbeddingTimeout), ("EMBEDDING_RATE_LIMITED", EmbeddingRateLimited),
                        ("INVALID_REQUEST", EmbeddingUnavailable)):
        client._conns = [Answers(code)]
        with pytest.raises(error):
            client._call_many([{"op": "embed"}])
