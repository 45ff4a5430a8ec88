"""Issue #12, defect 10, through the real UI path: the webserver's GraphQL with the daemon running.

One ``dagster dev`` (webserver, daemon, code server, PostgreSQL storage) serves the code location.
Ten documents are indexed by the claiming sensor; ``create_profile`` starts a migration (fake model,
64-token chunks), which leaves one never-attempted REINDEX task per current version for the operator's
backfill. Then the test sends the mutations the Dagster UI itself sends (copied from the UI bundle
of dagster-webserver 1.13):

- ``LaunchPipelineExecution`` for one partition of ``__ASSET_JOB`` (the launchpad with one key), and
  for a partition range as one run (the launchpad's single-run option: range tags);
- ``LaunchPartitionBackfill`` over every partition of the four assets (the launchpad with many keys),
  run by the backfill daemon as ``__ASSET_JOB`` runs;
- ``LaunchPipelineReexecution`` (ALL_STEPS, then FROM_FAILURE) of finished runs.

Each run must do all four steps in one process under the leases it claimed (every REINDEX task
SUCCEEDED at its first attempt), show the profile per version in the ``search_index`` metadata, and
a run that holds no lease must end FAILURE with no materialization, never SUCCESS.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from psycopg import sql as pgsql

from bench.dagster_dev import LAUNCH_BACKFILL, LAUNCH_RUN, REPOSITORY, DagsterDev
from bench.dagster_dev import UI_ASSETS as ASSETS
from resources.blob_store import BlobStore
from resources.database import Database
from resources.profiles import coverage, create_profile
from resources.publisher import Publisher

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROFILE = "shadow-c64"
TENANT = "acme"
LEASE_SECONDS = 30  # a loaded 2-core machine can take 10-20 s to start a run; attempts == 1 must not flake
ASSET_JOB = "__ASSET_JOB"
pytestmark = pytest.mark.slow

REEXECUTE = """
mutation LaunchPipelineReexecution($executionParams: ExecutionParams, $reexecutionParams: ReexecutionParams) {
  launchPipelineReexecution(executionParams: $executionParams, reexecutionParams: $reexecutionParams) {
    __typename
    ... on LaunchRunSuccess { run { id pipelineName } }
    ... on PythonError { message stack }
  }
}"""
RUN = "query($id: ID!) { runOrError(runId: $id) { ... on Run { id status jobName tags { key value } } } }"
BACKFILL = """
query($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    ... on PartitionBackfill { id status runs { id status jobName } }
  }
}"""
RUN_EVENTS = """
query($id: ID!, $cursor: String) {
  runOrError(runId: $id) {
    ... on Run {
      eventConnection(afterCursor: $cursor) {
        cursor hasMore
        events {
          __typename
          ... on MaterializationEvent {
            stepKey partition assetKey { path }
            metadataEntries {
              label
              ... on TextMetadataEntry { text }
              ... on IntMetadataEntry { intValue }
              ... on FloatMetadataEntry { floatValue }
              ... on BoolMetadataEntry { boolValue }
            }
          }
        }
      }
    }
  }
}"""
TERMINAL_RUN = {"SUCCESS", "FAILURE", "CANCELED"}
TERMINAL_BACKFILL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def _with_database(url: str, database: str) -> str:
    base, _, query = url.partition("?")
    return base.rpartition("/")[0] + f"/{database}" + (f"?{query}" if query else "")


def _document(i: int) -> bytes:
    """About ten 64-token chunks: a backfill run of ten versions embeds in ~25 batches (slowed fake model)."""
    return "\n\n".join(
        f"Policy {i}.{p}: claims of class {p} are reviewed within {p % 9 + 2} working days by team {i}, "
        f"and refunds above {100 * (p + 1)} euros need a second approval."
        for p in range(14)
    ).encode()


class UI:
    """The webserver's GraphQL plus direct reads of the kbindex database and the Dagster event log."""

    def __init__(self, url: str, dagster: DagsterDev, instance: dg.DagsterInstance, blobs: str) -> None:
        self.url, self.dagster, self.instance = url, dagster, instance
        self.db = Database(url, max_size=4)
        self.publisher = Publisher(self.db, BlobStore(blobs))
        self.repository: dict[str, str] = {}

    # -- GraphQL ---------------------------------------------------------------------------------
    def gql(self, query: str, variables: dict | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.dagster.port}/graphql", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            out = json.load(response)
        assert not out.get("errors"), out["errors"]
        return out["data"]

    def repository_selector(self) -> dict[str, str]:
        if not self.repository:
            (node,) = self.gql(REPOSITORY)["repositoriesOrError"]["nodes"]
            self.repository = {"repositoryLocationName": node["location"]["name"], "repositoryName": node["name"]}
        return self.repository

    def launch_backfill(self, keys: list[str], tags: dict[str, str]) -> str:
        """What the asset launchpad sends for several partitions of assets outside any user job."""
        params = {"tags": _tags(tags), "assetSelection": [{"path": [a]} for a in ASSETS],
                  "partitionNames": keys, "fromFailure": False}
        out = self.gql(LAUNCH_BACKFILL, {"backfillParams": params})["launchPartitionBackfill"]
        assert out["__typename"] == "LaunchBackfillSuccess", out
        return out["backfillId"]

    def launch_one_partition(self, key: str, tags: dict[str, str]) -> str:
        """What the asset launchpad sends for one partition: a plain run of the implicit asset job."""
        params = {
            "mode": "default",
            "executionMetadata": {"tags": _tags({"dagster/partition": key, **tags})},
            "runConfigData": "{}",
            "selector": {**self.repository_selector(), "pipelineName": ASSET_JOB,
                         "assetSelection": [{"path": [a]} for a in ASSETS], "assetCheckSelection": []},
        }
        out = self.gql(LAUNCH_RUN, {"executionParams": params})["launchPipelineExecution"]
        assert out["__typename"] == "LaunchRunSuccess", out
        return out["run"]["id"]

    def launch_range_as_one_run(self, first: str, last: str, tags: dict[str, str]) -> str:
        """The launchpad's "single run" option for a partition range: one run with the range tags."""
        range_tags = {"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last}
        params = {
            "mode": "default",
            "executionMetadata": {"tags": _tags({**range_tags, **tags})},
            "runConfigData": "{}",
            "selector": {**self.repository_selector(), "pipelineName": ASSET_JOB,
                         "assetSelection": [{"path": [a]} for a in ASSETS], "assetCheckSelection": []},
        }
        out = self.gql(LAUNCH_RUN, {"executionParams": params})["launchPipelineExecution"]
        assert out["__typename"] == "LaunchRunSuccess", out
        return out["run"]["id"]

    def reexecute(self, run_id: str, strategy: str) -> str:
        out = self.gql(REEXECUTE, {"reexecutionParams": {"parentRunId": run_id, "strategy": strategy}})
        out = out["launchPipelineReexecution"]
        assert out["__typename"] == "LaunchRunSuccess", out
        return out["run"]["id"]

    def run(self, run_id: str) -> dict:
        return self.gql(RUN, {"id": run_id})["runOrError"]

    def materializations(self, run_id: str) -> list[dict]:
        """The run's materialization events as the UI shows them: asset, partition, metadata by label."""
        out, cursor = [], None
        while True:
            page = self.gql(RUN_EVENTS, {"id": run_id, "cursor": cursor})["runOrError"]["eventConnection"]
            for event in page["events"]:
                if event["__typename"] == "MaterializationEvent":
                    meta = {m["label"]: next((v for k, v in m.items() if k != "label"), None)
                            for m in event["metadataEntries"]}
                    out.append({"asset": event["assetKey"]["path"][-1], "partition": event["partition"],
                                "meta": meta})
            cursor = page["cursor"]
            if not page["hasMore"]:
                return out

    # -- waiting ---------------------------------------------------------------------------------
    def wait_for(self, predicate, timeout: float, what: str, interval: float = 1.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if not self.dagster.alive():
                pytest.fail(f"dagster dev exited while waiting for {what}\n{self.dagster.log_tail()}")
            time.sleep(interval)
        pytest.fail(f"timed out after {timeout}s waiting for {what}\n--- dagster log tail ---\n{self.dagster.log_tail()}")

    def wait_run(self, run_id: str, timeout: float = 180) -> dict:
        return self.wait_for(lambda: (r := self.run(run_id))["status"] in TERMINAL_RUN and r, timeout, f"run {run_id}")

    def wait_backfill(self, backfill_id: str, timeout: float = 300) -> dict:
        def done():
            b = self.gql(BACKFILL, {"id": backfill_id})["partitionBackfillOrError"]
            return b["status"] in TERMINAL_BACKFILL and b

        return self.wait_for(done, timeout, f"backfill {backfill_id}", interval=2.0)

    # -- kbindex and Dagster storage -------------------------------------------------------------
    def sql(self, statement: str, params=None) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def tasks(self, profile: str) -> dict[str, tuple]:
        """Partition key -> (task_type, status, attempts) of each version's task under ``profile``."""
        rows = self.sql(
            "SELECT v.partition_key, t.task_type, t.status, t.attempts FROM index_task t JOIN document_version v"
            " USING (tenant_id, document_id, version_number) WHERE t.profile = %s ORDER BY v.partition_key",
            [profile],
        )
        return {key: (kind, status, attempts) for key, kind, status, attempts in rows}

    def step_pids(self, run_id: str) -> dict[str, int]:
        """Step key -> the pid that started it (from the event log in Dagster's PostgreSQL storage)."""
        pids = {}
        for entry in self.instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START):
            pids[entry.dagster_event.step_key] = entry.dagster_event.pid
        return pids


def _tags(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"key": k, "value": v} for k, v in tags.items()]


@pytest.fixture(scope="module")
def ui(pg_server_url, template_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    template = template_url.partition("?")[0].rpartition("/")[2]
    names = {"kb": f"ui_kb_{os.getpid()}", "dg": f"ui_dg_{os.getpid()}"}
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        for name in names.values():
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {} TEMPLATE {}").format(pgsql.Identifier(names["kb"]),
                                                                          pgsql.Identifier(template)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(names["dg"])))
    url = _with_database(pg_server_url, names["kb"])
    with psycopg.connect(url, autocommit=True) as conn:  # the fake model: fast, deterministic
        conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
    from pipelines.cli.dev_command import psycopg2_url

    dg_url = psycopg2_url(_with_database(pg_server_url, names["dg"]))
    home = root / "dagster_home"
    home.mkdir()
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    reader_home = root / "reader_home"  # this process reads the same event log directly
    reader_home.mkdir()
    (reader_home / "dagster.yaml").write_text(json.dumps({"storage": {"postgres": {"postgres_url": dg_url}},
                                                          "telemetry": {"enabled": False}}))
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(home),
        DAGSTER_PG_URL=dg_url,
        KBINDEX_DATABASE_URL=url,
        KBINDEX_HOME=str(root / "kbhome"),
        KBINDEX_BLOB_URL=str(root / "blobs"),
        KBINDEX_ARTIFACTS=str(root / "artifacts"),
        KBINDEX_LEASE_SECONDS=str(LEASE_SECONDS),
        KBINDEX_FAKE_DELAY="0.4",
        KBINDEX_EMBED_BATCH="4",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.pop("KBINDEX_EMBED_SERVICE", None)
    dagster = DagsterDev(root, env)
    dagster.start()
    instance = dg.DagsterInstance.from_config(str(reader_home))
    harness = UI(url, dagster, instance, str(root / "blobs"))
    try:
        dagster.wait_ready()
        published = [harness.publisher.publish(TENANT, f"policy-{i:02d}.txt", _document(i), f"policy-{i:02d}.txt")
                     for i in range(10)]
        ids = [p.task_id for p in published]
        harness.wait_for(
            lambda: harness.sql("SELECT count(*) FROM index_task WHERE task_id = ANY(%s) AND status = 'SUCCEEDED'",
                                [ids])[0][0] == len(ids),
            420, "the sensor to index the ten documents",
        )
        created = create_profile(harness.db, PROFILE, model="fake-384", chunk_tokens=64, overlap=8)
        assert created["reindex_tasks"] == 10
        # Published while the profile builds: INDEX tasks under both profiles, both taken by the sensor.
        late = harness.publisher.publish(TENANT, "late.txt", _document(99), "late.txt")
        harness.wait_for(
            lambda: harness.sql("SELECT bool_and(status = 'SUCCEEDED') AND count(*) = 2 FROM index_task"
                                " WHERE document_id = 'late.txt'")[0][0],
            240, "the sensor to index the late document under both profiles",
        )
        assert late.version == 1
        yield harness
    finally:
        harness.db.close()
        instance.dispose()
        dagster.stop()
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            for name in names.values():
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def _reindex_keys(ui: UI) -> list[str]:
    return sorted(k for k, (kind, _, _) in ui.tasks(PROFILE).items() if kind == "REINDEX")


def _assert_one_process(ui: UI, run_id: str) -> None:
    pids = ui.step_pids(run_id)
    assert set(pids) == set(ASSETS), pids  # all four steps ran, in this run
    assert len(set(pids.values())) == 1, f"steps ran in several processes: {pids}"


def _by_partition(ui: UI, run_id: str, asset: str) -> dict[str, dict]:
    return {m["partition"]: m["meta"] for m in ui.materializations(run_id) if m["asset"] == asset}


def _successful_ui_run(ui: UI) -> str:
    """A finished UI run (``__ASSET_JOB`` with the profile tag) whose tasks all SUCCEEDED; launched if none."""
    records = ui.instance.get_run_records(dg.RunsFilter(job_name=ASSET_JOB, statuses=[dg.DagsterRunStatus.SUCCESS],
                                                        tags={"kbindex/profile": PROFILE}))
    if records:
        return records[0].dagster_run.run_id
    pending = [k for k, (kind, status, _) in ui.tasks(PROFILE).items() if kind == "REINDEX" and status == "PENDING"]
    assert pending, "no finished UI run to re-execute and no pending task to make one"
    run_id = ui.launch_one_partition(pending[0], {"kbindex/profile": PROFILE})
    assert ui.wait_run(run_id)["status"] == "SUCCESS"
    return run_id


def test_one_partition_launched_from_the_ui_builds_its_reindex_task_in_one_process(ui):
    key = _reindex_keys(ui)[0]
    assert ui.tasks(PROFILE)[key] == ("REINDEX", "PENDING", 0)
    run_id = ui.launch_one_partition(key, {"kbindex/profile": PROFILE})
    run = ui.wait_run(run_id)
    assert (run["status"], run["jobName"]) == ("SUCCESS", ASSET_JOB), ui.dagster.log_tail()
    assert ui.tasks(PROFILE)[key] == ("REINDEX", "SUCCEEDED", 1)
    _assert_one_process(ui, run_id)
    meta = _by_partition(ui, run_id, "search_index")[key]
    assert (meta["profile"], meta["outcome"]) == (PROFILE, "ok") and meta["chunk_count"] > 0, meta


def test_a_partition_range_launched_as_one_run_from_the_ui_builds_each_version_in_one_process(ui):
    pending = {k for k, v in ui.tasks(PROFILE).items() if v == ("REINDEX", "PENDING", 0)}
    ordered = ui.instance.get_dynamic_partitions("document_versions")  # a range follows this order
    keys = next(ordered[i:i + 3] for i in range(len(ordered) - 2) if pending.issuperset(ordered[i:i + 3]))
    run_id = ui.launch_range_as_one_run(keys[0], keys[-1], {"kbindex/profile": PROFILE})
    run = ui.wait_run(run_id)
    assert (run["status"], run["jobName"]) == ("SUCCESS", ASSET_JOB), ui.dagster.log_tail()
    assert [ui.tasks(PROFILE)[k] for k in keys] == [("REINDEX", "SUCCEEDED", 1)] * 3
    _assert_one_process(ui, run_id)
    shown = _by_partition(ui, run_id, "search_index")
    assert set(shown) == set(keys)
    assert all((m["profile"], m["outcome"]) == (PROFILE, "ok") for m in shown.values()), shown


def test_backfill_of_every_partition_from_the_ui_builds_the_profile_under_one_set_of_leases(ui):
    all_keys = sorted(ui.tasks(PROFILE))  # the ten REINDEX versions and late.txt (INDEX, done by the sensor)
    done_before = {k for k, (_, status, _) in ui.tasks(PROFILE).items() if status == "SUCCEEDED"}
    started = time.monotonic()
    backfill_id = ui.launch_backfill(all_keys, {"kbindex/profile": PROFILE})
    backfill = ui.wait_backfill(backfill_id)
    seconds = time.monotonic() - started
    runs = backfill["runs"]
    assert backfill["status"] in ("COMPLETED", "COMPLETED_SUCCESS"), (backfill, ui.dagster.log_tail())
    assert runs and all((r["status"], r["jobName"]) == ("SUCCESS", ASSET_JOB) for r in runs), runs

    tasks = ui.tasks(PROFILE)
    reindex = {k: v for k, v in tasks.items() if v[0] == "REINDEX"}
    assert len(reindex) == 10
    assert all(status == "SUCCEEDED" and attempts == 1 for _, status, attempts in reindex.values()), reindex
    assert coverage(ui.db, PROFILE) == {"current_versions": 11, "covered_versions": 11, "missing_versions": 0,
                                        "missing_by_reason": {}, "ratio": 1.0}

    shown: dict[str, dict] = {}
    for run in runs:
        _assert_one_process(ui, run["id"])
        shown.update(_by_partition(ui, run["id"], "search_index"))
    assert set(shown) == set(all_keys)
    for key, meta in shown.items():
        if key in done_before:  # built before (the sensor, or the one-partition run): shown as skipped
            assert meta["outcome"] == "skipped" and "not claimable" in meta["reason"], (key, meta)
        else:
            assert (meta["profile"], meta["outcome"]) == (PROFILE, "ok") and meta["chunk_count"] > 0, (key, meta)
    print(f"\nUI backfill of {len(all_keys)} partitions: {len(runs)} run(s), {seconds:.0f} s to COMPLETED")


def test_reexecution_of_a_finished_run_builds_nothing_and_fails(ui):
    parents = {"ui": _successful_ui_run(ui)}
    sensor_runs = ui.instance.get_run_records(dg.RunsFilter(job_name="index_versions",
                                                            statuses=[dg.DagsterRunStatus.SUCCESS]), limit=1)
    parents["sensor"] = sensor_runs[0].dagster_run.run_id
    before = ui.tasks(PROFILE)
    for origin, parent in parents.items():
        again = ui.reexecute(parent, "ALL_STEPS")
        run = ui.wait_run(again)
        assert run["status"] == "FAILURE", (origin, run)
        assert ui.materializations(again) == [], origin  # nothing shown as materialized
        # And re-executing that failure from the failed step fails the same way.
        retry = ui.reexecute(again, "FROM_FAILURE")
        assert ui.wait_run(retry)["status"] == "FAILURE", origin
        assert ui.materializations(retry) == [], origin
    assert ui.tasks(PROFILE) == before  # no claim, no attempt, no write
