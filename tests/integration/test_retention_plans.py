"""An hourly retention pass costs what is due, not every version ever published (#28).

Versions retention has released (superseded past the window, chunks deleted) stay in document_version and
index_task forever: that is the corpus's whole history. A pass read them all to name partition keys
(``document_version_releasable``: every version, with four NOT EXISTS probes each). Here one pass removes one
due version with a handful of released versions beside it, and another removes one due version with 20,000
released versions beside it; every statement of both passes is replayed under EXPLAIN (ANALYZE, BUFFERS) as it
runs (in a savepoint rolled back before the real statement), and must read about as many rows and buffers in both.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg.rows import tuple_row

from resources.database import Session
from resources.retention import apply_retention
from resources.task_queue import TaskQueue
from sql import queries
from tests.integration.test_retention import HOUR, PROFILE, World, later

RELEASED = 20_000


def add_released_versions(db_url: str, first: int, n: int) -> None:
    """Documents old-first..old-(first+n-1) of one version each, published and indexed a month ago, whose chunks
    retention already deleted: no chunk, no pointer, a SUCCEEDED task."""
    params = {"first": first, "n": n, "p": PROFILE}
    ids = "FROM generate_series(%(first)s, %(first)s + %(n)s - 1) AS i"
    with psycopg.connect(db_url) as conn:
        conn.execute("INSERT INTO document (tenant_id, document_id, latest_version) SELECT 'acme', 'old-' || i, 1 "
                     + ids, params)
        conn.execute("INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size,"
                     " filename, media_type, partition_key, published_at)"
                     " SELECT 'acme', 'old-' || i, 1, md5(i::text), 10, 'old.txt', 'text/plain',"
                     " 'acme/old-' || i || '/v1', now() - interval '30 days' " + ids, params)
        conn.execute("INSERT INTO index_task (tenant_id, document_id, version_number, profile, status, attempts,"
                     " created_at, updated_at, finished_at)"
                     " SELECT 'acme', 'old-' || i, 1, %(p)s, 'SUCCEEDED', 1, now() - interval '30 days',"
                     " now() - interval '30 days', now() - interval '30 days' " + ids, params)


def rows_read(node: dict) -> int:
    """Rows the plan's scans read from tables and indexes (returned or filtered out), over all loops."""
    own = 0
    if "Relation Name" in node or "Index Name" in node:
        own = round((node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"])
    return own + sum(rows_read(child) for child in node.get("Plans", []))


def measured_pass(db) -> dict[str, tuple[int, int]]:
    """One retention pass (window an hour, clock two hours on); (buffers, rows read) per statement it ran."""
    spent: dict[str, tuple[int, int]] = {}
    original = Session._run

    def measuring(self, name, params):
        if name != "retention_lock_timeout":
            with self.conn.transaction():  # a savepoint inside a batch's transaction, or a transaction of its own
                cur = self.conn.cursor(row_factory=tuple_row)
                (plan,) = cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + queries[name], params).fetchone()
                raise psycopg.Rollback()
            top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
            buffers, rows = spent.get(name, (0, 0))
            spent[name] = (buffers + top["Shared Hit Blocks"] + top["Shared Read Blocks"], rows + rows_read(top))
        return original(self, name, params)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Session, "_run", measuring)
        report = apply_retention(db, window_seconds=HOUR, now=later(2 * HOUR))
    assert report.chunks_deleted == 6 and len(report.removed_versions) == 1
    return spent


@pytest.mark.timeout(300)
def test_a_pass_does_not_read_the_versions_already_released(db, db_url, publisher):
    world = World(db, db_url, TaskQueue(db, lease_seconds=60), publisher)
    for document in ("policy", "handbook"):
        for version in (1, 2):
            world.publish(document)
            world.index(document, version)
    # the handbook's v1 is due only for the second pass
    world.sql("UPDATE superseded_version SET superseded_at = now() + interval '1 day' WHERE document_id = 'handbook'")
    add_released_versions(db_url, 1, 5)
    world.sql("ANALYZE")
    few = measured_pass(db)

    add_released_versions(db_url, 100, RELEASED)
    world.sql("UPDATE superseded_version SET superseded_at = now() - interval '1 day' WHERE document_id = 'handbook'")
    world.sql("ANALYZE")
    many = measured_pass(db)

    print(f"retention pass, (buffers, rows read) per statement: 5 released versions {few};"
          f" {RELEASED:,} released {many}")
    grown = {name: (few.get(name), spent) for name, spent in many.items()
             if spent[0] > 3 * few.get(name, (0, 0))[0] + 30 or spent[1] > 3 * few.get(name, (0, 0))[1] + 30}
    assert not grown, f"statements whose cost grew with {RELEASED:,} released versions: {grown}"
