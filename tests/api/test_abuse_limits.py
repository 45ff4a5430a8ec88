"""Issue #17 over HTTP: one tenant, or one link, cannot take the service down for the others."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import httpx
import psycopg
from starlette.testclient import TestClient

from pipelines.api.sse import APPLICATION_NAME
from tests.api.conftest import ACME, GLOBEX, TOKENS, publish, serve
from tests.api.test_api_contract import assert_error

TIMEOUT = httpx.Timeout(10.0, read=8.0)


def _listen_connections(db_url: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            (APPLICATION_NAME,),
        ).fetchone()[0]


def _listen_connections_settled(db_url: str, seconds: float = 15.0) -> int:
    """The LISTEN connections once the shared listener is up: streams are admitted before it has connected
    (they poll until then, up to 5 s), so on a loaded machine it can be missing for a moment (a fresh-clone
    run saw 0); more than one is never right."""
    deadline = time.monotonic() + seconds
    while (n := _listen_connections(db_url)) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return n


async def _open_streams(base: str, headers: dict, task_id: int, n: int) -> tuple[list[int], list]:
    """Open ``n`` event streams at once; returns their statuses and the open (200) responses."""
    client = httpx.AsyncClient(base_url=base, timeout=TIMEOUT)

    async def one():
        request = client.build_request("GET", f"/tasks/{task_id}/events", headers=headers)
        return await client.send(request, stream=True)

    responses = await asyncio.gather(*(one() for _ in range(n)))
    return [r.status_code for r in responses], (client, responses)


async def _close(handle) -> None:
    client, responses = handle
    for r in responses:
        await r.aclose()
    await client.aclose()


# -- 1. event streams ------------------------------------------------------------------------------

def test_streams_share_one_connection_are_capped_per_tenant_and_counted_before_they_start(make_app, db_url):
    app = make_app(max_streams_per_tenant=5, max_streams=8)
    for base in serve(app):
        with httpx.Client(base_url=base, timeout=TIMEOUT) as http:
            acme_task = publish(http, "a.md", b"a").json()["task_id"]
            globex_task = publish(http, "g.md", b"g", headers=GLOBEX).json()["task_id"]

            async def scenario():
                statuses, acme = await _open_streams(base, ACME, acme_task, 20)  # a burst: all at once
                try:
                    assert sorted(statuses).count(200) == 5, statuses
                    assert set(statuses) == {200, 429}
                    assert _listen_connections_settled(db_url) == 1  # 5 streams, one LISTEN connection
                    statuses, globex = await _open_streams(base, GLOBEX, globex_task, 4)
                    try:
                        assert statuses.count(200) == 3 and statuses.count(503) == 1  # the process cap: 8
                        assert _listen_connections_settled(db_url) == 1
                    finally:
                        await _close(globex)
                finally:
                    await _close(acme)

            asyncio.run(scenario())
            deadline = time.monotonic() + 5
            while _listen_connections(db_url) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _listen_connections(db_url) == 0  # the last stream gave the connection back
            assert len(app.state.event_hub.streams) == 0 and not app.state.event_hub.per_tenant


def test_an_event_wakes_only_the_streams_of_its_task(make_app, queue):
    app = make_app(poll_seconds=30.0)
    hub = app.state.event_hub
    reads: dict[int, int] = {}
    real = hub._read_sync

    def counted(task_id, after, *scope):
        reads[task_id] = reads.get(task_id, 0) + 1
        return real(task_id, after, *scope)

    hub._read_sync = counted
    for base in serve(app):
        with httpx.Client(base_url=base, timeout=TIMEOUT) as http:
            busy = publish(http, "busy.md", b"busy").json()["task_id"]
            quiet = publish(http, "quiet.md", b"quiet").json()["task_id"]
            with http.stream("GET", f"/tasks/{quiet}/events", headers=ACME), \
                    http.stream("GET", f"/tasks/{busy}/events", headers=ACME):
                deadline = time.monotonic() + 5
                while (reads.get(busy, 0) < 1 or reads.get(quiet, 0) < 1) and time.monotonic() < deadline:
                    time.sleep(0.02)
                for _ in range(3):
                    queue.cancel(busy) if _ == 0 else queue.retry(busy) if _ == 1 else queue.cancel(busy)
                    time.sleep(0.3)
                assert reads[busy] >= 2
                assert reads[quiet] == 1  # never woken by another task's events


# -- 2. the status page and the logs ---------------------------------------------------------------

def test_the_page_never_takes_a_token_from_the_url_and_shows_the_tenant(client):
    html = client.get("/").text
    assert 'localStorage.setItem("kbindex.token", fromUrl)' not in html
    assert 'params.has("token")' in html and 'id="tenant"' in html
    assert client.get("/whoami", headers=ACME).json() == {"tenant_id": "acme", "token": "tenant", "principals": None,
                                                          "search_as": False}
    assert_error(client.get("/whoami"), 401, "UNAUTHORIZED")


def test_no_token_reaches_any_log_line(make_app):
    import uvicorn

    app = make_app(metrics_public=False, metrics_token="metrics-secret-1")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    sock = __import__("socket").socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", access_log=True, lifespan="off"))
    handler = Keep(level=logging.DEBUG)
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.access", "uvicorn.error", "kbindex.api", "")]
    for logger in loggers:
        logger.addHandler(handler)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=TIMEOUT) as http:
            http.get("/?token=link-secret-2")
            http.get("/tasks?token=query-secret-3&limit=1", headers={"Authorization": "Bearer header-secret-4"})
            http.get("/tasks", headers=ACME)
            http.get("/metrics?access_token=metrics-secret-1", headers={"Authorization": "Bearer metrics-secret-1"})
        time.sleep(0.2)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        for logger in loggers:
            logger.removeHandler(handler)
    lines = [r.getMessage() for r in records]
    assert any("GET /?token=" in line for line in lines), lines  # the access log did record the requests
    for line in lines:
        for secret in ("link-secret-2", "query-secret-3", "header-secret-4", "metrics-secret-1", "tok-acme"):
            assert secret not in line, line


# -- 3. uploads ------------------------------------------------------------------------------------

def _tiny_parts_body(parts: int, boundary: str = "b0und") -> bytes:
    part = f"--{boundary}\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\ny\r\n".encode()
    tail = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.md\"\r\n\r\nhello\r\n"
            f"--{boundary}--\r\n").encode()
    return part * parts + tail


def test_a_body_of_many_tiny_parts_is_refused(client):
    body = _tiny_parts_body(100)
    response = client.post("/documents/a.md/versions", content=body, headers={
        **ACME, "Content-Type": "multipart/form-data; boundary=b0und"})
    assert_error(response, 400, "INVALID_REQUEST")
    assert "parts" in response.json()["error"]["message"]


def test_concurrent_uploads_are_capped_per_tenant(make_app):
    app = make_app(max_uploads_per_tenant=1, upload_idle_timeout=5.0)
    for base in serve(app):
        slow_started = threading.Event()

        def slow_body():
            yield b"--b0und\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.md\"\r\n\r\n"
            slow_started.set()
            time.sleep(1.5)
            yield b"hello\r\n--b0und--\r\n"

        results = {}

        def slow_upload():
            with httpx.Client(base_url=base, timeout=TIMEOUT) as h:
                results["slow"] = h.post("/documents/slow.md/versions", content=slow_body(), headers={
                    **ACME, "Content-Type": "multipart/form-data; boundary=b0und"}).status_code

        thread = threading.Thread(target=slow_upload)
        thread.start()
        assert slow_started.wait(5)
        time.sleep(0.2)
        with httpx.Client(base_url=base, timeout=TIMEOUT) as http:
            second = publish(http, "b.md", b"b")
            assert_error(second, 429, "TOO_MANY_REQUESTS")
            assert publish(http, "g.md", b"g", headers=GLOBEX).status_code == 202  # another tenant is not held up
        thread.join(10)
        assert results["slow"] == 202


def test_a_slow_body_times_out_with_408(make_app):
    app = make_app(upload_idle_timeout=0.5)
    for base in serve(app):
        def stalled():
            yield b"--b0und\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.md\"\r\n\r\n"
            time.sleep(2.0)
            yield b"late\r\n--b0und--\r\n"

        with httpx.Client(base_url=base, timeout=TIMEOUT) as http:
            response = http.post("/documents/a.md/versions", content=stalled(), headers={
                **ACME, "Content-Type": "multipart/form-data; boundary=b0und"})
            assert_error(response, 408, "UPLOAD_TIMEOUT")
            assert http.get("/tasks", headers=ACME).json() == []


def test_parsing_runs_off_the_event_loop(make_app, monkeypatch):
    """A slow parse (simulated) must not stall other requests."""
    from pipelines.api import uploads

    real = uploads._parse

    def slow_parse(*args):
        time.sleep(1.5)  # CPU-bound work on a worker thread; on the event loop this would block /healthz
        return real(*args)

    monkeypatch.setattr(uploads, "_parse", slow_parse)
    app = make_app()
    for base in serve(app):
        thread = threading.Thread(target=lambda: httpx.post(
            f"{base}/documents/a.md/versions", files={"file": ("a.md", b"x", "text/markdown")}, headers=ACME, timeout=10))
        thread.start()
        time.sleep(0.3)
        started = time.monotonic()
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        assert time.monotonic() - started < 0.5
        thread.join(10)


# -- 4. metrics ------------------------------------------------------------------------------------

def test_metrics_need_the_token_unless_switched_off(make_app):
    closed = TestClient(make_app(metrics_public=False), raise_server_exceptions=False)
    assert_error(closed.get("/metrics"), 401, "UNAUTHORIZED")
    assert_error(closed.get("/metrics", headers=ACME), 401, "UNAUTHORIZED")  # a tenant token is not enough
    opened = TestClient(make_app(metrics_public=True), raise_server_exceptions=False)
    assert opened.get("/metrics").status_code == 200


def test_concurrent_scrapes_share_one_computation_within_the_cache_period(make_app, monkeypatch):
    from resources.task_queue import TaskQueue

    calls = []
    real = TaskQueue.stats
    monkeypatch.setattr(TaskQueue, "stats", lambda self: (calls.append(1), time.sleep(0.3), real(self))[2])
    app = make_app(metrics_public=False, metrics_token="m", metrics_cache_seconds=30.0)
    for base in serve(app):
        async def scrape_many():
            async with httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as client:
                return await asyncio.gather(*(
                    client.get("/metrics", headers={"Authorization": "Bearer m"}) for _ in range(10)))

        responses = asyncio.run(scrape_many())
        assert {r.status_code for r in responses} == {200}
        assert len({r.text for r in responses}) == 1
        assert len(calls) == 1


# -- 8. a token revoked in the table ---------------------------------------------------------------

def test_a_token_revoked_in_the_table_is_refused_even_if_the_file_lists_it(client, db_url):
    from pipelines.api.auth import token_hash

    assert client.get("/tasks", headers=ACME).status_code == 200
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO api_token (token_sha256, tenant_id, label, revoked_at) VALUES (%s, 'acme', 'x', now())",
            (token_hash("tok-acme"),),
        )
    assert_error(client.get("/tasks", headers=ACME), 401, "UNAUTHORIZED")
    assert client.get("/tasks", headers=GLOBEX).status_code == 200
    assert TOKENS["tok-acme"] == "acme"


# -- 9. searches (issue #31, finding 1) ------------------------------------------------------------

def test_concurrent_searches_are_capped_per_tenant_and_per_process(make_app):
    """A tenant's searches past its share answer 429 at once, the process's past the total 503; another
    tenant's search still runs while one tenant's hold their slots."""
    release, started = threading.Event(), threading.Semaphore(0)

    def held(db, embedder, q, **kwargs):
        started.release()
        assert release.wait(10)
        return []

    app = make_app(search_fn=held, max_searches_per_tenant=2, max_searches=3)
    for base in serve(app):
        async def scenario():
            async with httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
                acme = [asyncio.create_task(http.get("/search", params={"q": "x"}, headers=ACME)) for _ in range(2)]
                for _ in range(2):
                    assert await asyncio.to_thread(started.acquire, True, 5)
                assert_error(await http.get("/search", params={"q": "x"}, headers=ACME), 429, "TOO_MANY_REQUESTS")
                globex = asyncio.create_task(http.get("/search", params={"q": "x"}, headers=GLOBEX))
                assert await asyncio.to_thread(started.acquire, True, 5)  # another tenant's search runs
                assert_error(await http.get("/search", params={"q": "x"}, headers=GLOBEX), 503, "SERVICE_UNAVAILABLE")
                assert (await http.get("/tasks", headers=GLOBEX)).status_code == 200
                release.set()
                assert [r.status_code for r in await asyncio.gather(*acme, globex)] == [200, 200, 200]
                assert (await http.get("/search", params={"q": "x"}, headers=ACME)).status_code == 200  # slots back

        asyncio.run(scenario())
        assert not app.state.searches.open


def _p95(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.95 * len(values)))]


def test_a_search_flood_on_a_rate_limiting_provider_leaves_other_tenants_and_healthz_answering(
        make_app, db, db_url, tmp_path, monkeypatch):
    """The issue's target: 41 searches of tenant A kept in flight while the provider answers every request with
    429 Retry-After: 60; tenant B's GET /tasks and /healthz p95 <= 1 s. Before, the sync /search route held
    the shared pool's 40 threads for the minute of the Retry-After (then up to 300 s), and every route that
    needs a thread (the token check, /tasks, /healthz) waited behind them."""
    from bench.fake_embedding_server import FakeEmbeddingServer
    from resources.http_embedder import ProviderConfig
    from resources.profiles import activate_profile, create_profile

    monkeypatch.setenv("KBINDEX_DATABASE_URL", db_url)  # the API resolves the profile's recipe from it
    monkeypatch.setenv("KBINDEX_HOME", str(tmp_path / "home"))  # the shared rate-limit file
    with FakeEmbeddingServer(faults={"rate_limit": 1.0}, retry_after=60) as provider:
        create_profile(db, "remote", model="", chunk_tokens=40, overlap=0,
                       provider=ProviderConfig(url=provider.url, model="fake-remote"))
        activate_profile(db, "remote", force=True)
        app = make_app(embedder=None)  # the default caps: 8 searches a tenant, 32 in all
        for base in serve(app):
            async def scenario():
                unlimited = httpx.Limits(max_connections=None, max_keepalive_connections=None)
                flooding = asyncio.Event()
                answers: list[httpx.Response] = []
                async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(20.0), limits=unlimited) as a, \
                        httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(5.0)) as b:
                    async def searcher(i: int) -> None:
                        while not flooding.is_set():
                            answers.append(await a.get("/search", params={"q": f"refund {i}"}, headers=ACME))

                    flood = [asyncio.create_task(searcher(i)) for i in range(41)]
                    await asyncio.sleep(0.5)  # the flood is on: the first provider 429 has come back
                    latency: dict[str, list[float]] = {"/tasks": [], "/healthz": []}
                    for _ in range(10):
                        for path in latency:
                            started = time.perf_counter()
                            response = await b.get(path, headers=GLOBEX)
                            latency[path].append(time.perf_counter() - started)
                            assert response.status_code == 200, response.text
                        await asyncio.sleep(0.05)
                    flooding.set()
                    await asyncio.gather(*flood)
                return latency, answers

            latency, answers = asyncio.run(scenario())
            assert _p95(latency["/tasks"]) <= 1.0 and _p95(latency["/healthz"]) <= 1.0, latency
            codes = {(r.status_code, r.json()["error"]["code"]) for r in answers}
            assert codes <= {(429, "TOO_MANY_REQUESTS"), (503, "EMBEDDING_RATE_LIMITED")}, codes
            assert (503, "EMBEDDING_RATE_LIMITED") in codes
            limited = [r for r in answers if r.status_code == 503]
            # What is left of the provider's 60 s pause: never more, and counting down from it (a loaded
            # machine may take several seconds between the first 429 and the last answer).
            waits = [int(r.headers["Retry-After"]) for r in limited]
            assert all(1 <= w <= 60 for w in waits) and max(waits) >= 30, waits
        # Only searches admitted before the first 429 came back reached the provider; then the shared pause
        # refused the rest without calling it.
        assert 1 <= len(provider.stats()["records"]) <= 8  # the default per-tenant cap
