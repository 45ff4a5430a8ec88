"""What the context-profile tests share (test_chunk_context_indexed.py, test_context_lexical_title.py): the active
profile and a context profile on the same fake model, and one Markdown version indexed under both in one run."""

from __future__ import annotations

import psycopg

from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.embedder import FakeEmbedder
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.profiles import create_profile
from resources.publisher import Publisher
from resources.run_state import RunState
from resources.task_queue import TaskQueue

MODEL = "fake-a"


def markdown(sections: dict[str, str]) -> bytes:
    return "\n\n".join(f"## {h}\n\n{t}" for h, t in sections.items()).encode()


def rows(db_url: str, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def two_profiles(db, db_url: str, tmp_path) -> dict:
    """The active profile moved to MODEL and a context profile ``ctx`` of the same model; the pieces a run needs."""
    rows(db_url, "UPDATE index_profile SET model = %s WHERE is_active RETURNING name", (MODEL,))
    create_profile(db, "ctx", model=MODEL, context=True)
    blobs = BlobStore(str(tmp_path / "blobs"))
    return {"db": db, "db_url": db_url, "blobs": blobs, "publisher": Publisher(db, blobs),
            "queue": TaskQueue(db, lease_seconds=60), "store": ArtifactStore(tmp_path / "artifacts")}


def index_both(world: dict, document: str, body: bytes, filename: str, owner: str,
               metadata: dict | None = None) -> tuple[dict[str, dict], dict[str, dict]]:
    """Publish a version (no fast path) and index it under both profiles in one run: each profile's chunk and embed
    step details."""
    world["publisher"].publish("acme", document, body, filename, metadata=metadata)
    claimed = world["queue"].claim(owner, limit=10)
    assert sorted(c.profile for c in claimed) == ["ctx", "minilm-v1"]
    leases = [(c.lease.task_id, c.lease.attempt) for c in claimed]
    keys = sorted({r["partition_key"] for r in world["db"].fetch_all(
        "document_version_partition_keys", {"task_ids": [t for t, _ in leases]})})
    queue = world["queue"]
    run = IndexingRun(db=world["db"], queue=queue, keeper=LeaseKeeper(queue), owner=owner, blobs=world["blobs"],
                      embedder_for=lambda model: FakeEmbedder(model_name=model), state=RunState(world["store"]),
                      tagged=leases, batch_size=16)
    run.parse(keys)
    chunked = {r.profile: r.details for rs in run.chunk(keys).values() for r in rs}
    embedded = {r.profile: r.details for rs in run.embed(keys).values() for r in rs}
    published = run.publish(keys)
    assert all(r.outcome == "ok" for rs in published.values() for r in rs)
    return chunked, embedded
