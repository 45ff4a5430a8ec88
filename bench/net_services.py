"""The services the multi-host rounds run on hosts of their own (bench/netns.py), and the clients that watch them.

Shared by tests/network (each fault alone) and bench.chaos --network (all of them in one round):

- ``start_embed_service``: the real embedding service (``python -m resources.embedding_service``) in namespace C,
  listening on TCP at ``EMBED_ADDR:EMBED_PORT`` with its key handshake (and on its Unix socket, which the caller
  uses to watch it: a Unix socket does not cross a cut); ``requests_served`` reads its request counter there.
- ``start_api``: the real ``kbindex api`` in namespace D, listening on ``API_ADDR``, its database over D's own link.
- ``ApiClient``: GET with (status or None when no answer came within the ceiling, stable error code, seconds);
  ``SseStream``: one task's event stream read on a thread, (event id, data) per event, None once it ended.
- ``stop``: terminate a started server (kill it if it does not go).
"""

from __future__ import annotations

import json
import queue as queues
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.netns import API_ADDR, EMBED_ADDR, Hosts

EMBED_PORT = 7311
API_PORT = 8390


def embed_address(port: int = EMBED_PORT) -> str:
    """The KBINDEX_EMBED_SERVICE value of a service ``start_embed_service`` started."""
    return f"tcp://{EMBED_ADDR}:{port}"


def start_embed_service(hosts: Hosts, home: Path, env: dict[str, str], *, port: int = EMBED_PORT,
                        log: Path | None = None, timeout: float = 60.0) -> subprocess.Popen[str]:
    """The service for ``home`` (its key: ``home/embedder.key``) on the embedding host; returns once it answers."""
    from resources.embedding_service import service_available

    ns = hosts.add_embed_host()
    full = {"KBINDEX_HOME": str(home), "KBINDEX_EMBED_SERVICE_LISTEN": f"{EMBED_ADDR}:{port}",
            "KBINDEX_EMBED_SERVICE_PRELOAD": "", **env}
    proc = hosts.client("-m", "resources.embedding_service", str(home), env=full, namespace=ns, log=log)
    deadline = time.monotonic() + timeout
    while not service_available(home):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"the embedding service did not start (exit {proc.returncode})"
                               + (f": {proc.stderr.read()[-2000:]}" if proc.stderr else f"; see {log}"))
        time.sleep(0.2)
    return proc


def requests_served(home: Path) -> int:
    """Requests the service under ``home`` has answered so far (over its Unix socket)."""
    from resources.embedding_service import ServiceEmbedder

    client = ServiceEmbedder("", home, timeout=5)
    try:
        return int(client.ping()["requests"])
    finally:
        client.close()


def start_api(hosts: Hosts, database_url: str, tokens_file: Path, env: dict[str, str], *, port: int = API_PORT,
              log: Path | None = None, timeout: float = 90.0) -> tuple[subprocess.Popen[str], str]:
    """``kbindex api`` on the API host (no migrations: the caller migrated); (process, base URL) once it answers
    ``/readyz`` (up, and PostgreSQL reachable from it). The caller must be on a host linked to D (B)."""
    ns = hosts.add_api_host()
    proc = hosts.client("-m", "pipelines.cli", "api", "--host", API_ADDR, "--port", str(port), "--tokens",
                        str(tokens_file), "--no-migrate", env={**env, "KBINDEX_DATABASE_URL": database_url},
                        namespace=ns, log=log)
    base = f"http://{API_ADDR}:{port}"
    client = ApiClient(base, ceiling=5.0)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                if client.get("/readyz")[0] == 200:
                    break
            except httpx.TransportError:  # not listening yet
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start (exit {proc.poll()}); see {log}")
            time.sleep(0.3)
    except BaseException:
        stop(proc)
        raise
    finally:
        client.close()
    return proc, base


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.communicate(timeout=15)
            return
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.communicate(timeout=15)


class ApiClient:
    """GETs to the API at ``base_url`` (or over the Unix socket ``uds``), each answered within ``ceiling`` s or not."""

    def __init__(self, base_url: str = "http://api", *, uds: str | None = None, ceiling: float = 10.0) -> None:
        self.base_url, self.uds = base_url, uds
        transport = httpx.HTTPTransport(uds=uds) if uds else None
        self.http = httpx.Client(transport=transport, base_url=base_url,
                                 timeout=httpx.Timeout(ceiling, connect=min(2.0, ceiling)))

    def get(self, path: str, headers: dict[str, str] | None = None,
            params: dict[str, Any] | None = None) -> tuple[int | None, str | None, float]:
        """(status or None when no answer came within the ceiling, the error's code, seconds taken)."""
        started = time.monotonic()
        try:
            r = self.http.get(path, headers=headers, params=params)
        except httpx.TimeoutException:
            return None, None, time.monotonic() - started
        code = None
        if r.status_code >= 400:
            try:
                code = r.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = "-"  # no stable code in the body: the caller counts it as such
        return r.status_code, code, time.monotonic() - started

    def stream(self, task_id: int, headers: dict[str, str], last: int = 0) -> SseStream:
        return SseStream(self, task_id, headers, last)

    def close(self) -> None:
        self.http.close()


class SseStream:
    """``GET /tasks/{id}/events`` read on a thread: (event id, data) on ``events``, None when the stream ended."""

    def __init__(self, api: ApiClient, task_id: int, headers: dict[str, str], last: int = 0) -> None:
        self.task_id = task_id
        self.events: queues.Queue[tuple[int, dict] | None] = queues.Queue()
        self.status: int | None = None
        headers = {**headers, **({"Last-Event-ID": str(last)} if last else {})}
        transport = httpx.HTTPTransport(uds=api.uds) if api.uds else None
        self.client = httpx.Client(transport=transport, base_url=api.base_url, timeout=httpx.Timeout(10.0, read=None))
        self.request = self.client.build_request("GET", f"/tasks/{task_id}/events", headers=headers)
        threading.Thread(target=self._read, name=f"sse-{task_id}", daemon=True).start()

    def _read(self) -> None:
        try:
            response = self.client.send(self.request, stream=True)
            self.status = response.status_code
            if response.status_code == 200:
                fields: dict[str, str] = {}
                for line in response.iter_lines():
                    if line == "" and "data" in fields:
                        self.events.put((int(fields["id"]), json.loads(fields["data"])))
                        fields = {}
                    elif line and not line.startswith(":"):
                        name, _, value = line.partition(":")
                        fields[name] = value.lstrip(" ")
        except Exception:  # noqa: BLE001 - a broken stream ends like a finished one, for the caller to see
            pass
        self.events.put(None)

    def next(self, timeout: float) -> tuple[int, dict] | None:
        """The next event; TimeoutError when none came within ``timeout``; None when the stream ended."""
        try:
            return self.events.get(timeout=timeout)
        except queues.Empty:
            raise TimeoutError(f"no event within {timeout:g} s") from None

    def close(self) -> None:
        self.client.close()
