"""Per-version embedded / reused / shared counts are the truth, for a known edit (issue #15).

Three documents are published as v1 in one run, then as v2 with one sentence inserted in the middle
of a section of each and one identical new section in all three. Over each version's distinct embed
texts the counts must be exactly:

- ``reused``: texts whose vector was stored (by v1 chunks of the same tenant and profile);
- ``embedded``: texts no stored chunk had, embedded for the lowest task id of the run that needs them;
- ``shared``: texts embedded in this run for another task that needs the same text.

The expectation is computed here from the parser and chunker alone. The counts are checked in
``IndexingRun``'s step results (the shared pass, which fills its cache from stored vectors, and the
one-task path) and in the Dagster ``chunk_embeddings`` materialization metadata.
"""

from __future__ import annotations

import dagster as dg
import psycopg
import pytest

from pipelines.assets import indexing_assets
from pipelines.domain.chunking import VersionIdentity, chunk_document
from pipelines.domain.parsing import parse_document
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.dagster_resources import LEASES_TAG, OWNER_TAG, default_resources, encode_leases
from resources.embedder import FakeEmbedder
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.publisher import Publisher
from resources.run_state import RunState
from resources.task_queue import TaskQueue
from resources.tokenizer import ModelTokenizer

NAMES = ("alpha.md", "beta.md", "gamma.md")
LICENCE = "## Licence\n\nThis document is placed in the public domain. Copy it, change it and share it freely."
NOTICE = "## Notice\n\nThis notice was added to every document in the second version of the handbook."


def paragraphs(doc: int) -> list[str]:
    return [" ".join(f"Rule {doc}.{p}.{s} keeps records of kind {p * 4 + s} for {(p + s) % 7 + 1} years in office "
                     f"{doc}." for s in range(4)) for p in range(9)]


def document(doc: int, version: int) -> bytes:
    paras = paragraphs(doc)
    parts = ["## Overview", *paras[:5], "## Details", *paras[5:], LICENCE]
    if version >= 2:  # one sentence inserted in the middle of a section, and a new shared section
        parts[3] = parts[3].replace(f" Rule {doc}.2.2", f" Inserted sentence {doc} changes this rule. Rule {doc}.2.2")
        parts.append(NOTICE)
    if version >= 3:
        parts[8] = parts[8].replace(f" Rule {doc}.6.1", f" A third version adds this {doc}. Rule {doc}.6.1")
    return "\n\n".join(parts).encode()


def texts_of(data: bytes, name: str, profile: dict) -> set[str]:
    chunks = chunk_document(parse_document(data, filename=name), tokenizer=ModelTokenizer(),
                            chunk_tokens=profile["chunk_tokens"], overlap=profile["chunk_overlap"],
                            identity=VersionIdentity("acme", name, 1, profile["name"]))
    return {c.embed_text for c in chunks}


def expected(run: list[set[str]], stored: set[str]) -> list[dict[str, int]]:
    """Counts per task of one run, tasks in task-id order."""
    seen: set[str] = set()
    out = []
    for texts in run:
        new = texts - stored
        out.append({"reused": len(texts & stored), "embedded": len(new - seen), "shared": len(new & seen)})
        seen |= new
    return out


@pytest.fixture
def world(db, db_url, tmp_path, monkeypatch):
    for key, value in {"KBINDEX_DATABASE_URL": db_url, "KBINDEX_HOME": str(tmp_path / "home"),
                       "KBINDEX_BLOB_URL": str(tmp_path / "blobs"), "KBINDEX_ARTIFACTS": str(tmp_path / "artifacts"),
                       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
        monkeypatch.setenv(key, value)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    profile = db.fetch_one("index_profile_active")
    blobs = BlobStore(str(tmp_path / "blobs"))
    return {"db": db, "publisher": Publisher(db, blobs), "blobs": blobs, "queue": TaskQueue(db, lease_seconds=60),
            "profile": profile, "store": ArtifactStore(tmp_path / "artifacts")}


def publish(world, version: int, docs: tuple[int, ...]) -> tuple[list[tuple[int, int]], list[str], list[set[str]]]:
    """Publish ``version`` of ``docs`` and claim their tasks: (leases, partition keys, texts), in task-id order."""
    for d in docs:
        world["publisher"].publish("acme", NAMES[d], document(d, version), NAMES[d])
    claimed = sorted(world["queue"].claim("counts-test", limit=10), key=lambda t: t.lease.task_id)
    assert len(claimed) == len(docs)
    leases = [(t.lease.task_id, t.lease.attempt) for t in claimed]
    keys = [r["partition_key"] for r in world["db"].fetch_all(
        "document_version_partition_keys", {"task_ids": [task_id for task_id, _ in leases]})]
    texts = [texts_of(document(d, version), NAMES[d], world["profile"]) for d in docs]
    return leases, keys, texts


def run_directly(world, leases, keys) -> list[dict]:
    """parse -> chunk -> embed -> publish through IndexingRun; the embed step's details, in task-id order."""
    queue = world["queue"]
    run = IndexingRun(db=world["db"], queue=queue, keeper=LeaseKeeper(queue), owner="counts-test",
                      blobs=world["blobs"], embedder_for=lambda model: FakeEmbedder(model_name=model),
                      state=RunState(world["store"]), tagged=leases, batch_size=16)
    run.parse(keys)
    run.chunk(keys)
    embedded = run.embed(keys)
    published = run.publish(keys)
    assert all(r.outcome == "ok" for rs in published.values() for r in rs)
    results = sorted((r for rs in embedded.values() for r in rs), key=lambda r: r.task_id)
    return [{k: r.details[k] for k in ("embedded", "reused", "shared")} for r in results]


def run_in_dagster(world, leases, keys) -> list[dict]:
    """The four assets in process; the chunk_embeddings metadata of each version, in task-id order."""
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, keys)
    result = dg.materialize(indexing_assets, resources=default_resources(), instance=instance,
                            tags={LEASES_TAG: encode_leases(leases), OWNER_TAG: "counts-test",
                                  "dagster/asset_partition_range_start": min(keys),
                                  "dagster/asset_partition_range_end": max(keys)})
    assert result.success
    records = instance.fetch_materializations(dg.AssetKey("chunk_embeddings"), limit=100).records
    by_task = {}
    for record in records:
        meta = {k: v.value for k, v in record.asset_materialization.metadata.items()}
        by_task[meta["task_id"]] = {k: meta[k] for k in ("embedded", "reused", "shared")}
    return [by_task[task_id] for task_id, _ in leases]


@pytest.mark.parametrize("runner", [run_directly, run_in_dagster], ids=["indexing_run", "dagster_metadata"])
def test_counts_per_version_match_a_known_edit(world, runner) -> None:
    leases, keys, v1 = publish(world, 1, (0, 1, 2))
    counts = runner(world, leases, keys)
    assert counts == expected(v1, stored=set())
    assert [c["shared"] for c in counts] == [0, 1, 1]  # the licence section: embedded once, for alpha

    leases, keys, v2 = publish(world, 2, (0, 1, 2))  # the shared pass: three tasks of one model
    counts = runner(world, leases, keys)
    assert counts == expected(v2, stored=set().union(*v1))
    assert [c["shared"] for c in counts] == [0, 1, 1]  # the notice section
    for c, texts in zip(counts, v2, strict=True):  # one inserted sentence re-embeds its chunk, not its section
        assert c["embedded"] + c["shared"] <= 3 and c["reused"] >= len(texts) - 3

    leases, keys, v3 = publish(world, 3, (1,))  # one task alone: the one-by-one path
    counts = runner(world, leases, keys)
    assert counts == expected(v3, stored=set().union(*v1, *v2))
    assert counts[0]["embedded"] >= 1 and counts[0]["shared"] == 0
