"""A warm embedding model shared by the run processes of one machine, over a local socket.

Why: every Dagster run is a fresh process, and importing torch + sentence-transformers and loading
the model costs ~5 s of it: most of a single document's publish-to-searchable time. The service
keeps the model loaded; a small run (a few versions, the interactive case) sends its batches here
and never imports torch. Big runs still embed in their own process (runs are the unit of
parallelism for bulk work, see ``run_torch_threads``), and any trouble with the service makes the
run fall back to its own model: the service is a shortcut, never a dependency.

    serve(home)                      load the packaged model, answer on home/embedder.sock until stopped
    ServiceEmbedder(model, address)  the client: an ``Embedder`` with ``respond`` (checked_embed validates it)
    start_service(home, env)         start ``kbindex embed-service`` as a child process and wait until it answers

Transport: ``multiprocessing.connection`` on a Unix socket, authenticated with a random key in
``home/embedder.key`` (mode 0600): only a process that can read the key may send a request (the
messages are pickles, so the key is what keeps strangers out, both ways: a client unpickles the
replies). So a key is refused, by the service and by its clients, when it is empty (the standard
library would then skip authentication), a symlink, not owned by this user, or readable or
writable by group or others; ``home`` is created 0700. Each connection's handshake runs on its own
thread and must finish within ``HANDSHAKE_TIMEOUT`` seconds: a silent client cannot block the service. One request is encoded at a time,
with every core: requests of several runs queue instead of fighting over the cores.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.domain.errors import EmbeddingError, EmbeddingTimeout, EmbeddingUnavailable
from resources.private_files import make_private_dirs

SOCKET_NAME = "embedder.sock"
KEY_NAME = "embedder.key"
REQUEST_TIMEOUT = float(os.environ.get("KBINDEX_EMBED_SERVICE_TIMEOUT", "60"))
HANDSHAKE_TIMEOUT = 5.0


def socket_path(home: str | Path) -> Path:
    return Path(home) / SOCKET_NAME


def _key(home: Path, *, create: bool) -> bytes:
    """The service key, created (0600, in a 0700 home) if asked; refused unless private and not empty."""
    path = home / KEY_NAME
    if create and not path.exists():
        make_private_dirs(home)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
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


# --------------------------------------------------------------------------------------------------
# server


class _Service:
    def __init__(self, preload: list[str]) -> None:
        self.lock = threading.Lock()  # one encode at a time, with every core
        self.requests = 0
        for model in preload:
            self._embedder(model).dimension

    @staticmethod
    def _embedder(model: str) -> Any:
        from resources.embedder import embedder_for_model

        return embedder_for_model(model)

    def answer(self, request: dict[str, Any]) -> tuple[Any, ...]:
        op = request.get("op")
        try:
            if op == "ping":
                return ("ok", {"pid": os.getpid(), "requests": self.requests})
            embedder = self._embedder(str(request["model"]))
            if op == "dimension":
                return ("ok", embedder.dimension)
            if op == "embed":
                texts = [str(t) for t in request["texts"]]
                with self.lock:
                    self.requests += 1
                    vectors = embedder.embed(texts)
                return ("ok", (embedder.model_name, np.asarray(vectors, dtype=np.float32)))
            return ("error", "INVALID_REQUEST", f"unknown operation {op!r}")
        except EmbeddingError as exc:
            return ("error", exc.code, exc.message)
        except Exception as exc:  # noqa: BLE001 - the client classifies it; the service keeps serving
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


def serve(home: str | Path, *, preload: list[str] | None = None, ready: threading.Event | None = None,
          stop: threading.Event | None = None) -> None:
    """Answer embedding requests on ``home/embedder.sock`` until ``stop`` is set (or forever)."""
    from resources.embedder import PACKAGED_MODEL_NAME

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    home = make_private_dirs(Path(home))
    key = _key(home, create=True)
    if preload is None:  # KBINDEX_EMBED_SERVICE_PRELOAD: comma-separated models to load at start
        preload = [m for m in os.environ.get("KBINDEX_EMBED_SERVICE_PRELOAD", PACKAGED_MODEL_NAME).split(",") if m]
    service = _Service(preload)
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

    Raises EmbeddingUnavailable when the service cannot be reached (or hangs up), EmbeddingTimeout
    when it does not answer within ``timeout`` seconds; the caller falls back to its own model.
    """

    def __init__(self, model_name: str, home: str | Path, *, timeout: float = REQUEST_TIMEOUT) -> None:
        self._model = model_name
        self.home = Path(home)
        self.timeout = timeout
        self._conn: Connection | None = None
        self._dimension: int | None = None

    @property
    def model_name(self) -> str:
        return self._model

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            self._dimension = int(self._call({"op": "dimension", "model": self._model}))
        return self._dimension

    def ping(self) -> dict[str, Any]:
        return self._call({"op": "ping"})

    def respond(self, texts: list[str]) -> Any:
        from resources.embedder import EmbeddingResponse, text_fingerprint

        model, vectors = self._call({"op": "embed", "model": self._model, "texts": list(texts)})
        return EmbeddingResponse(model, vectors, tuple(text_fingerprint(t) for t in texts))

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.respond(texts).vectors

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connect(self) -> Connection:
        """Connect and authenticate, with every socket read and write bounded by ``timeout``.

        ``multiprocessing.connection.Client`` would wait forever on a stopped service; this is
        the same handshake on a socket with SO_RCVTIMEO/SO_SNDTIMEO set, so it cannot hang.
        """
        if self._conn is None:
            path = socket_path(self.home)
            key = _key(self.home, create=False)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            limit = struct.pack("ll", int(self.timeout), int((self.timeout % 1) * 1_000_000))
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
                sock.connect(str(path))
                conn = Connection(sock.detach())
                try:
                    answer_challenge(conn, key)
                    deliver_challenge(conn, key)
                except BaseException:
                    conn.close()
                    raise
            except Exception as exc:  # noqa: BLE001 - no socket, refused, hung, failed handshake
                sock.close()
                raise EmbeddingUnavailable(f"the embedding service cannot be reached ({type(exc).__name__})") from exc
            self._conn = conn
        return self._conn

    def _call(self, request: dict[str, Any]) -> Any:
        conn = self._connect()
        try:
            conn.send(request)
            if not conn.poll(self.timeout):
                self.close()  # the late answer must never be read as the next request's
                raise EmbeddingTimeout(f"the embedding service did not answer within {self.timeout:.0f} s")
            answer = conn.recv()
        except EmbeddingError:
            raise
        except Exception as exc:  # noqa: BLE001 - the service died or hung up mid-request
            self.close()
            raise EmbeddingUnavailable(f"the embedding service hung up ({type(exc).__name__})") from exc
        if answer[0] == "ok":
            return answer[1]
        _, code, message = answer
        if code == "EMBEDDING_TIMEOUT":
            raise EmbeddingTimeout(message)
        raise EmbeddingUnavailable(f"{code}: {message}")


class ServiceOrLocal:
    """The service while it answers; from its first failure on, the process's own model.

    A run must not fail because a shortcut broke: an unreachable, dead or hung service makes this
    embedder load the model in-process (once) and answer from there. Only the service's own
    transport errors fall back; an answer that comes back is validated by checked_embed as usual.
    """

    def __init__(self, service: ServiceEmbedder, local: Any, on_fallback: Any = None) -> None:
        self.service, self._local_factory, self.on_fallback = service, local, on_fallback
        self._local: Any = None

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

        if self._local is None:
            try:
                return self.service.respond(texts)
            except EmbeddingError as exc:
                self._fall_back(exc)
        vectors = self._local.embed(list(texts))
        return EmbeddingResponse(self._local.model_name, vectors, tuple(text_fingerprint(t) for t in texts))

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.respond(texts).vectors

    def _fall_back(self, exc: EmbeddingError) -> None:
        self.service.close()
        if self.on_fallback is not None:
            self.on_fallback(exc)
        self._local = self._local_factory()


def service_available(home: str | Path, timeout: float = 2.0) -> bool:
    """Whether a service answers on ``home``'s socket right now."""
    if not socket_path(home).exists():
        return False
    client = ServiceEmbedder("", home, timeout=timeout)
    try:
        client.ping()
        return True
    except EmbeddingError:
        return False
    finally:
        client.close()


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
    out = open(log, "ab") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "resources.embedding_service", str(home)],
        env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(Path(__file__).resolve().parents[1]),
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
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KBINDEX_HOME", ".kbindex"))
