"""The API process of the abuse bench (its own module, so a spawned child can import it)."""

from __future__ import annotations

TOKENS = {"tok-a": "tenant-a", "tok-b": "tenant-b", "tok-c": "tenant-c", "tok-d": "tenant-d"}


def serve(db_url: str, port: int, blob_dir: str) -> None:
    """The child process: the real app under uvicorn on 127.0.0.1."""
    import uvicorn

    from pipelines.api import create_app
    from resources.embedder import FakeEmbedder

    app = create_app(db_url, tokens=TOKENS, tokens_file="", blob_url=blob_dir, metrics_token="bench-metrics",
                     embedder=FakeEmbedder(model_name="all-MiniLM-L6-v2"))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def poll_health(base: str, stop, out) -> None:
    """Another process: GET /healthz every 50 ms until ``stop`` is set; puts the latencies on ``out``."""
    import time

    import httpx

    latencies = []
    with httpx.Client(base_url=base, timeout=10) as client:
        while not stop.is_set():
            started = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.05)
    out.put(latencies)


def serve_search(db_url: str, port: int, blob_dir: str, home: str) -> None:
    """The child process of the search flood: the app with its own default embedder (the active profile's,
    here an HTTP provider whose recipe it reads from ``db_url``) and the shared rate-limit file under ``home``."""
    import os

    os.environ["KBINDEX_DATABASE_URL"] = db_url
    os.environ["KBINDEX_HOME"] = home
    import uvicorn

    from pipelines.api import create_app

    app = create_app(db_url, tokens=TOKENS, tokens_file="", blob_url=blob_dir, metrics_token="bench-metrics")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


def poll_tenant(base: str, token: str, stop, out) -> None:
    """Another process: GET /tasks (as ``token``) and /healthz in turn every 50 ms until ``stop`` is set;
    puts {path: [(seconds, status)]} on ``out`` (a request that times out after 30 s counts as status 0)."""
    import time

    import httpx

    seen: dict[str, list[tuple[float, int]]] = {"/tasks": [], "/healthz": []}
    with httpx.Client(base_url=base, timeout=30) as client:
        while not stop.is_set():
            for path in seen:
                started = time.perf_counter()
                try:
                    status = client.get(path, params={"limit": 10} if path == "/tasks" else None,
                                        headers={"Authorization": f"Bearer {token}"}).status_code
                except httpx.HTTPError:
                    status = 0
                seen[path].append((time.perf_counter() - started, status))
            time.sleep(0.05)
    out.put(seen)
