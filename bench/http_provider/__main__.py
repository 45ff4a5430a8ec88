"""``python -m bench.http_provider``: 1,000+ chunks through an HTTP-provider profile at 60 requests/min.

Starts a throwaway PostgreSQL and the fake OpenAI-compatible server (bench/fake_embedding_server.py, which
refuses with 429 anything over its own limit), publishes ``--documents`` versions of ``--paragraphs`` unique
paragraphs plus one shared footer, creates an HTTP profile with ``--rpm`` / ``--max-batch``, and runs the
real steps (IndexingRun: parse, chunk, embed, publish) with the embedder resolved from the profile, as a
Dagster run does. Reports: requests, the most requests the server saw in any window, 429s, chunks stored
vs chunked (lost), texts embedded more than once (duplicates), wall time. Exit 1 if any must-be-0 figure
is not 0. Nothing calls a real provider.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path


def run(url: str, args: argparse.Namespace) -> dict:
    import psycopg

    from bench.fake_embedding_server import FakeEmbeddingServer, max_in_window
    from resources.artifact_store import ArtifactStore
    from resources.blob_store import BlobStore
    from resources.database import Database
    from resources.embedder import embedder_for_model
    from resources.embedding_reuse import embed_digest
    from resources.http_embedder import WINDOW_ENV, ProviderConfig
    from resources.indexing_run import IndexingRun
    from resources.lease_keeper import LeaseKeeper
    from resources.migrations import migrate
    from resources.profiles import create_profile
    from resources.publisher import Publisher
    from resources.run_state import RunState
    from resources.task_queue import TaskQueue
    from sql import queries
    from bench.http_provider import document

    migrate(url)
    tmp = Path(tempfile.mkdtemp(prefix="kbindex-bench-http-"))
    os.environ.update({"KBINDEX_DATABASE_URL": url, "KBINDEX_HOME": str(tmp / "home"), WINDOW_ENV: str(args.window),
                       "KBINDEX_EMBED_KEY_BENCH": "not-a-real-key"})
    with Database(url) as db, FakeEmbeddingServer(rpm=args.rpm, window=args.window, latency=args.latency) as server:
        blobs = BlobStore(str(tmp / "blobs"))
        for n in range(args.documents):
            Publisher(db, blobs).publish("acme", f"policy-{n}.md", document(n, args.paragraphs), f"policy-{n}.md")
        provider = ProviderConfig(url=server.url, model="fake-remote", api_key_env="KBINDEX_EMBED_KEY_BENCH",
                                  requests_per_minute=args.rpm, max_batch=args.max_batch)
        create_profile(db, "remote", model="", chunk_tokens=40, overlap=0, provider=provider)
        queue = TaskQueue(db, lease_seconds=120)
        with psycopg.connect(url) as conn:
            task_ids = [r[0] for r in conn.execute(queries["bench_http_remote_tasks"])]
            keys = [r[0] for r in conn.execute(queries["bench_http_partition_keys"])]
        leases = []
        for task_id in task_ids:
            lease = queue.claim_task(task_id, "bench-http").lease
            leases.append((lease.task_id, lease.attempt))
        keeper = LeaseKeeper(queue)
        keeper.start()
        run = IndexingRun(db=db, queue=queue, keeper=keeper, owner="bench-http", blobs=blobs,
                          embedder_for=embedder_for_model, state=RunState(ArtifactStore(tmp / "artifacts")),
                          tagged=leases, batch_size=64)
        started = time.perf_counter()
        try:
            for step in (run.parse, run.chunk, run.embed, run.publish):
                step(keys)
        finally:
            keeper.stop()
        seconds = time.perf_counter() - started
        records = server.stats()["records"]
        chunked = {(w.key, c.embed_text) for w in run.works(keys) for c in run.chunks_of(w)}
        with psycopg.connect(url) as conn:
            stored = conn.execute(queries["bench_http_remote_digests"]).fetchall()
            statuses = dict(conn.execute(queries["bench_http_remote_states"]).fetchall())
    embedded = collections.Counter(d for r in records for d in r["digests"])
    unique = {embed_digest(t) for _, t in chunked}
    return {
        "documents": args.documents, "chunks": len(chunked), "unique_texts": len(unique),
        "stored_chunks": len(stored), "lost": len(chunked) - len(stored),
        "duplicates": sum(n - 1 for n in embedded.values()), "not_embedded": len(unique - set(embedded)),
        "requests": len(records), "http_429": sum(1 for r in records if r["status"] == 429),
        "limit": args.rpm, "window_s": args.window, "max_in_any_window": max_in_window([r["at"] for r in records], args.window),
        "task_status": statuses, "seconds": round(seconds, 1),
        "first_to_last_request_s": round(records[-1]["at"] - records[0]["at"], 1) if records else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m bench.http_provider", description=__doc__.splitlines()[0])
    p.add_argument("--rpm", type=int, default=60, help="requests per window (profile and server)")
    p.add_argument("--window", type=float, default=60.0, help="seconds of the limit's window (60: per minute)")
    p.add_argument("--max-batch", type=int, default=8, help="texts per request (8: ~130 requests, > 2 windows)")
    p.add_argument("--documents", type=int, default=20)
    p.add_argument("--paragraphs", type=int, default=50, help="per document (20 x 50: ~1,000 chunks)")
    p.add_argument("--latency", type=float, default=0.05, help="seconds the fake server takes per request")
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    from resources.local_postgres import temporary_server

    if args.database_url:
        report = run(args.database_url, args)
    else:
        with temporary_server("kbindex-bench-http-", external_env="KBINDEX_BENCH_DATABASE_URL") as url:
            report = run(url, args)
    for key, value in report.items():
        print(f"{key:>26}: {value}")
    ok = (report["lost"] == 0 and report["duplicates"] == 0 and report["not_embedded"] == 0
          and report["http_429"] == 0 and report["max_in_any_window"] <= report["limit"]
          and report["task_status"] == {"SUCCEEDED": report["documents"]})
    print("ok" if ok else "FAILED: a must-be-0 figure is not 0 or the limit was exceeded")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
