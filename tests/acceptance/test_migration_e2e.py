"""A whole model migration in-process with the real packaged model (issue 7, item 8).

Index a small corpus under the active profile; ``kbindex profile create minilm-c128`` (same model, 128-token
chunks, overlap 16); a version published meanwhile is indexed under both; activation is refused while the
shadow profile is incomplete and ungated; a UI-style backfill (``dg.materialize`` of the four assets over
every ``document_versions`` partition, run tag ``kbindex/profile=minilm-c128``, no leases) builds it while
search keeps reading the active profile; the gate passes on tests/fixtures/eval/small-en; activation switches
search; rollback switches it back. ``kbindex verify`` finds nothing wrong at the end.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from typer.testing import CliRunner

from pipelines.assets import indexing_assets
from pipelines.cli import app
from pipelines.partitions import VERSIONS_PARTITIONS_NAME
from resources.blob_store import BlobStore
from resources.dagster_resources import PROFILE_TAG, default_resources
from resources.database import Database
from resources.embedder import DEFAULT_MODEL_NAME, PACKAGED_MODEL_NAME, embedder_for_model
from resources.publisher import Publisher
from resources.search import search

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "pipelines" / "sample_corpus"
EVAL_DIR = ROOT / "tests" / "fixtures" / "eval" / "small-en"
TENANT = "acme"
QUERY = "How many days do customers have to ask for a refund?"


def _materialize_all(instance: dg.DagsterInstance, keys: list[str], tags: dict[str, str]) -> dg.ExecuteInProcessResult:
    """What the UI's "Materialize all" over document_versions launches: one run over the whole key range."""
    return dg.materialize(
        indexing_assets,
        resources=default_resources(),
        instance=instance,
        tags={**tags, "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]},
        raise_on_error=False,
    )


def _hit_profiles(db_url: str, chunk_ids: list[str]) -> set[str]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT DISTINCT profile FROM chunk WHERE chunk_id = ANY(%s)", [chunk_ids]).fetchall()
    return {r[0] for r in rows}


def _current_versions(db_url: str, profile: str) -> list[tuple]:
    """Per current version: its task under the profile and whether the profile's pointer names it."""
    with psycopg.connect(db_url) as conn:
        return conn.execute(
            """
            SELECT d.document_id, d.latest_version, t.task_type, t.status, p.version_number = d.latest_version
            FROM document d
            LEFT JOIN index_task t ON (t.tenant_id, t.document_id, t.version_number, t.profile)
                                    = (d.tenant_id, d.document_id, d.latest_version, %s)
            LEFT JOIN search_pointer p ON (p.tenant_id, p.document_id, p.profile) = (d.tenant_id, d.document_id, %s)
            ORDER BY d.document_id, t.task_type
            """,
            [profile, profile],
        ).fetchall()


@pytest.mark.slow
def test_migrate_to_a_new_chunking_gate_activate_and_roll_back(db_url, kb_env, monkeypatch):
    cli = CliRunner()
    db = Database(db_url)
    publisher = Publisher(db, BlobStore(kb_env["KBINDEX_BLOB_URL"]))
    embedder = embedder_for_model(DEFAULT_MODEL_NAME)  # the active minilm-v1's model
    instance = dg.DagsterInstance.ephemeral()

    def publish(document_id: str, data: bytes, filename: str) -> str:
        result = publisher.publish(TENANT, document_id, data, filename)
        (key,) = [r["partition_key"] for r in db.fetch_all("document_version_partition_keys", {"task_ids": [result.task_id]})]
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, [key])
        return key

    def ask() -> tuple[list, set[str]]:
        hits = search(db, embedder, QUERY, tenant_id=TENANT, k=5)
        return hits, _hit_profiles(db_url, [h.chunk_id for h in hits])

    try:
        refund = (SAMPLES / "refund-policy.md").read_bytes()
        keys = [
            publish("refund-policy.md", refund, "refund-policy.md"),
            publish("pep-0020.rst", (SAMPLES / "pep-0020.rst").read_bytes(), "pep-0020.rst"),
            publish("pep-0010.rst", (SAMPLES / "pep-0010.rst").read_bytes(), "pep-0010.rst"),
            publish("refund-policy.md", refund + b"\n\nStore credit never expires.\n", "refund-policy.md"),  # v2
        ]
        # The active profile (minilm-v1, the real model) indexes everything: an operator run with no tags.
        assert _materialize_all(instance, keys, {}).success
        hits, seen = ask()
        assert seen == {"minilm-v1"} and hits[0].document_id == "refund-policy.md" and hits[0].version_number == 2

        created = cli.invoke(
            app, ["profile", "create", "minilm-c128", "--model", DEFAULT_MODEL_NAME, "--chunk-tokens", "128", "--overlap", "16", "--json"]
        )
        assert created.exit_code == 0, created.output
        assert json.loads(created.output)["reindex_tasks"] == 3  # current versions only (not refund v1)

        # Dual indexing: a version published while minilm-c128 builds gets an INDEX task under both profiles.
        keys.append(publish("handbook.md", b"# Handbook\n\nHolidays must be booked two weeks ahead.\n", "handbook.md"))
        with psycopg.connect(db_url) as conn:
            both = conn.execute(
                "SELECT profile, task_type FROM index_task WHERE document_id = 'handbook.md' ORDER BY profile"
            ).fetchall()
        assert both == [("minilm-c128", "INDEX"), ("minilm-v1", "INDEX")]

        refused = cli.invoke(app, ["profile", "activate", "minilm-c128"])
        assert refused.exit_code == 3
        said = " ".join(refused.output.split())
        assert "covers 0/4 current versions" in said and "gate was never run" in said

        # The UI backfill: every partition, run tag kbindex/profile=minilm-c128, no leases: each partition's
        # task under minilm-c128 is claimed by LeaseResource._claim_for.
        assert _materialize_all(instance, keys, {PROFILE_TAG: "minilm-c128"}).success
        assert _current_versions(db_url, "minilm-c128") == [
            ("handbook.md", 1, "INDEX", "SUCCEEDED", True),
            ("pep-0010.rst", 1, "REINDEX", "SUCCEEDED", True),
            ("pep-0020.rst", 1, "REINDEX", "SUCCEEDED", True),
            ("refund-policy.md", 2, "REINDEX", "SUCCEEDED", True),
        ]
        listed = json.loads(cli.invoke(app, ["profile", "list", "--json"]).output)
        shadow = next(p for p in listed if p["name"] == "minilm-c128")
        assert shadow["coverage"]["ratio"] == 1.0 and shadow["migration"]["done"] == 4
        assert shadow["migration"]["rate_per_minute"] > 0 and shadow["migration"]["eta_seconds"] == 0.0
        _, seen = ask()
        assert seen == {"minilm-v1"}  # built, not active: search still reads minilm-v1

        gate = cli.invoke(app, ["profile", "gate", "minilm-c128", "--eval", str(EVAL_DIR), "--json"])
        assert gate.exit_code == 0, gate.output
        verdict = json.loads(gate.output)
        print(
            f"\ngate small-en: minilm-c128 nDCG@10 {verdict['shadow_ndcg']:.4f} recall@10 {verdict['shadow_recall']:.4f}; "
            f"minilm-v1 nDCG@10 {verdict['active_ndcg']:.4f} recall@10 {verdict['active_recall']:.4f}; {verdict['seconds']}s"
        )
        assert verdict["passed"] and verdict["queries"] == 60 and verdict["shadow_ndcg"] > 0.8

        activated = cli.invoke(app, ["profile", "activate", "minilm-c128", "--json"])
        assert activated.exit_code == 0, activated.output
        hits, seen = ask()
        assert seen == {"minilm-c128"} and hits[0].document_id == "refund-policy.md" and hits[0].version_number == 2

        rolled = cli.invoke(app, ["profile", "rollback", "--json"])
        assert rolled.exit_code == 0, rolled.output
        assert json.loads(rolled.output)["name"] == "minilm-v1"
        hits, seen = ask()
        assert seen == {"minilm-v1"} and hits[0].document_id == "refund-policy.md"

        report = cli.invoke(app, ["verify", "--json"])
        assert report.exit_code == 0, report.output
    finally:
        db.close()


def _sensor_round(instance: dg.DagsterInstance, db_url: str) -> int:
    """One claiming tick and its runs, in process (what the daemon and the run launcher do); returns runs."""
    from pipelines import sensors
    from resources.dagster_resources import DatabaseResource

    with dg.build_sensor_context(instance=instance, resources={"database": DatabaseResource(url=db_url)}) as ctx:
        result = sensors.claim_index_tasks(ctx)
    requests = getattr(result, "run_requests", None) or []
    for request in getattr(result, "dynamic_partitions_requests", None) or []:
        instance.add_dynamic_partitions(VERSIONS_PARTITIONS_NAME, list(request.partition_keys))
    for request in requests:
        assert dg.materialize(indexing_assets, resources=default_resources(), instance=instance,
                              tags=dict(request.tags), partition_key=request.partition_key).success
    return len(requests)


@pytest.mark.slow
def test_migrate_to_another_model_through_the_backfill_job_gate_activate_search_and_roll_back(db_url, kb_env):
    """Issue #12: a migration that changes the model (from the default int8 to the torch original, each
    with vectors of its own): backfill_profile job, the claiming sensor builds it, gate, activate, CLI and
    API search, rollback."""
    from fastapi.testclient import TestClient

    from pipelines.api import create_app
    from pipelines.lineage_job import backfill_profile_job
    from resources.dagster_resources import DatabaseResource

    cli = CliRunner()
    db = Database(db_url)
    publisher = Publisher(db, BlobStore(kb_env["KBINDEX_BLOB_URL"]))
    instance = dg.DagsterInstance.ephemeral()
    try:
        for name in ("refund-policy.md", "pep-0020.rst", "pep-0010.rst"):
            publisher.publish(TENANT, name, (SAMPLES / name).read_bytes(), name)
        while _sensor_round(instance, db_url):
            pass
        created = cli.invoke(app, ["profile", "create", "torch", "--model", PACKAGED_MODEL_NAME,
                                   "--chunk-tokens", "200", "--overlap", "32", "--json"])
        assert created.exit_code == 0, created.output
        assert _sensor_round(instance, db_url) == 0  # nobody asked for the backfill yet
        launched = backfill_profile_job.execute_in_process(
            run_config={"ops": {"request_profile_backfill": {"config": {"profile": "torch"}}}},
            resources={"database": DatabaseResource(url=db_url)}, instance=instance)
        assert launched.success
        while _sensor_round(instance, db_url):
            pass
        assert [row[3] for row in _current_versions(db_url, "torch")] == ["SUCCEEDED"] * 3

        gate = cli.invoke(app, ["profile", "gate", "torch", "--eval", str(EVAL_DIR), "--json"])
        assert gate.exit_code == 0, gate.output
        verdict = json.loads(gate.output)
        print(f"\ngate small-en: torch nDCG@10 {verdict['shadow_ndcg']:.4f} recall@10 {verdict['shadow_recall']:.4f}; "
              f"minilm-v1 nDCG@10 {verdict['active_ndcg']:.4f} recall@10 {verdict['active_recall']:.4f}")
        assert verdict["passed"]
        assert cli.invoke(app, ["profile", "activate", "torch"]).exit_code == 0

        api = TestClient(create_app(db_url, tokens={"tok": TENANT}, tokens_file=""), raise_server_exceptions=False)
        for expected in ("torch", "minilm-v1"):
            found = json.loads(cli.invoke(app, ["search", QUERY, "--tenant", TENANT, "--json"]).output)
            assert found[0]["document_id"] == "refund-policy.md"
            assert _hit_profiles(db_url, [h["chunk_id"] for h in found]) == {expected}
            answer = api.get("/search", params={"q": QUERY}, headers={"Authorization": "Bearer tok"})
            assert answer.status_code == 200, answer.text  # the same API process follows the switch
            assert answer.json()["hits"][0]["document_id"] == "refund-policy.md"
            if expected == "torch":
                assert cli.invoke(app, ["profile", "rollback"]).exit_code == 0
        assert cli.invoke(app, ["verify"]).exit_code == 0
    finally:
        db.close()
