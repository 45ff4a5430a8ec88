"""Retention: superseded versions' chunks go after the window; nothing search can reach is ever touched."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder
from resources.index_sink import IndexSink
from resources.partition_keys import prunable, record_added
from resources.retention import apply_retention
from resources.search import search
from resources.task_queue import TaskQueue
from tests.integration.test_index_sink import embed, make_chunks

PROFILE = "minilm-v1"
MODEL = DEFAULT_MODEL_NAME  # the default profile's model: fakes stand in for it under its name
HOUR = 3600.0
WORDS = "refund invoice shipping warranty credit exchange delivery parcel account voucher receipt".split()


def later(seconds: float) -> datetime:
    """A clock ``seconds`` past the database's now (pointer moves are stamped with the database's now())."""
    return datetime.now(UTC) + timedelta(seconds=seconds)


def texts_for(document: str, version: int, n: int = 6) -> list[str]:
    rng = random.Random(f"{document}/{version}")
    return [f"{document} v{version} part {i}: " + " ".join(rng.choices(WORDS, k=8)) for i in range(n)]


class World:
    """Publish versions, claim their tasks, and finish them as a test needs (publish, fail, or leave RUNNING)."""

    def __init__(self, db, db_url, queue, publisher) -> None:
        self.db, self.db_url, self.queue, self.publisher = db, db_url, queue, publisher
        self.sink = IndexSink(db, queue)
        self.claimed: dict[tuple[str, str, int, str], object] = {}

    def publish(self, document: str, tenant: str = "acme") -> int:
        result = self.publisher.publish(tenant, document, f"{document} {random.random()}".encode(), f"{document}.txt")
        for task in self.queue.claim("w1", limit=50):
            self.claimed[(task.tenant_id, task.document_id, task.version_number, task.profile)] = task
        return result.version

    def index(self, document: str, version: int, profile: str = PROFILE, tenant: str = "acme"):
        task = self.claimed.pop((tenant, document, version, profile))
        chunks = make_chunks(tenant, document, version, texts_for(document, version), profile)
        return self.sink.publish(task.lease, chunks, embed(chunks))

    def fail(self, document: str, version: int, profile: str = PROFILE, tenant: str = "acme") -> None:
        task = self.claimed.pop((tenant, document, version, profile))
        self.queue.fail(task.lease, "PARSE_ERROR", "not a document")

    def sql(self, statement: str, params=()) -> list[tuple]:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def chunk_versions(self) -> dict[tuple[str, str, str, int], int]:
        rows = self.sql(
            "SELECT tenant_id, document_id, profile, version_number, count(*) FROM chunk GROUP BY 1, 2, 3, 4"
        )
        return {(t, d, p, v): n for t, d, p, v, n in rows}

    def pointers(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        rows = self.sql("SELECT tenant_id, document_id, profile, version_number, chunk_count FROM search_pointer")
        return {(t, d, p): (v, n) for t, d, p, v, n in rows}

    def add_shadow_profile(self, name: str = "shadow") -> None:
        self.sql(
            "INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, building) "
            "VALUES (%s, %s, 384, 200, 32, true)",
            (name, MODEL),
        )


@pytest.fixture
def world(db, db_url, publisher) -> World:
    # The database's clock, not a pinned one: under load a history takes seconds and every task must be due.
    return World(db, db_url, TaskQueue(db, lease_seconds=60), publisher)


def assert_pointed_versions_whole(world: World) -> None:
    """Every pointer's version has exactly the chunk rows its publish recorded."""
    chunks = world.chunk_versions()
    for (tenant, document, profile), (version, count) in world.pointers().items():
        assert chunks.get((tenant, document, profile, version), 0) == count, (tenant, document, profile, version)


def test_superseded_chunks_stay_for_the_window_then_go(world, db):
    world.publish("policy")
    world.index("policy", 1)
    world.publish("policy")
    world.index("policy", 2)
    assert set(world.chunk_versions()) == {("acme", "policy", PROFILE, 1), ("acme", "policy", PROFILE, 2)}

    inside = apply_retention(db, window_seconds=HOUR, now=later(HOUR - 60))
    assert inside.removed_versions == [] and inside.chunks_deleted == 0
    assert ("acme", "policy", PROFILE, 1) in world.chunk_versions()

    past = apply_retention(db, window_seconds=HOUR, now=later(HOUR + 60))
    assert past.removed_versions == [("acme", "policy", PROFILE, 1)]
    assert past.chunks_deleted == 6
    assert set(world.chunk_versions()) == {("acme", "policy", PROFILE, 2)}
    assert_pointed_versions_whole(world)
    # nothing is left to do: a second pass removes nothing
    again = apply_retention(db, window_seconds=HOUR, now=later(HOUR + 60))
    assert again.removed_versions == [] and again.chunks_deleted == 0


def test_the_window_counts_from_when_the_pointer_moved_away(world, db):
    """v1 superseded long ago, v2 just now: only v1 is past the window."""
    world.publish("policy")
    world.index("policy", 1)
    world.publish("policy")
    world.index("policy", 2)
    world.sql("UPDATE superseded_version SET superseded_at = superseded_at - interval '2 hours'")
    world.publish("policy")
    world.index("policy", 3)
    report = apply_retention(db, window_seconds=HOUR)
    assert report.removed_versions == [("acme", "policy", PROFILE, 1)]
    assert set(world.chunk_versions()) == {("acme", "policy", PROFILE, 2), ("acme", "policy", PROFILE, 3)}


def test_versions_with_a_running_task_are_skipped_until_it_ends(world, db):
    world.add_shadow_profile()
    world.publish("policy")  # tasks under minilm-v1 and shadow, both claimed
    world.index("policy", 1)  # the shadow task of v1 stays RUNNING
    world.publish("policy")
    world.index("policy", 2)
    world.index("policy", 2, profile="shadow")

    report = apply_retention(db, window_seconds=0, now=later(60))
    assert report.removed_versions == [] and report.skipped_busy == 1
    assert ("acme", "policy", PROFILE, 1) in world.chunk_versions()

    world.fail("policy", 1, profile="shadow")  # the task ends (DEAD): nothing runs on v1 any more
    report = apply_retention(db, window_seconds=0, now=later(60))
    assert report.removed_versions == [("acme", "policy", PROFILE, 1)]
    assert_pointed_versions_whole(world)


def test_a_retention_batch_holds_back_claims_of_its_versions(world, db, db_url):
    """While a batch holds its locks, the claim's SKIP LOCKED passes the version's tasks by."""
    from sql import queries

    world.publish("policy")
    world.index("policy", 1)
    world.publish("policy")
    world.index("policy", 2)
    queue = world.queue
    (dead,) = world.sql("SELECT task_id FROM index_task WHERE version_number = 1")
    world.sql("UPDATE index_task SET status = 'DEAD', error_code = 'PARSE_ERROR' WHERE task_id = %s", dead)
    queue.retry(dead[0])  # DEAD -> PENDING: claimable
    with psycopg.connect(db_url) as conn:  # one transaction, like a retention batch
        params = {"tenant_ids": ["acme"], "document_ids": ["policy"], "versions": [1]}
        locked = conn.execute(queries["index_task_lock_retention"], params).fetchall()
        assert len(locked) == 1
        assert queue.claim("other", limit=10) == []
        conn.rollback()
    assert [t.lease.task_id for t in queue.claim("other", limit=10)] == [dead[0]]


def test_a_deleted_pointer_keeps_its_version_for_the_window(world, db):
    """A pointer removed (e.g. a profile retired) is a move away too: its chunks get the full window."""
    world.publish("policy")
    world.index("policy", 1)
    world.sql("DELETE FROM search_pointer")
    assert apply_retention(db, window_seconds=HOUR, now=later(60)).removed_versions == []
    assert world.chunk_versions() == {("acme", "policy", PROFILE, 1): 6}
    report = apply_retention(db, window_seconds=HOUR, now=later(HOUR + 60))
    assert report.removed_versions == [("acme", "policy", PROFILE, 1)] and world.chunk_versions() == {}


def test_a_pointer_that_comes_back_protects_its_version_again(world, db):
    world.publish("policy")
    world.index("policy", 1)
    world.publish("policy")
    world.index("policy", 2)
    # a rollback of the pointer to v1 (the only writer today is publish; a rollback command may come)
    world.sql("UPDATE search_pointer SET version_number = 1, chunk_count = 6")
    assert world.sql("SELECT version_number FROM superseded_version") == [(2,)]
    report = apply_retention(db, window_seconds=0, now=later(60))
    assert report.removed_versions == [("acme", "policy", PROFILE, 2)]
    assert world.chunk_versions() == {("acme", "policy", PROFILE, 1): 6}


def test_profile_rollback_still_finds_the_previous_profiles_chunks(world, db):
    world.publish("policy")
    world.index("policy", 1)
    world.add_shadow_profile()
    world.publish("policy")
    world.index("policy", 2)
    world.index("policy", 2, profile="shadow")
    # switch search to the shadow profile, then publish more under it alone
    world.sql("UPDATE index_profile SET is_active = false WHERE name = %s", (PROFILE,))
    world.sql(
        "UPDATE index_profile SET is_active = true, building = false, previous_active = %s WHERE name = 'shadow'",
        (PROFILE,),
    )
    world.publish("policy")
    world.index("policy", 3, profile="shadow")
    before = {k: v for k, v in world.chunk_versions().items() if k[2] == PROFILE}

    apply_retention(db, window_seconds=0, now=later(30 * 24 * HOUR))

    # minilm-v1 keeps the version its pointer names (v2), whatever happened under the other profile
    assert {k: v for k, v in world.chunk_versions().items() if k[2] == PROFILE} == {
        ("acme", "policy", PROFILE, 2): before[("acme", "policy", PROFILE, 2)]
    }
    assert_pointed_versions_whole(world)
    # roll back: search reads minilm-v1 again and finds v2 whole
    world.sql("UPDATE index_profile SET is_active = false WHERE name = 'shadow'")
    world.sql("UPDATE index_profile SET is_active = true WHERE name = %s", (PROFILE,))
    hits = search(db, FakeEmbedder(model_name=MODEL), "refund invoice", tenant_id="acme", k=20)
    assert {(h.document_id, h.version_number) for h in hits} == {("policy", 2)} and len(hits) == 6


@pytest.mark.parametrize("seed", range(5))
def test_retention_never_removes_what_search_can_reach(world, db, seed):
    """Random histories over two profiles and tenants: after retention every pointed version is whole and
    search answers exactly as before."""
    rng = random.Random(seed)
    world.add_shadow_profile()
    documents = [("acme", "a"), ("acme", "b"), ("globex", "a"), ("globex", "c")]
    for _ in range(rng.randint(6, 12)):
        tenant, document = rng.choice(documents)
        version = world.publish(document, tenant=tenant)
        for profile in (PROFILE, "shadow"):
            action = rng.choice(["index", "index", "index", "fail", "leave"])
            if action == "index":
                world.index(document, version, profile=profile, tenant=tenant)
            elif action == "fail":
                world.fail(document, version, profile=profile, tenant=tenant)
    # publish the claimed-but-left tasks late and out of order (some are superseded by then)
    leftovers = list(world.claimed)
    rng.shuffle(leftovers)
    for key in leftovers[: len(leftovers) // 2]:
        tenant, document, version, profile = key
        world.index(document, version, profile=profile, tenant=tenant)

    embedder = FakeEmbedder(model_name=MODEL)
    queries_ = ["refund invoice", "shipping parcel delivery", "warranty voucher", "account credit receipt"]

    def answers():
        return {
            (tenant, q): [(h.chunk_id, round(h.score, 6)) for h in search(db, embedder, q, tenant_id=tenant, k=8)]
            for tenant in ("acme", "globex")
            for q in queries_
        }

    before, pointers_before = answers(), world.pointers()
    chunks_before = world.chunk_versions()
    running = {
        (t, d, v)
        for t, d, v in world.sql("SELECT tenant_id, document_id, version_number FROM index_task WHERE status = 'RUNNING'")
    }
    window = rng.choice([0.0, HOUR])
    report = apply_retention(db, window_seconds=window, now=later(rng.choice([60, 2 * HOUR])), batch_versions=2)

    assert world.pointers() == pointers_before
    assert_pointed_versions_whole(world)
    assert answers() == before
    after = world.chunk_versions()
    for key, count in chunks_before.items():
        tenant, document, profile, version = key
        if (tenant, document, version) in running or pointers_before.get((tenant, document, profile), (None,))[0] == version:
            assert after.get(key) == count, key
    removed = set(chunks_before) - set(after)
    assert removed == set(report.removed_versions) & set(chunks_before)
    assert report.chunks_deleted == sum(chunks_before[k] for k in removed)


def test_retention_leaves_partition_keys_to_the_lineage_job(world, db):
    """One mechanism prunes Dagster keys (resources/partition_keys.py). Retention deletes chunks and never
    reports or touches a key; the versions it released lose their keys to the lineage job like every other
    version with nothing in flight, and a retried version keeps its key while it may run."""
    world.publish("policy")
    world.index("policy", 1)
    world.publish("policy")
    world.index("policy", 2)
    world.publish("broken")
    world.fail("broken", 1)  # DEAD: never indexed
    world.publish("pending")  # claimed, RUNNING: an open task
    keys = ["acme/policy/v1", "acme/policy/v2", "acme/broken/v1", "acme/pending/v1"]
    record_added(db, keys)  # as the claiming sensor does when it adds them

    report = apply_retention(db, window_seconds=0, now=later(60))
    assert report.removed_versions == [("acme", "policy", PROFILE, 1)]
    assert "partition_keys_to_delete" not in report.to_metadata()
    assert sorted(k for (k,) in world.sql("SELECT partition_key FROM dagster_partition_key")) == sorted(keys)
    assert prunable(db, window_seconds=HOUR, now=later(60)) == []  # inside the lineage window
    assert sorted(prunable(db, window_seconds=0, now=later(60))) == ["acme/broken/v1", "acme/policy/v1",
                                                                     "acme/policy/v2"]

    (task_id,) = world.sql("SELECT task_id FROM index_task WHERE document_id = 'broken'")[0]
    world.queue.retry(task_id)  # open again: its key stays while it may run
    assert "acme/broken/v1" not in prunable(db, window_seconds=0, now=later(60))
    (claimed,) = [t for t in world.queue.claim("w2", limit=5) if t.document_id == "broken"]
    world.queue.fail(claimed.lease, "PARSE_ERROR", "still not a document")
    assert "acme/broken/v1" in prunable(db, window_seconds=0, now=later(60))


def test_migration_0006_backfills_existing_rows(pg_server_url):
    """Rows indexed before 0006: superseded versions are tracked from the pointer's last move, and embed
    digests are filled where the embedded text is known exactly (no heading prefix)."""
    import hashlib

    from psycopg import sql as pgsql

    from resources.migrations import migrate
    from sql import migration_files, queries

    name = "mig_0006_backfill"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    base, _, query = pg_server_url.partition("?")
    url = base.rpartition("/")[0] + f"/{name}" + (f"?{query}" if query else "")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(queries["migration_table_create"])
        for version, body in migration_files():
            if version >= "0006":
                break
            conn.execute(body.encode())
            conn.execute(queries["migration_record"], {"version": version})
        conn.execute("INSERT INTO document (tenant_id, document_id, latest_version) VALUES ('acme', 'policy', 2)")
        for v in (1, 2):
            conn.execute(
                "INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size, "
                "filename, media_type, partition_key) VALUES ('acme', 'policy', %s, %s, 1, 'p.txt', 'text/plain', %s)",
                (v, f"h{v}", f"acme/policy/v{v}"),
            )
            conn.execute(
                "INSERT INTO index_task (tenant_id, document_id, version_number, profile, status, finished_at) "
                "VALUES ('acme', 'policy', %s, 'minilm-v1', 'SUCCEEDED', now())",
                (v,),
            )
            for ordinal, heading in ((0, "{}"), (1, "{Policy}")):
                conn.execute(
                    "INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, "
                    "heading_path, text, token_count, content_digest, embedding) VALUES (%s, 'acme', 'policy', %s, "
                    "'minilm-v1', %s, %s, %s, 3, 'd', array_fill(0.05103::real, ARRAY[384])::vector)",
                    (f"c{v}{ordinal}", v, ordinal, heading, f"text {v} {ordinal}"),
                )
        conn.execute(
            "INSERT INTO search_pointer (tenant_id, document_id, profile, version_number, task_id, chunk_count, "
            "updated_at) SELECT 'acme', 'policy', 'minilm-v1', 2, max(task_id), 2, now() - interval '3 days' "
            "FROM index_task"
        )
    try:
        assert "0006_reuse_retention" in migrate(url)
        with psycopg.connect(url) as conn:
            digests = dict(conn.execute("SELECT chunk_id, embed_digest FROM chunk").fetchall())
            tracked = conn.execute(
                "SELECT s.version_number, s.superseded_at = p.updated_at FROM superseded_version s "
                "JOIN search_pointer p USING (tenant_id, document_id, profile)"
            ).fetchall()
        assert digests == {
            "c10": hashlib.sha256(b"text 1 0").hexdigest(),
            "c11": None,
            "c20": hashlib.sha256(b"text 2 0").hexdigest(),
            "c21": None,
        }
        assert tracked == [(1, True)]
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
