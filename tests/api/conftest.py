"""API fixtures: the real app on a fresh migrated database, an in-process client, a live uvicorn server.

``client`` talks to the app through Starlette's TestClient (httpx over the ASGI interface);
``live_url`` serves the same app with uvicorn on 127.0.0.1 and a kernel-chosen port, for what
needs a real socket (SSE streaming, dropped connections, the browser).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from bench.http_server import serve
from pipelines.domain.chunking import Chunk, VersionIdentity, chunk_id, content_digest
from resources.embedder import DEFAULT_MODEL_NAME

TOKENS = {"tok-acme": "acme", "tok-globex": "globex"}
ACME = {"Authorization": "Bearer tok-acme"}
GLOBEX = {"Authorization": "Bearer tok-globex"}
MAX_UPLOAD = 64 * 1024
MODEL = DEFAULT_MODEL_NAME  # the active profile's model: the fake embedder stands in for it


@pytest.fixture
def embedder():
    from resources.embedder import FakeEmbedder

    return FakeEmbedder(model_name=MODEL)


@pytest.fixture
def make_app(db_url: str, tmp_path, embedder) -> Iterator[Callable[..., FastAPI]]:
    from pipelines.api import create_app

    apps: list[FastAPI] = []

    def make(**overrides: Any) -> FastAPI:
        options: dict[str, Any] = {
            "tokens": TOKENS,
            "tokens_file": "",
            "blob_url": str(tmp_path / "blobs"),
            "artifacts_dir": str(tmp_path / "artifacts"),
            "embedder": embedder,
            "max_upload_bytes": MAX_UPLOAD,
            "poll_seconds": 2.0,
            "ping_seconds": 15.0,
            "metrics_public": True,  # tests of /metrics protection pass metrics_public=False
            "metrics_cache_seconds": 0.0,
            "fast_publish": False,  # most tests drive each task's publish themselves; test_fast_publish_api turns it on
        }
        options.update(overrides)
        app = create_app(db_url, **options)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.state.close()


@pytest.fixture
def app(make_app) -> FastAPI:
    return make_app()


@pytest.fixture
def client(app: FastAPI) -> TestClient:
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def queue(db):
    from resources.task_queue import TaskQueue

    return TaskQueue(db)


@pytest.fixture
def live_url(app: FastAPI) -> Iterator[str]:
    yield from serve(app)


def publish(client, document_id: str, data: bytes, headers=ACME, filename: str = "doc.md"):
    return client.post(f"/documents/{document_id}/versions", files={"file": (filename, data, "text/markdown")}, headers=headers)


def claim_task(queue, task_id: int, owner: str = "test-worker"):
    """Lease ``task_id`` itself (the named-task claim), leaving every other task as it was; returns its lease.
    (Claiming due work until it came up leased the tasks before it too, in an order the fair claim changed.)"""
    claimed = queue.claim_task(task_id, owner)
    if claimed is None:
        raise AssertionError(f"task {task_id} was not claimable")
    return claimed.lease


def fake_chunks(task: dict[str, Any], texts: list[str]) -> list[Chunk]:
    identity = VersionIdentity(task["tenant_id"], task["document_id"], task["version_number"], task["profile"])
    chunks = []
    for ordinal, text in enumerate(texts):
        digest = content_digest(text)
        chunks.append(
            Chunk(
                chunk_id=chunk_id(identity, ordinal, (), digest),
                ordinal=ordinal,
                heading_path=(),
                page=None,
                text=text,
                embed_text=text,
                token_count=len(text.split()),
                content_digest=digest,
            )
        )
    return chunks


def index_task(db, queue, embedder, task_id: int, texts: list[str], *, lease=None) -> None:
    """Take ``task_id`` through parse/chunk/embed progress and the fenced publish of ``texts`` as chunks."""
    from resources.index_sink import IndexSink

    lease = lease or claim_task(queue, task_id)
    task = queue.get(task_id)
    chunks = fake_chunks(task, texts)
    queue.progress(lease, "parse", 1, 1)
    queue.progress(lease, "chunk", len(chunks), len(chunks))
    vectors = np.vstack([embedder.embed([c.embed_text]) for c in chunks]).astype(np.float32)
    queue.progress(lease, "embed", len(chunks), len(chunks))
    queue.progress(lease, "publish", 0, 1)
    IndexSink(db, queue).publish(lease, chunks, vectors)


def fail_task(queue, task_id: int, code: str = "PARSE_ERROR", message: str = "the file is damaged") -> str:
    lease = claim_task(queue, task_id)
    return queue.fail(lease, code, message)
