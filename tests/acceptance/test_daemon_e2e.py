"""End to end with the real Dagster daemon, code server and run processes (`dagster dev`).

One `dagster dev` serves the module: the claiming sensor ticks, runs start as separate
processes, and the tests hurt them: SIGKILL mid-embed, SIGSTOP past the lease, a sensor that
dies right after its claim committed. Each ends with the document searchable exactly once.
The source sensor (`sync_sources`, every daemon loop here) keeps a folder's files in search.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import psycopg
import pytest
from psycopg import sql as pgsql

from bench.dagster_dev import DagsterDev, write_dagster_yaml
from resources.blob_store import BlobStore
from resources.dagster_resources import WINDOW_TAG
from resources.database import Database
from resources.publisher import Publisher
from resources.source_sync import SourceSync
from resources.task_queue import TaskQueue

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 12
pytestmark = pytest.mark.slow


def _with_database(url: str, database: str) -> str:
    base, _, query = url.partition("?")
    return base.rpartition("/")[0] + f"/{database}" + (f"?{query}" if query else "")


class E2E:
    def __init__(self, url: str, root: Path, dagster: DagsterDev, marker: Path, dg_url: str) -> None:
        self.url, self.root, self.dagster, self.marker, self.dg_url = url, root, dagster, marker, dg_url
        self.db = Database(url, max_size=4)
        self.queue = TaskQueue(self.db)
        self.publisher = Publisher(self.db, BlobStore(str(root / "blobs")))

    def sql(self, statement: str, params=None):
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else None

    def wait_for(self, predicate, timeout: float, what: str, interval: float = 0.3):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if not self.dagster.alive():
                pytest.fail(f"dagster dev exited while waiting for {what}\n{self.dagster.log_tail()}")
            time.sleep(interval)
        pytest.fail(f"timed out after {timeout}s waiting for {what}\n--- dagster log tail ---\n{self.dagster.log_tail()}")

    def wait_terminal(self, task_id: int, timeout: float = 180) -> dict:
        return self.wait_for(
            lambda: (t := self.queue.get(task_id))["status"] in ("SUCCEEDED", "DEAD", "CANCELLED") and t,
            timeout,
            f"task {task_id} to finish",
        )

    def wait_stage(self, task_id: int, stage: str, timeout: float = 120) -> dict:
        def reached():
            task = self.queue.get(task_id)
            if task["status"] in ("SUCCEEDED", "DEAD", "CANCELLED"):
                pytest.fail(f"task {task_id} ended {task['status']} {task['error_code']} before reaching {stage}")
            return task if task["stage"] == stage else None

        return self.wait_for(reached, timeout, f"task {task_id} to reach {stage}", interval=0.1)

    def run_processes(self) -> list[psutil.Process]:
        return self.dagster.run_processes()

    def assert_searchable_once(self, task_id: int) -> None:
        task = self.queue.get(task_id)
        assert task["status"] == "SUCCEEDED", task
        rows = self.sql(
            "SELECT p.version_number, p.chunk_count, (SELECT count(*) FROM chunk c WHERE c.tenant_id = p.tenant_id"
            " AND c.document_id = p.document_id AND c.profile = p.profile AND c.version_number = p.version_number),"
            " (SELECT count(DISTINCT c.ordinal) FROM chunk c WHERE c.tenant_id = p.tenant_id"
            " AND c.document_id = p.document_id AND c.profile = p.profile AND c.version_number = p.version_number)"
            " FROM search_pointer p WHERE p.tenant_id = %s AND p.document_id = %s",
            [task["tenant_id"], task["document_id"]],
        )
        assert len(rows) == 1
        version, recorded, stored, distinct = rows[0]
        assert version == task["version_number"]
        assert recorded == stored == distinct == task["chunk_count"] > 0


@pytest.fixture(scope="module")
def e2e(pg_server_url, template_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    template = template_url.partition("?")[0].rpartition("/")[2]
    names = {"kb": f"e2e_kb_{os.getpid()}", "dg": f"e2e_dg_{os.getpid()}"}
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        for name in names.values():
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {} TEMPLATE {}").format(pgsql.Identifier(names["kb"]), pgsql.Identifier(template)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(names["dg"])))
    url = _with_database(pg_server_url, names["kb"])
    from pipelines.cli.dev_command import psycopg2_url

    home = root / "dagster_home"
    home.mkdir()
    write_dagster_yaml(home)  # the warm run launcher unless KBINDEX_RUN_LAUNCHER=default
    marker = root / "sensor-fault-marker"
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(home),
        DAGSTER_PG_URL=psycopg2_url(_with_database(pg_server_url, names["dg"])),
        KBINDEX_DATABASE_URL=url,
        KBINDEX_HOME=str(root / "kbhome"),
        KBINDEX_BLOB_URL=str(root / "blobs"),
        KBINDEX_ARTIFACTS=str(root / "artifacts"),
        KBINDEX_LEASE_SECONDS=str(LEASE_SECONDS),
        KBINDEX_ORPHAN_RESERVATION_SECONDS="15",  # the tick that dies after its claim: its reservations
        KBINDEX_FAKE_DELAY="0.7",
        KBINDEX_EMBED_BATCH="4",
        KBINDEX_FAULT_SENSOR_AFTER_CLAIM=str(marker),
        KBINDEX_SOURCE_SYNC_SECONDS="1",  # the source sensor every daemon loop (~5 s), not every minute
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    dagster = DagsterDev(root, env)
    dagster.start()
    harness = E2E(url, root, dagster, marker, _with_database(pg_server_url, names["dg"]))
    try:
        yield harness
    finally:
        harness.db.close()
        dagster.stop()
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            for name in names.values():
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


POLICY = (
    b"# Travel policy\n\nEmployees book economy class for flights under six hours.\n\n"
    b"## Hotels\n\nHotel nights are reimbursed up to the city rate published by finance.\n"
)


def test_publish_is_indexed_by_the_daemon_with_the_real_model_and_found(e2e):
    r = e2e.publisher.publish("acme", "travel-policy.md", POLICY, "travel-policy.md")
    task = e2e.wait_terminal(r.task_id)
    assert task["status"] == "SUCCEEDED", task
    e2e.assert_searchable_once(r.task_id)
    from resources.embedder import DEFAULT_MODEL_NAME, embedder_for_model
    from resources.search import search

    hits = search(e2e.db, embedder_for_model(DEFAULT_MODEL_NAME), "how much can I spend on a hotel", tenant_id="acme", k=3)
    assert hits and hits[0].document_id == "travel-policy.md"
    assert search(e2e.db, embedder_for_model(DEFAULT_MODEL_NAME), "hotel", tenant_id="globex", k=3) == []


def _long_document(n: int, subject: str) -> bytes:
    """``n`` paragraphs about ``subject``: each test embeds its own texts, since a version whose chunks repeat
    stored ones reuses their vectors and would pass the embed stage faster than a test can see it."""
    return "\n\n".join(f"Paragraph {i}: the {subject} schedule keeps record class {i} for {i % 7 + 1} years."
                         for i in range(n)).encode()


def _use_fake_model(e2e):
    """Switch search and new publishes to a fake-model profile (a profile's model never changes once it has chunks)."""
    with psycopg.connect(e2e.url) as conn, conn.transaction():
        active = conn.execute("SELECT name FROM index_profile WHERE is_active").fetchone()[0]
        if active == "fake-e2e":
            return
        conn.execute("UPDATE index_profile SET is_active = false WHERE is_active")
        conn.execute(
            "INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, is_active, activated_at)"
            " VALUES ('fake-e2e', 'fake-384', 384, 200, 32, true, now())"
        )


def test_run_killed_mid_embed_is_retried_and_searchable_exactly_once(e2e):
    _use_fake_model(e2e)
    r = e2e.publisher.publish("acme", "retention.txt", _long_document(400, "retention"), "retention.txt")
    e2e.wait_stage(r.task_id, "embed")
    victims = e2e.wait_for(e2e.run_processes, 30, "the run process")
    for p in victims:
        p.send_signal(signal.SIGKILL)
    task = e2e.wait_terminal(r.task_id)
    assert task["status"] == "SUCCEEDED" and task["attempts"] >= 2, task
    codes = [e["error_code"] for e in e2e.queue.events(r.task_id)]
    assert "RUN_CRASHED" in codes, codes  # recorded by the run-failure sensor, not left to lease expiry
    e2e.assert_searchable_once(r.task_id)


def test_run_paused_past_its_lease_is_taken_over_and_cannot_commit_after_resuming(e2e):
    _use_fake_model(e2e)
    r = e2e.publisher.publish("acme", "paused.txt", _long_document(400, "archive"), "paused.txt")
    e2e.wait_stage(r.task_id, "embed")
    first = e2e.queue.get(r.task_id)
    victims = e2e.wait_for(e2e.run_processes, 30, "the run process")
    for p in victims:
        p.send_signal(signal.SIGSTOP)
    try:
        e2e.wait_for(lambda: e2e.queue.get(r.task_id)["attempts"] > first["attempts"], LEASE_SECONDS * 6, "a takeover")
        task = e2e.wait_terminal(r.task_id)
    finally:
        for p in victims:
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass
    assert task["status"] == "SUCCEEDED" and task["attempts"] > first["attempts"]
    # Let the resumed run notice its lost lease and finish; it must write nothing more.
    for p in victims:
        try:
            p.wait(60)
        except psutil.Error:
            pass
    after = [e for e in e2e.queue.events(r.task_id) if e["lease_owner"] == first["lease_owner"] and e["attempt"] == first["attempts"] and e["to_status"] != "RUNNING"]
    assert all(e["kind"] == "progress" and e["created_at"] <= task["finished_at"] for e in after)
    final = e2e.queue.get(r.task_id)
    assert (final["status"], final["attempts"], final["finished_at"]) == ("SUCCEEDED", task["attempts"], task["finished_at"])
    e2e.assert_searchable_once(r.task_id)


def test_sensor_dying_after_its_claim_loses_nothing(e2e):
    _use_fake_model(e2e)
    e2e.marker.write_text("die once")
    r = e2e.publisher.publish("acme", "orphaned-claim.txt", b"A claim whose sensor tick died.", "orphaned-claim.txt")
    e2e.wait_for(lambda: not e2e.marker.exists(), 60, "the sensor fault to fire")
    claimed = e2e.queue.get(r.task_id)
    assert claimed["status"] == "RUNNING" and claimed["attempts"] == 1
    task = e2e.wait_terminal(r.task_id)
    assert task["status"] == "SUCCEEDED" and task["attempts"] >= 2, task  # >2 if a slow run start outlived a lease
    e2e.assert_searchable_once(r.task_id)


def test_a_publish_right_after_a_claim_is_claimed_by_a_later_claiming_sensor_of_the_same_loop(e2e):
    """A claim ends its tick and hands the rest of the loop's wait to the claiming sensor the daemon evaluates
    next (pipelines/claim_window.py), so a publish made right after it is claimed in the same loop instead of
    waiting for the next one (issue #34). Each run says how its tick claimed (WINDOW_TAG): with no handover every
    claim would be a loop's first ("opened"). Which sensor claimed proves nothing: the daemon shuffles their
    order every loop."""
    _use_fake_model(e2e)
    tasks = []
    for i in range(5):
        r = e2e.publisher.publish("acme", f"back-to-back-{i}.txt", f"Back to back publish number {i}.".encode(),
                                  f"back-to-back-{i}.txt")
        e2e.wait_for(lambda: e2e.queue.get(r.task_id)["status"] != "PENDING", 60, f"task {r.task_id} to be claimed",
                     interval=0.05)
        tasks.append(r.task_id)
    for task_id in tasks:  # the runs exist by then (a task is claimed before its tick's run is stored)
        assert e2e.wait_terminal(task_id)["status"] == "SUCCEEDED"
        e2e.assert_searchable_once(task_id)
    with psycopg.connect(e2e.dg_url, autocommit=True) as conn:
        claims = [row[0] for row in conn.execute(
            "SELECT t.value FROM runs r JOIN run_tags t ON t.run_id = r.run_id AND t.key = %s"
            " WHERE r.pipeline_name = 'index_versions' ORDER BY r.create_timestamp DESC LIMIT 5", [WINDOW_TAG])]
    assert len(claims) == 5 and set(claims) <= {"opened", "handed"}, claims
    assert "handed" in claims, f"every publish made right after a claim waited for a new loop: {claims}"


HANDBOOK = {
    "expenses.md": "# Expenses\n\nMeals on client visits are reimbursed against a quokka receipt form.\n",
    "travel.md": "# Travel\n\nTrains are booked through the narwhal desk at least a week ahead.\n",
    "leave.md": "# Leave\n\nParental leave requests go to the people team by email.\n",
    "security.md": "# Security\n\nLaptops lock after five minutes without input.\n",
    "onboarding.md": "# Onboarding\n\nNew joiners meet their buddy on the first morning.\n",
}


def test_a_folder_source_is_synced_by_the_daemons_sensor_indexed_and_a_removed_file_leaves_search(e2e, tmp_path):
    """Nothing here publishes or syncs by hand: the daemon's `sync_sources` tick lists the folder and publishes,
    the claiming sensor's runs index, and search finds the files; a removed file's tombstone is indexed the same
    way and its document leaves every search mode."""
    from resources.embedder import embedder_for_model
    from resources.search import search

    _use_fake_model(e2e)
    embedder = embedder_for_model("fake-384")
    folder = tmp_path / "handbook"
    folder.mkdir()
    for name, text in HANDBOOK.items():
        (folder / name).write_text(text)
    sources = SourceSync(e2e.db, e2e.publisher)
    sources.add("e2e-handbook", "srcco", str(folder))

    def tasks() -> dict[tuple[str, int], str]:
        rows = e2e.sql("SELECT document_id, version_number, status FROM index_task WHERE tenant_id = 'srcco'")
        return {(doc, version): status for doc, version, status in rows}

    def all_succeeded(expected: int):
        current = tasks()
        failed = {k: v for k, v in current.items() if v in ("DEAD", "CANCELLED")}
        if failed:
            pytest.fail(f"source tasks ended badly: {failed}")
        return len(current) == expected and set(current.values()) == {"SUCCEEDED"} and current

    def found(query: str, mode: str) -> list[str]:
        return [h.document_id for h in search(e2e.db, embedder, query, tenant_id="srcco", k=5, mode=mode)]

    try:
        started = time.monotonic()
        e2e.wait_for(lambda: all_succeeded(len(HANDBOOK)), 120, "the sensor's pass to be published and indexed")
        indexed_after = time.monotonic() - started
        source = sources.get("e2e-handbook")
        assert source.passes >= 1 and source.files == len(HANDBOOK), source  # the sensor's passes, none by hand
        assert "failing" in source.last_pass  # written by this tree's code (the daemon imported the worktree)
        for mode in ("hybrid", "lexical", "dense"):
            assert "travel.md" in found("narwhal desk trains", mode), mode
        assert found("narwhal desk trains", "lexical")[0] == "travel.md"
        assert found("quokka receipt", "lexical")[0] == "expenses.md"

        (folder / "travel.md").unlink()  # 1 of 5: within the 20% safety share
        started = time.monotonic()
        e2e.wait_for(lambda: all_succeeded(len(HANDBOOK) + 1), 120, "the tombstone of travel.md to be indexed")
        gone_after = time.monotonic() - started
        assert tasks()[("travel.md", 2)] == "SUCCEEDED"
        for mode in ("hybrid", "lexical", "dense"):
            assert "travel.md" not in found("narwhal desk trains", mode), mode
        assert found("quokka receipt", "lexical")[0] == "expenses.md"  # the others stay
        print(f"\nsource via the daemon: files indexed {indexed_after:.1f} s after `source add`, "
              f"a removed file gone from search {gone_after:.1f} s after its unlink")
    finally:
        sources.remove("e2e-handbook")
