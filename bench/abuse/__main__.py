"""``python -m bench.abuse [--tasks 1000000] [--streams 150] [--uploads 20] [--upload-mb 50] [--searches 41]
[--flood-seconds 10] [--sections 1,2,3,4,5] [--bombs]`` (see __init__)."""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import tempfile
import time

import httpx
import psycopg

from bench import server_url
from bench.abuse.server import poll_health, poll_tenant, serve_search
from bench.abuse.server import serve as _serve
from bench.fake_embedding_server import FakeEmbeddingServer
from bench.queue.__main__ import load, scratch_database
from resources.database import Database
from sql import queries

from bench.abuse.server import TOKENS
A, B = {"Authorization": "Bearer tok-a"}, {"Authorization": "Bearer tok-b"}
METRICS = {"Authorization": "Bearer bench-metrics"}
BOUNDARY = "abusebound"


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _ms(values: list[float]) -> str:
    return f"p50 {_pct(values, .5) * 1000:.0f} ms, p95 {_pct(values, .95) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"


async def streams(base: str, db_url: str, n: int) -> None:
    print(f"\n1. {n} event streams from tenant A while tenant B publishes and searches")
    unlimited = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(30.0), limits=unlimited) as client, \
            httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(30.0)) as other:
        a_task = (await client.post("/documents/a.md/versions", files={"file": ("a.md", b"a", "text/markdown")},
                                    headers=A)).json()["task_id"]

        async def open_one():
            try:
                return await client.send(client.build_request("GET", f"/tasks/{a_task}/events", headers=A), stream=True)
            except httpx.HTTPError as exc:
                return exc

        opened = await asyncio.gather(*(open_one() for _ in range(n)))
        codes: dict[object, int] = {}
        for r in opened:
            key = r.status_code if isinstance(r, httpx.Response) else type(r).__name__
            codes[key] = codes.get(key, 0) + 1
        print(f"   tenant A's streams: {dict(sorted(codes.items(), key=str))}")
        b_lat, b_codes = [], []
        for i in range(20):
            t = time.perf_counter()
            r = await other.post(f"/documents/b-{i}.md/versions", files={"file": ("b.md", f"b {i}".encode(), "text/markdown")},
                                  headers=B)
            b_codes.append(r.status_code)
            r = await other.get("/search", params={"q": f"b {i}"}, headers=B)
            b_codes.append(r.status_code)
            b_lat.append(time.perf_counter() - t)
        print(f"   tenant B publish+search x20: statuses {sorted(set(b_codes))}, {_ms(b_lat)}")
        with psycopg.connect(db_url, autocommit=True) as conn:
            used = conn.execute(queries["bench_client_sessions"]).fetchone()[0]
            limit = conn.execute(queries["bench_max_connections"]).fetchone()[0]
        accepted = 0
        extra = []
        try:
            for _ in range(20):  # the daemon, run workers, other API processes: can they still connect?
                extra.append(psycopg.connect(db_url, autocommit=True))
                accepted += 1
        except psycopg.OperationalError as exc:
            print(f"   new connection refused: {exc}".splitlines()[0])
        finally:
            for c in extra:
                c.close()
        print(f"   PostgreSQL: {used} client connections in use of {limit}; {accepted}/20 new connections accepted")
        for r in opened:
            if isinstance(r, httpx.Response):
                await r.aclose()


def _tiny_parts(total: int):
    part = f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\ny\r\n".encode()
    block = part * (65536 // len(part))
    sent = 0
    while sent < total:
        yield block
        sent += len(block)
    yield f"--{BOUNDARY}--\r\n".encode()


async def uploads(base: str, server_pid: int, n: int, mb: int) -> None:
    print(f"\n2. {n} concurrent {mb} MB uploads of tiny parts (4 tenants); /healthz polled meanwhile")
    rss_before = _rss_mb(server_pid)
    tenants = list(TOKENS)
    unlimited = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(120.0), limits=unlimited) as client:
        done = asyncio.Event()
        peak = [rss_before]
        ctx = multiprocessing.get_context("spawn")
        stop, out = ctx.Event(), ctx.Queue()
        poller_process = ctx.Process(target=poll_health, args=(base, stop, out), daemon=True)
        poller_process.start()  # its own process: the uploads' client work does not skew its figures
        await asyncio.sleep(1.0)

        async def poll():
            while not done.is_set():
                peak[0] = max(peak[0], _rss_mb(server_pid))
                await asyncio.sleep(0.05)

        async def upload(i: int):
            async def body():
                for chunk in _tiny_parts(mb * 1024 * 1024):
                    yield chunk
            try:
                r = await client.post(f"/documents/big-{i}.md/versions", content=body(), headers={
                    "Authorization": f"Bearer {tenants[i % len(tenants)]}",
                    "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
                return r.status_code
            except httpx.HTTPError as exc:
                return type(exc).__name__

        poller = asyncio.create_task(poll())
        t = time.perf_counter()
        results = await asyncio.gather(*(upload(i) for i in range(n)))
        elapsed = time.perf_counter() - t
        await asyncio.sleep(0.5)
        done.set()
        await poller
        stop.set()
        health = out.get(timeout=30)
        poller_process.join(10)
    counts: dict[object, int] = {}
    for r in results:
        counts[r] = counts.get(r, 0) + 1
    print(f"   upload answers: {dict(sorted(counts.items(), key=str))} in {elapsed:.1f} s")
    print(f"   /healthz x{len(health)}: {_ms(health)}")
    print(f"   server RSS: {rss_before:.0f} MB before, peak {peak[0]:.0f} MB (VmHWM {_rss_mb(server_pid, 'VmHWM'):.0f} MB)")


async def metrics(base: str, db_url: str, tasks: int) -> None:
    print(f"\n3. /metrics with {tasks:,} tasks: 10 loops of 10 concurrent scrapes while tenant B lists its tasks")
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(120.0)) as client:
        scrape, tenant = [], []

        async def one_scrape():
            t = time.perf_counter()
            r = await client.get("/metrics", headers=METRICS)
            assert r.status_code == 200, r.status_code
            scrape.append(time.perf_counter() - t)

        async def one_tenant():
            t = time.perf_counter()
            r = await client.get("/tasks", params={"limit": 10}, headers=B)
            assert r.status_code == 200
            tenant.append(time.perf_counter() - t)

        started = time.perf_counter()
        for _ in range(10):
            await asyncio.gather(*(one_scrape() for _ in range(10)), *(one_tenant() for _ in range(5)))
            await asyncio.sleep(0.2)
        print(f"   scrapes x{len(scrape)}: {_ms(scrape)} (first, uncached: {max(scrape) * 1000:.0f} ms at most)")
        print(f"   tenant B GET /tasks x{len(tenant)} meanwhile: {_ms(tenant)}; all in {time.perf_counter() - started:.1f} s")
        r = await client.get("/metrics")
        print(f"   /metrics without the token: {r.status_code}")
    with Database(db_url, max_size=1) as db:
        t = time.perf_counter()
        db.fetch_one("task_stats", {"now": None})
        db.fetch_one("api_publish_latency_histogram", {"bounds": [1.0, 10.0, 60.0, 600.0]})
        print(f"   one uncached computation (task_stats + histogram) directly: {(time.perf_counter() - t) * 1000:.0f} ms")


def _free_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def _wait_healthy(base: str, child) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not child.is_alive():
            raise SystemExit("the API did not start")
        time.sleep(0.2)


def search_flood(db_url: str, blobs: str, searches: int, seconds: float) -> None:
    from resources.http_embedder import ProviderConfig
    from resources.profiles import activate_profile, create_profile

    print(f"\n4. {searches} searches of tenant A kept in flight for {seconds:g} s; the provider answers every request "
          "429 Retry-After: 60; another process polls tenant B's GET /tasks and /healthz")
    with FakeEmbeddingServer(faults={"rate_limit": 1.0}, retry_after=60) as provider, \
            tempfile.TemporaryDirectory(prefix="kbindex-abuse-home-") as home:
        with Database(db_url, max_size=1) as db:
            create_profile(db, "remote", model="", chunk_tokens=40, overlap=0,
                           provider=ProviderConfig(url=provider.url, model="fake-remote"))
            activate_profile(db, "remote", force=True)
        port = _free_port()
        ctx = multiprocessing.get_context("spawn")
        child = ctx.Process(target=serve_search, args=(db_url, port, blobs, home), daemon=True)
        child.start()
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(base, child)
            answers: dict[str, int] = {}
            latencies: list[float] = []

            async def flood() -> None:
                unlimited = httpx.Limits(max_connections=None, max_keepalive_connections=None)
                stop_at = time.monotonic() + seconds
                async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(120.0), limits=unlimited) as a:
                    async def searcher(i: int) -> None:
                        while time.monotonic() < stop_at:
                            started = time.perf_counter()
                            try:
                                r = await a.get("/search", params={"q": f"refund {i}"}, headers=A)
                                key = f"{r.status_code} {r.json().get('error', {}).get('code', 'hits')}"
                            except httpx.HTTPError as exc:
                                key = type(exc).__name__
                            latencies.append(time.perf_counter() - started)
                            answers[key] = answers.get(key, 0) + 1

                    await asyncio.gather(*(searcher(i) for i in range(searches)))

            stop, out = ctx.Event(), ctx.Queue()
            poller = ctx.Process(target=poll_tenant, args=(base, "tok-b", stop, out), daemon=True)
            poller.start()
            started = time.perf_counter()
            asyncio.run(flood())
            elapsed = time.perf_counter() - started
            stop.set()
            seen = out.get(timeout=120)
            poller.join(10)
            for path, rows in seen.items():
                statuses = sorted({s for _, s in rows})
                print(f"   tenant B {path} x{len(rows)}: {_ms([t for t, _ in rows])}; statuses {statuses}")
            print(f"   tenant A's searches: {sum(answers.values())} in {elapsed:.1f} s, "
                  f"{dict(sorted(answers.items()))}; {_ms(latencies)}")
            print(f"   requests that reached the provider: {len(provider.stats()['records'])}")
        finally:
            child.terminate()
            child.join(10)


def bombs() -> None:
    """Section 5 (issue #31): parser bombs, each parsed in its own child process; no server or database."""
    from bench.abuse.bombs import run

    print("\n5. parser bombs (HTML, Office XML, deflate, Markdown, PDF): code, seconds, peak RSS of the parsing child")
    run(indent="   ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bombs", action="store_true", help="run only section 5, the parser bombs (no server)")
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--streams", type=int, default=150)
    parser.add_argument("--uploads", type=int, default=20)
    parser.add_argument("--upload-mb", type=int, default=50)
    parser.add_argument("--searches", type=int, default=41, help="tenant A's searches kept in flight (section 4)")
    parser.add_argument("--flood-seconds", type=float, default=10.0, help="how long section 4 floods")
    parser.add_argument("--sections", default="1,2,3,4,5", help="which sections to run, e.g. 4")
    args = parser.parse_args()
    sections = {int(s) for s in args.sections.split(",") if s.strip()}
    if args.bombs or sections == {5}:
        bombs()
        return
    with server_url() as admin, scratch_database(admin, "kbindex_bench_abuse") as url, \
            tempfile.TemporaryDirectory(prefix="kbindex-abuse-") as blobs:
        port = _free_port()
        child = multiprocessing.get_context("spawn").Process(target=_serve, args=(url, port, blobs), daemon=True)
        child.start()
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(base, child)
            if 1 in sections:
                asyncio.run(streams(base, url, args.streams))
            if 2 in sections:
                asyncio.run(uploads(base, child.pid, args.uploads, args.upload_mb))
            if 3 in sections:
                print(f"\n   loading {args.tasks:,} tasks ...")
                load(url, args.tasks, lambda line: None)
                with Database(url, max_size=1) as db:
                    db.execute("abuse_bench_finish_tasks", {"tenant": "bench"})
                    db.execute("task_bench_vacuum")
                asyncio.run(metrics(base, url, args.tasks))
        finally:
            child.terminate()
            child.join(10)
        if 4 in sections:  # after 1-3: it makes the HTTP profile the active one
            search_flood(url, blobs, args.searches, args.flood_seconds)
    if 5 in sections:
        bombs()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    main()
