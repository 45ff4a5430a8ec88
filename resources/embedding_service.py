"""A warm embedding model shared by the run processes of one machine, over a local socket.

Why: every Dagster run is a fresh process, and importing torch + sentence-transformers and loading
the model costs ~5 s of it: most of a single document's publish-to-searchable time. The service
keeps the model loaded in a pool of worker processes; every run sends its batches here and never
imports torch, and any trouble with the service makes the run fall back to its own model: the
service is a shortcut, never a dependency.

    serve(home, workers=n)           n worker processes with the packaged model, answering on home/embedder.sock
    ServiceEmbedder(model, address)  the client: an ``Embedder`` with ``respond`` (checked_embed validates it)
    start_service(home, env)         start ``kbindex embed-service`` as a child process and wait until it answers

Transport: ``multiprocessing.connection`` on a Unix socket, authenticated with a random key in
``home/embedder.key`` (mode 0600): only a process that can read the key may send a request (the
messages are pickles, so the key is what keeps strangers out, both ways: a client unpickles the
replies). So a key is refused, by the service and by its clients, when it is empty (the standard
library would then skip authentication), a symlink, not owned by this user, or readable or
writable by group or others; ``home`` is created 0700. Each connection's handshake runs on its own
thread and must finish within ``HANDSHAKE_TIMEOUT`` seconds: a silent client cannot block the service.

Over TCP (issue #32: the service on its own host): with KBINDEX_EMBED_SERVICE_LISTEN=HOST:PORT it also
listens there (never by default, never on a wildcard address unless KBINDEX_EMBED_SERVICE_LISTEN_ANY=1;
pipelines/domain/service_address.py), with the same handshake, and clients name it
KBINDEX_EMBED_SERVICE=tcp://HOST:PORT. The key then has to reach the other hosts: KBINDEX_EMBED_SERVICE_KEY
(at least 32 characters, e.g. from a Kubernetes Secret, as the database URL arrives) or
KBINDEX_EMBED_SERVICE_KEY_FILE (a copy of the key file, held to the same rules), on the service and on its
clients alike; without either, both use ``KBINDEX_HOME/embedder.key``. The handshake proves the key on
both sides but does not encrypt: texts and vectors cross the network in clear, so keep the link private
(a NetworkPolicy, a private subnet) or tunnel it. A client's TCP connection is bounded
(``EmbedServiceBounds``: connect timeout, keepalives, tcp_user_timeout): a silently dropped link errors
within about 17 s with EMBEDDING_UNAVAILABLE. A run whose service is remote does not load the model
itself by default (KBINDEX_EMBED_SERVICE_FALLBACK): its embed step fails with that retryable code and the
task is retried.

Workers: ``KBINDEX_EMBED_WORKERS`` (``--workers``) spawned processes, default one per core, each with
``cores // workers`` threads (on 2 cores, 2 one-thread processes encode 32.5 chunks/s against 29.2 for
one two-thread process). A request goes to an idle worker; more requests than workers queue, so
several runs share the cores instead of fighting over them. A client deals each batch into one part
per worker (``deal``), so even a single run keeps them all busy. A killed worker fails the requests
in flight at once (EMBEDDING_UNAVAILABLE: the runs fall back) and a fresh pool serves the next one;
workers exit with the service, even a SIGKILLed one.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import AuthenticationError, get_context
from multiprocessing.connection import Client, Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.domain.errors import (
    EmbeddingError,
    EmbeddingInvalidResponse,
    EmbeddingRateLimited,
    EmbeddingTimeout,
    EmbeddingUnavailable,
)
from pipelines.domain.service_address import ServiceAddress, parse_service_address
from resources.private_files import make_private_dirs, open_private
from resources.settings import (
    EMBED_SERVICE_KEY_ENV,
    EMBED_SERVICE_KEY_FILE_ENV,
    EmbedServiceBounds,
    Settings,
    embed_service_fallback,
    embed_service_listen,
)

SOCKET_NAME = "embedder.sock"
KEY_NAME = "embedder.key"
REQUEST_TIMEOUT = EmbedServiceBounds.from_env().timeout or 60.0
"""The per-batch read deadline (KBINDEX_EMBED_SERVICE_TIMEOUT, 60 s): ``EmbedServiceBounds.timeout``."""
HANDSHAKE_TIMEOUT = 5.0


def socket_path(home: str | Path) -> Path:
    return Path(home) / SOCKET_NAME


def _key(home: Path, *, create: bool, env: dict[str, str] | None = None) -> bytes:
    """The service key: KBINDEX_EMBED_SERVICE_KEY, else the file KBINDEX_EMBED_SERVICE_KEY_FILE, else
    ``home/embedder.key`` (created 0600, in a 0700 home, if asked); refused unless private and long enough."""
    env = dict(os.environ if env is None else env)
    given = (env.get(EMBED_SERVICE_KEY_ENV) or "").strip()
    if given:
        if len(given) < 32:
            raise EmbeddingUnavailable(f"{EMBED_SERVICE_KEY_ENV} is too short (want 32+ characters); refused")
        return given.encode()
    named = (env.get(EMBED_SERVICE_KEY_FILE_ENV) or "").strip()
    if named:
        return _read_key(Path(named))
    path = home / KEY_NAME
    if create and not path.exists():
        make_private_dirs(home)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    """A key file's key, refused if it is a symlink, another user's, open to others, or short."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise EmbeddingUnavailable(f"the embedding service key cannot be read ({type(exc).__name__})") from exc
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if info.st_uid != os.geteuid():
            raise EmbeddingUnavailable("the embedding service key belongs to another user; refused")
        if info.st_mode & 0o077:
            raise EmbeddingUnavailable("the embedding service key is readable or writable by others (want 0600); refused")
        key = fh.read().strip()
    if len(key) < 32:  # empty would turn authentication off in multiprocessing.connection
        raise EmbeddingUnavailable("the embedding service key is empty or too short; refused")
    return key


def _set_timeouts(conn: Connection, seconds: float) -> None:
    """SO_RCVTIMEO/SO_SNDTIMEO on the connection's socket (0 = none)."""
    limit = struct.pack("ll", int(seconds), int((seconds % 1) * 1_000_000))
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
    finally:
        sock.close()


def _bound_tcp(sock: socket.socket, bounds: EmbedServiceBounds) -> None:
    """A TCP connection's network bounds (``EmbedServiceBounds``): keepalives and tcp_user_timeout, so a
    silently dropped link errors out within ``bounds.silent_bound_s()`` on this end; no Nagle delay."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if bounds.keepalives_idle_s > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", bounds.keepalives_idle_s), ("TCP_KEEPINTVL", bounds.keepalives_interval_s),
                            ("TCP_KEEPCNT", bounds.keepalives_count)):
            if hasattr(socket, name):  # Linux; elsewhere the system's keepalive timing
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), max(1, int(-(-value // 1))))
    if bounds.tcp_user_timeout_ms > 0 and hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(bounds.tcp_user_timeout_ms))


# --------------------------------------------------------------------------------------------------
# server: a pool of worker processes, each with its own copy of the models


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; a container's CPU quota is not seen here)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def default_workers() -> int:
    """KBINDEX_EMBED_WORKERS, else one worker per usable core (on 2 cores, 2 x 1 thread beat 1 x 2 threads)."""
    return max(1, int(os.environ.get("KBINDEX_EMBED_WORKERS", "0") or 0) or usable_cores())


_WORKER: dict[str, Any] = {}  # in a worker process: its thread budget and loaded embedders


def _worker_start(threads: int, preload: list[str], parent: int, started: Any) -> None:
    """Initializer of a worker process: limit threads, ignore Ctrl-C (the service stops us), load models.

    A watcher thread exits the worker when the service is gone: a SIGKILLed service would otherwise
    leave its workers blocked on the call queue forever, each holding a model.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    _WORKER.update(threads=threads, embedders={}, started=started)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    for model in preload:
        _worker_embedder(model).dimension


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def embedder_on_threads(model: str, threads: int) -> Any:
    """An embedder for ``model`` whose runtime uses ``threads`` threads: a service worker's share of the cores
    (and the layout bench.pipeline's bare system copies)."""
    from resources.derived_models import DERIVED_MODELS, DerivedModelEmbedder
    from resources.embedder import FakeEmbedder, embedder_for_model, fake_embedder_from_env

    if model in DERIVED_MODELS:
        return DerivedModelEmbedder(model, threads=threads)
    if model.startswith("fake-"):  # with the faults KBINDEX_FAKE_FAULTS asks for, as in a run (fault injection)
        return fake_embedder_from_env(model)
    embedder = embedder_for_model(model)
    if not isinstance(embedder, FakeEmbedder):
        import torch

        torch.set_num_threads(threads)
    return embedder


def _worker_embedder(model: str) -> Any:
    """This worker's embedder for ``model``, its runtime limited to the worker's share of the cores."""
    embedders = _WORKER.setdefault("embedders", {})
    if model not in embedders:
        embedders[model] = embedder_on_threads(model, int(_WORKER.get("threads") or 1))
    return embedders[model]


def _worker_warm() -> int:
    """A warm-up task: wait until every worker of the pool has loaded its models (so each takes one)."""
    _WORKER["started"].wait(timeout=600)
    return os.getpid()


def _worker_answer(op: str, model: str, texts: list[str]) -> tuple[Any, ...]:
    """One request in a worker; errors come back as ("error", code, message) (exceptions may not unpickle)."""
    try:
        embedder = _worker_embedder(model)
        if op == "dimension":
            return ("ok", embedder.dimension)
        delay = float(os.environ.get("KBINDEX_FAKE_DELAY", "0") or 0)
        if delay > 0 and model.startswith("fake-"):  # fault injection, as for a run's fake (dagster_resources)
            time.sleep(delay)
        return ("ok", (embedder.model_name, np.asarray(embedder.embed(texts), dtype=np.float32)))
    except Exception as exc:  # noqa: BLE001 - the client classifies it; the worker keeps serving
        from resources.embedder import translate_provider_error

        known = translate_provider_error(exc)  # an EmbeddingError, or a provider's timeout / rate limit / refusal
        if known is not None:
            return ("error", known.code, known.message)
        return ("error", "EMBEDDING_UNAVAILABLE", f"the embedding service failed ({type(exc).__name__})")


class _WorkerPool:
    """``size`` spawned processes with ``cores // size`` threads each; requests beyond them queue.

    A worker that dies (killed, out of memory) breaks the whole ``ProcessPoolExecutor``: every request
    in it fails with EMBEDDING_UNAVAILABLE at once (no client hangs) and a fresh pool takes over,
    warming up in the background, for the next request.
    """

    def __init__(self, size: int, preload: list[str]) -> None:
        self.size, self.preload = size, list(preload)
        self.threads = max(1, usable_cores() // size)
        self.pids: list[int] = []
        self._lock = threading.Lock()
        self._closed = False
        self._executor = self._start()

    def _start(self) -> ProcessPoolExecutor:
        spawn = get_context("spawn")
        return ProcessPoolExecutor(self.size, mp_context=spawn, initializer=_worker_start,
                                   initargs=(self.threads, self.preload, os.getpid(), spawn.Barrier(self.size)))

    def warm(self) -> None:
        """Start every worker and load its models now (a spawn pool starts workers on demand);
        EmbeddingUnavailable if they cannot start (e.g. a preloaded model fails to load)."""
        try:
            futures = [self._executor.submit(_worker_warm) for _ in range(self.size)]
            self.pids = sorted({f.result() for f in futures})
        except RuntimeError as exc:  # BrokenExecutor, or a pool shut down meanwhile
            raise EmbeddingUnavailable(f"the embedding workers could not start ({type(exc).__name__})") from exc

    def _warm_quietly(self) -> None:
        try:
            self.warm()
        except EmbeddingUnavailable:
            pass  # the next request finds the pool broken and starts another

    def run(self, op: str, model: str, texts: list[str]) -> tuple[Any, ...]:
        executor = self._executor
        try:
            return executor.submit(_worker_answer, op, model, texts).result()
        except BrokenExecutor:
            if self._closed:
                return ("error", "EMBEDDING_UNAVAILABLE", "the embedding service is stopping")
            self._replace(executor)
            return ("error", "EMBEDDING_UNAVAILABLE", "an embedding worker died during the request; the pool restarts")

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is not broken:
                return  # another request replaced it already
            broken.shutdown(wait=False, cancel_futures=True)
            self.pids = []
            self._executor = self._start()
        threading.Thread(target=self._warm_quietly, daemon=True).start()

    def shutdown(self) -> None:
        """Stop now: queued requests are cancelled and the workers terminated, so a request being embedded
        (a run's whole batch: seconds to tens of seconds) fails with EMBEDDING_UNAVAILABLE instead of holding
        the service's exit (the interpreter joins the executor's threads, which wait for the workers)."""
        with self._lock:
            self._closed = True
            self._executor.shutdown(wait=False, cancel_futures=True)
            for pid in self.pids:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


class _Service:
    def __init__(self, preload: list[str], workers: int) -> None:
        self.pool = _WorkerPool(workers, preload)
        self.pool.warm()
        self.requests = 0
        self._count = threading.Lock()

    def answer(self, request: dict[str, Any]) -> tuple[Any, ...]:
        op = request.get("op")
        try:
            if op == "ping":
                return ("ok", {"pid": os.getpid(), "requests": self.requests, "workers": self.pool.size,
                               "worker_pids": list(self.pool.pids)})
            if op == "dimension":
                return self.pool.run("dimension", str(request["model"]), [])
            if op == "embed":
                with self._count:
                    self.requests += 1
                return self.pool.run("embed", str(request["model"]), [str(t) for t in request["texts"]])
            return ("error", "INVALID_REQUEST", f"unknown operation {op!r}")
        except Exception as exc:  # noqa: BLE001 - a malformed request; the service keeps serving
            return ("error", "EMBEDDING_UNAVAILABLE", f"the embedding service failed ({type(exc).__name__})")

    def handle(self, conn: Connection, key: bytes | None = None) -> None:
        with conn:
            if key is not None:  # authenticate here, on this connection's thread, within HANDSHAKE_TIMEOUT
                try:
                    _set_timeouts(conn, HANDSHAKE_TIMEOUT)
                    deliver_challenge(conn, key)
                    answer_challenge(conn, key)
                    _set_timeouts(conn, 0)
                except (OSError, EOFError, AuthenticationError):
                    return
            while True:
                try:
                    request = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    conn.send(self.answer(request if isinstance(request, dict) else {}))
                except (OSError, ValueError):
                    return


def serve(home: str | Path, *, preload: list[str] | None = None, workers: int | None = None,
          ready: threading.Event | None = None, stop: threading.Event | None = None,
          listen: tuple[str, int] | None = None, listening: list[tuple[str, int]] | None = None) -> None:
    """Answer embedding requests on ``home/embedder.sock`` until ``stop`` is set (or forever), with
    ``workers`` processes (default ``default_workers()``), each holding the ``preload`` models.

    ``listen`` (default KBINDEX_EMBED_SERVICE_LISTEN, else none): also answer on that TCP host and port,
    with the same key; the address bound (its port, for port 0) is appended to ``listening``."""
    from resources.embedder import DEFAULT_MODEL_NAME

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    home = make_private_dirs(Path(home))
    key = _key(home, create=True)
    listen = listen if listen is not None else embed_service_listen()
    if preload is None:  # KBINDEX_EMBED_SERVICE_PRELOAD: comma-separated models to load at start
        preload = [m for m in os.environ.get("KBINDEX_EMBED_SERVICE_PRELOAD", DEFAULT_MODEL_NAME).split(",") if m]
    tcp = _tcp_listener(listen) if listen is not None else None  # a bad address fails before the models load
    try:
        service = _Service(preload, workers or default_workers())
        try:
            if tcp is not None:
                if listening is not None:
                    listening.append(tcp.getsockname()[:2])
                threading.Thread(target=_listen_tcp, args=(tcp, service, key, stop), daemon=True,
                                 name="kbindex-embed-tcp").start()
            _listen(home, service, key, ready, stop)
        finally:
            service.pool.shutdown()
    finally:
        if tcp is not None:
            tcp.close()


def _tcp_listener(address: tuple[str, int]) -> socket.socket:
    """A listening TCP socket on exactly ``address`` (parse_listen refused wildcards without consent)."""
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=64)


def _listen_tcp(server: socket.socket, service: _Service, key: bytes, stop: threading.Event | None) -> None:
    """Accept TCP connections until ``stop``: each gets the network bounds and its own handshake thread."""
    import select

    bounds = EmbedServiceBounds.from_env()
    while stop is None or not stop.is_set():
        try:
            if not select.select([server], [], [], 0.5)[0]:
                continue
            sock, _ = server.accept()
        except OSError:
            if server.fileno() < 0:
                return  # closed by serve
            continue
        try:
            sock.setblocking(True)
            _bound_tcp(sock, bounds)
        except OSError:
            sock.close()
            continue
        threading.Thread(target=service.handle, args=(Connection(sock.detach()), key), daemon=True).start()


def _listen(home: Path, service: _Service, key: bytes, ready: threading.Event | None,
            stop: threading.Event | None) -> None:
    path = socket_path(home)
    path.unlink(missing_ok=True)  # a socket left by a killed service
    # No authkey on the listener: its accept() would run the handshake on this thread, where one silent
    # client blocks every other. Each connection authenticates on its own thread (_Service.handle).
    with Listener(str(path), family="AF_UNIX") as listener:
        os.chmod(path, 0o600)
        if ready is not None:
            ready.set()
        if stop is not None:
            threading.Thread(target=_wake_when, args=(stop, listener, key), daemon=True).start()
        while stop is None or not stop.is_set():
            try:
                conn = listener.accept()
            except OSError:
                continue  # a client that hung up at once
            if stop is not None and stop.is_set():
                conn.close()
                break
            threading.Thread(target=service.handle, args=(conn, key), daemon=True).start()
    path.unlink(missing_ok=True)


def _wake_when(stop: threading.Event, listener: Listener, key: bytes) -> None:
    """accept() does not notice a stop: a throwaway connection wakes it (serve closes the listener)."""
    stop.wait()
    try:
        Client(listener.address, family="AF_UNIX", authkey=key).close()
    except Exception:  # noqa: BLE001 - the listener is gone already
        pass


# --------------------------------------------------------------------------------------------------
# client


class ServiceEmbedder:
    """The ``Embedder`` of one model served by the local embedding service.

    ``respond`` deals its texts into one part per service worker (``ping`` says how many), sends the
    parts at once on as many connections, and puts the answers back in order: one run keeps every
    worker busy. Raises EmbeddingUnavailable when the service cannot be reached (or hangs
    up, or a worker dies), EmbeddingTimeout when it does not answer within ``timeout`` seconds; the
    caller falls back to its own model.
    """

    def __init__(self, model_name: str, home: str | Path | ServiceAddress, *, timeout: float = REQUEST_TIMEOUT,
                 bounds: EmbedServiceBounds | None = None) -> None:
        self._model = model_name
        self.address = service_address(home)
        self.home = self.address  # where it is (``service_available`` takes it back)
        self.timeout = timeout
        self.bounds = bounds or EmbedServiceBounds.from_env()
        self._conns: list[Connection] = []
        self._dimension: int | None = None
        self._workers: int | None = None

    @property
    def model_name(self) -> str:
        return self._model

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            self._dimension = int(self._call({"op": "dimension", "model": self._model}))
        return self._dimension

    @property
    def workers(self) -> int:
        """The service's worker count (asked once): how many parts a request is split into."""
        if self._workers is None:
            self._workers = max(1, int(self.ping().get("workers", 1)))
        return self._workers

    def ping(self) -> dict[str, Any]:
        return self._call({"op": "ping"})

    def respond(self, texts: list[str]) -> Any:
        from resources.embedder import EmbeddingResponse, text_fingerprint

        parts = deal(list(texts), self.workers)
        answers = self._call_many([{"op": "embed", "model": self._model, "texts": part} for part in parts])
        models = {model for model, _ in answers}
        model = models.pop() if len(models) == 1 else f"mixed models {sorted(models)}"  # checked_embed refuses it
        vectors = undeal([np.asarray(v, dtype=np.float32) for _, v in answers], parts)
        return EmbeddingResponse(model, vectors, tuple(text_fingerprint(t) for t in texts))

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.respond(texts).vectors

    def close(self) -> None:
        for conn in self._conns:
            conn.close()
        self._conns = []

    def _connect(self) -> Connection:
        """Connect and authenticate, with every socket read and write bounded by ``timeout``.

        ``multiprocessing.connection.Client`` would wait forever on a stopped service; this is
        the same handshake on a socket with SO_RCVTIMEO/SO_SNDTIMEO set, so it cannot hang. Over TCP
        the connect has its own timeout and the connection keepalives and tcp_user_timeout (``bounds``).
        """
        key = _client_key(self.address)
        limit = struct.pack("ll", int(self.timeout), int((self.timeout % 1) * 1_000_000))
        sock: socket.socket | None = None
        try:
            if self.address.is_tcp:
                sock = socket.create_connection((self.address.host, self.address.port),
                                                timeout=self.bounds.connect_timeout_s or None)
                sock.settimeout(None)  # blocking again: the reads and writes are bounded below
                _bound_tcp(sock, self.bounds)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
            if not self.address.is_tcp:
                sock.connect(str(socket_path(self.address.folder or ".")))
            conn = Connection(sock.detach())
            try:
                answer_challenge(conn, key)
                deliver_challenge(conn, key)
            except BaseException:
                conn.close()
                raise
        except Exception as exc:  # noqa: BLE001 - no socket, refused, hung, failed handshake
            if sock is not None:
                sock.close()
            raise EmbeddingUnavailable(f"the embedding service cannot be reached ({type(exc).__name__})") from exc
        return conn

    def _call(self, request: dict[str, Any]) -> Any:
        return self._call_many([request])[0]

    def _call_many(self, requests: list[dict[str, Any]]) -> list[Any]:
        """Send each request on its own connection at once, then read the answers in order.

        On any failure every connection is closed: a late answer must never be read as the next
        request's.
        """
        try:
            while len(self._conns) < len(requests):
                self._conns.append(self._connect())
            conns = self._conns[: len(requests)]
            for conn, request in zip(conns, requests):
                conn.send(request)
            deadline = time.monotonic() + self.timeout
            answers = []
            for conn in conns:
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise EmbeddingTimeout(f"the embedding service did not answer within {self.timeout:.0f} s")
                answers.append(conn.recv())
        except EmbeddingError:
            self.close()
            raise
        except Exception as exc:  # noqa: BLE001 - the service died or hung up mid-request
            self.close()
            raise EmbeddingUnavailable(f"the embedding service hung up ({type(exc).__name__})") from exc
        failed = next((a for a in answers if a[0] != "ok"), None)
        if failed is None:
            return [a[1] for a in answers]
        _, code, message = failed
        if code == "EMBEDDING_TIMEOUT":
            raise EmbeddingTimeout(message)
        if code == "EMBEDDING_RATE_LIMITED":  # the service's own provider asked it to slow down: so do we
            raise EmbeddingRateLimited(message)
        raise EmbeddingUnavailable(f"{code}: {message}")


def deal(texts: list[str], parts: int) -> list[list[str]]:
    """``texts`` dealt round-robin into at most ``parts`` non-empty parts (one empty part for no texts).

    Dealt, not cut into contiguous runs: checked_embed sends batches sorted longest first, so contiguous
    parts would give one worker all the long texts. Measured on a 64-chunk batch of corpus chunks, a cut
    balanced by characters took 1.9 s and 2.9 s on its two workers (chunks are bounded in tokens, not
    characters); dealt parts have the same mix of lengths. ``undeal`` puts the answers back in order.
    """
    count = max(1, min(parts, len(texts)))
    return [texts[i::count] for i in range(count)]


def undeal(answers: list[np.ndarray], parts: list[list[str]]) -> np.ndarray:
    """The vectors answered for ``deal``'s parts, back in the order of the texts; EmbeddingInvalidResponse
    unless every part came back as one 2-D row per text, all of one dimension."""
    shapes = [np.shape(a) for a in answers]
    if any(len(s) != 2 or s[0] != len(p) for s, p in zip(shapes, parts)) or len({s[1:] for s in shapes}) != 1:
        raise EmbeddingInvalidResponse(f"the embedding service answered shapes {shapes} for parts of "
                                       f"{[len(p) for p in parts]} texts")
    out = np.empty((sum(len(p) for p in parts), shapes[0][1]), dtype=np.float32)
    for i, vectors in enumerate(answers):
        out[i :: len(answers)] = vectors
    return out


SERVICE_RETRY_SECONDS = float(os.environ.get("KBINDEX_EMBED_SERVICE_RETRY", "30"))
"""After a fallback, how long a run embeds on its own before it tries the service again."""


class ServiceOrLocal:
    """The service while it answers; after a failure, the process's own model until the service is back.

    A run must not fail because a shortcut broke: an unreachable, dead or hung service makes this
    embedder load the model in-process (once) and answer from there. Every ``retry_seconds`` it asks
    the service again, and goes back to it (dropping its own copy of the model) as soon as it answers:
    a killed worker is replaced within seconds, and a run that stayed on its own model for the rest of
    its life would compete with the service's workers for the cores. Only the service's own transport
    errors fall back; an answer that comes back is validated by checked_embed as usual.
    """

    def __init__(self, service: ServiceEmbedder, local: Any, on_fallback: Any = None, *,
                 retry_seconds: float | None = None) -> None:
        self.service, self._local_factory, self.on_fallback = service, local, on_fallback
        self.retry_seconds = SERVICE_RETRY_SECONDS if retry_seconds is None else retry_seconds
        self._local: Any = None
        self._fell_back_at = 0.0
        self.returns = 0
        """How many times the service answered again after a fallback."""

    @property
    def model_name(self) -> str:
        return self.service.model_name

    @property
    def dimension(self) -> int:
        if self._local is None:
            try:
                return self.service.dimension
            except EmbeddingError as exc:
                self._fall_back(exc)
        return self._local.dimension

    def respond(self, texts: list[str]) -> Any:
        from resources.embedder import EmbeddingResponse, text_fingerprint

        if self._local is None or self._service_back():
            try:
                response = self.service.respond(texts)
            except EmbeddingError as exc:
                self._fall_back(exc)
            else:
                if self._local is not None:  # the service is back: use it, free this process's model
                    self._local, self.returns = None, self.returns + 1
                return response
        vectors = self._local.embed(list(texts))
        return EmbeddingResponse(self._local.model_name, vectors, tuple(text_fingerprint(t) for t in texts))

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.respond(texts).vectors

    def _service_back(self) -> bool:
        """Time to try the service again, and it answers a ping within 2 s (a hung one must not stall the run)."""
        if time.monotonic() - self._fell_back_at < self.retry_seconds:
            return False
        if service_available(self.service.home, timeout=2.0):
            return True
        self._fell_back_at = time.monotonic()
        return False

    def _fall_back(self, exc: EmbeddingError) -> None:
        self.service.close()
        self._fell_back_at = time.monotonic()
        if self._local is not None:  # a retry that failed: keep the model already loaded
            return
        if self.on_fallback is not None:
            self.on_fallback(exc)
        self._local = self._local_factory()


def service_address(where: str | Path | ServiceAddress) -> ServiceAddress:
    """A ServiceAddress from a folder or a KBINDEX_EMBED_SERVICE value (``tcp://HOST:PORT``)."""
    if isinstance(where, ServiceAddress):
        return where
    if isinstance(where, Path):
        return ServiceAddress(folder=str(where))
    return parse_service_address(where)


def _client_key(address: ServiceAddress) -> bytes:
    """The key a client proves: KBINDEX_EMBED_SERVICE_KEY or _KEY_FILE, else the key file of the service's
    folder (Unix socket) or of this host's KBINDEX_HOME (TCP: a copy of the service's key placed there)."""
    home = Path(address.folder) if address.folder is not None else Settings.from_env().home
    return _key(home, create=False)


def service_available(home: str | Path | ServiceAddress, timeout: float = 2.0) -> bool:
    """Whether a service answers at ``home`` (a folder's socket, or ``tcp://HOST:PORT``) right now."""
    address = service_address(home)
    if not address.is_tcp and not socket_path(address.folder or ".").exists():
        return False
    client = ServiceEmbedder("", address, timeout=timeout,
                             bounds=replace(EmbedServiceBounds.from_env(), connect_timeout_s=timeout))
    try:
        client.ping()
        return True
    except EmbeddingError:
        return False
    finally:
        client.close()


def served_embedder(model: str, where: str | Path | ServiceAddress, local: Any, on_fallback: Any = None) -> Any:
    """The embedder a run uses for ``model`` through the service at ``where``: with fallback ``local`` (a service
    on this machine, by default) a ``ServiceOrLocal`` that loads ``local()`` if the service fails; with ``none``
    (a ``tcp://`` service, by default; KBINDEX_EMBED_SERVICE_FALLBACK) the bare client, whose
    EmbeddingUnavailable / EmbeddingTimeout fail the embed step with that retryable code: the task is retried."""
    address = service_address(where)
    client = ServiceEmbedder(model, address)
    if embed_service_fallback(address.is_tcp) == "none":
        return client
    return ServiceOrLocal(client, local, on_fallback)


def warm_embedder(model: str, home: str | Path) -> Any:
    """The embedder for ``model``: the service's warm copy if one answers under ``home``, else this process's own.

    For one-off commands (``kbindex search``) that would otherwise spend seconds loading the model.
    """
    from resources.embedder import embedder_for_model

    if model.startswith("fake-") or not service_available(home):
        return embedder_for_model(model)
    return ServiceOrLocal(ServiceEmbedder(model, home), lambda: embedder_for_model(model))


def start_service(home: str | Path, env: dict[str, str] | None = None, *, timeout: float = 120.0,
                  log: Path | None = None, wait: bool = True) -> subprocess.Popen[bytes]:
    """Start the embedding service for ``home`` as a child process; with ``wait``, return once it answers."""
    out = open_private(log, "ab") if log is not None else subprocess.DEVNULL  # 0600: it may quote texts
    proc = subprocess.Popen(
        [sys.executable, "-m", "resources.embedding_service", str(home)],
        env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(Path(__file__).resolve().parents[1]), umask=0o077,
    )
    if not wait:
        return proc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddingUnavailable(f"the embedding service exited with {proc.returncode} while starting")
        if service_available(home):
            return proc
        time.sleep(0.2)
    proc.kill()
    raise EmbeddingUnavailable(f"the embedding service did not answer within {timeout:.0f} s")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KBINDEX_HOME", ".kbindex"))
