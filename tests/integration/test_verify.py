"""`kbindex verify`: a clean state built through the real Publisher and TaskQueue reports nothing; each
corruption, made with raw SQL the product never runs, is caught by exactly the check meant for it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psycopg
import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.domain.chunking import Chunk, VersionIdentity, chunk_id, content_digest
from pipelines.domain.errors import InvalidRequest
from resources.publisher import Publisher, PublishResult
from resources.task_queue import Lease, TaskQueue
from resources.verifier import CHECKS, VerifyReport, all_check_names, verify
from sql import queries

PROFILE = "minilm-v1"
VECTOR = "[" + ",".join(["0.01"] * 384) + "]"


def sql(db_url: str, statement: str, params: tuple | dict | None = None) -> list[tuple]:
    """Raw SQL for building and corrupting state (tests only; product code runs named queries)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(statement, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def insert_chunk(db_url: str, tenant: str, document: str, version: int, ordinal: int, text: str,
                 chunk_id: str | None = None, profile: str = PROFILE) -> str:
    digest = hashlib.sha256(text.encode()).hexdigest()
    cid = chunk_id or hashlib.sha256(f"{tenant}/{document}/{version}/{profile}/{ordinal}/{digest}".encode()).hexdigest()[:32]
    sql(
        db_url,
        "INSERT INTO chunk (chunk_id, tenant_id, document_id, version_number, profile, ordinal, heading_path, "
        "text, token_count, content_digest, embedding) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::vector)",
        (cid, tenant, document, version, profile, ordinal, ["Policy"], text, len(text.split()), digest, VECTOR),
    )
    # Its lexical (BM25) row, as the publish transaction writes one beside every chunk.
    sql(
        db_url,
        "INSERT INTO lexical_chunk (chunk_id, tenant_id, document_id, profile, version_number, content_digest, "
        "terms, tfs, length) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (cid, tenant, document, profile, version, digest, [1000 + ordinal, 7], [2, 1], 3),
    )
    sql(db_url, queries["lexical_posting_write"], {"chunk_ids": [cid]})
    return cid


def reconcile(db_url: str, tenant: str = "acme", document: str = "refund-policy") -> None:
    """Bring the document's BM25 statistics in line with its pointer, as the publish transaction does."""
    sql(db_url, queries["lexical_stats_reconcile"], {"tenant_id": tenant, "document_ids": [document], "profile": PROFILE})


def publish_version(db_url: str, queue: TaskQueue, lease: Lease, result: PublishResult, texts: list[str]) -> None:
    """What the index sink does, by hand: chunks, pointer, then the fenced complete."""
    for i, text in enumerate(texts):
        insert_chunk(db_url, result.tenant_id, result.document_id, result.version, i, text)
    sql(
        db_url,
        "INSERT INTO search_pointer (tenant_id, document_id, profile, version_number, task_id, chunk_count) "
        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (tenant_id, document_id, profile) DO UPDATE "
        "SET version_number = EXCLUDED.version_number, task_id = EXCLUDED.task_id, chunk_count = EXCLUDED.chunk_count",
        (result.tenant_id, result.document_id, PROFILE, result.version, result.task_id, len(texts)),
    )
    reconcile(db_url, result.tenant_id, result.document_id)
    queue.complete(lease, chunk_count=len(texts))


@dataclass
class State:
    """Task ids of a clean state holding every status."""

    policy_v1: int
    policy_v2: int
    policy_v3: int  # PENDING: published, not claimed yet
    running: int
    dead: int
    cancelled: int
    retry_wait: int


def claim_only(queue: TaskQueue, task_id: int) -> Lease:
    (claimed,) = queue.claim("w1", limit=1)
    assert claimed.lease.task_id == task_id
    return claimed.lease


@pytest.fixture
def queue(db) -> TaskQueue:
    """The database's own clock: the state below takes seconds to build on a loaded machine, and a pinned
    clock (conftest's, one second ahead) would then find the later publishes not yet due."""
    return TaskQueue(db, lease_seconds=30.0)


@pytest.fixture
def state(db_url: str, publisher: Publisher, queue: TaskQueue) -> State:
    """policy v1 and v2 indexed (pointer on v2, v1's chunks retained), v3 PENDING; one task RUNNING,
    DEAD, CANCELLED and RETRY_WAIT each. Each claim takes the one task that is due."""
    v1 = publisher.publish("acme", "refund-policy", b"Refunds within 30 days.", "refund-policy.md")
    publish_version(db_url, queue, claim_only(queue, v1.task_id), v1,
                    ["Refunds within 30 days.", "Keep the receipt.", "Ask the shop."])
    v2 = publisher.publish("acme", "refund-policy", b"Refunds within 60 days.", "refund-policy.md")
    publish_version(db_url, queue, claim_only(queue, v2.task_id), v2,
                    ["Refunds within 60 days.", "Keep the receipt.", "Ask the shop or write."])
    running = publisher.publish("acme", "handbook", b"Leave is 25 days.", "handbook.txt")
    claim_only(queue, running.task_id)
    dead = publisher.publish("acme", "scan", b"%PDF-1.4 no text", "scan.pdf")
    queue.fail(claim_only(queue, dead.task_id), "PARSE_ERROR", "damaged PDF")
    cancelled = publisher.publish("acme", "draft", b"Draft.", "draft.txt")
    queue.cancel(cancelled.task_id)
    retry = publisher.publish("globex", "faq", b"Questions.", "faq.md")
    assert queue.fail(claim_only(queue, retry.task_id), "EMBEDDING_TIMEOUT", "timed out") == "RETRY_WAIT"
    v3 = publisher.publish("acme", "refund-policy", b"Refunds within 90 days.", "refund-policy.md")
    return State(v1.task_id, v2.task_id, v3.task_id, running.task_id, dead.task_id, cancelled.task_id, retry.task_id)


def violated(report: VerifyReport) -> set[str]:
    return {v.check for v in report.violations}


def warned(report: VerifyReport) -> set[str]:
    return {w.check for w in report.warnings}


# --- clean states ---------------------------------------------------------------------------------


def test_empty_database_is_clean(db) -> None:
    report = verify(db)
    assert report.ok and report.violations == [] and report.warnings == []
    assert report.checked == all_check_names(with_retention=False)


def test_clean_state_reports_no_violation_only_the_retained_old_version(db, state: State) -> None:
    report = verify(db)
    assert report.violations == [], report.to_dict()
    assert report.checked == [c.name for c in CHECKS]
    (retained,) = report.warnings
    assert retained.check == "chunk_retained" and retained.count == 1
    assert retained.examples[0]["version_number"] == 1 and retained.examples[0]["pointer_version"] == 2


def sink_chunks(result: PublishResult, texts: list[str], profile: str = PROFILE) -> list[Chunk]:
    """Chunks with the real stable ids, as the chunk step makes them (the sink re-derives and checks them)."""
    identity = VersionIdentity(result.tenant_id, result.document_id, result.version, profile)
    out = []
    for i, text in enumerate(texts):
        digest = content_digest(text)
        out.append(Chunk(chunk_id(identity, i, ("Policy",), digest), i, ("Policy",), None, text, text,
                         len(text.split()), digest))
    return out


def test_state_built_by_the_index_sink_and_retention_verifies_clean(db, db_url: str, publisher: Publisher,
                                                                    queue: TaskQueue) -> None:
    """The real publish transaction, a superseded out-of-order publish and a retention pass leave nothing to report."""
    from resources.index_sink import IndexSink
    from resources.retention import apply_retention

    sink = IndexSink(db, queue)
    rng = np.random.default_rng(0)

    def write(lease: Lease, result: PublishResult, texts: list[str]) -> None:
        sink.publish(lease, sink_chunks(result, texts), rng.standard_normal((len(texts), 384)).astype(np.float32))

    v1 = publisher.publish("acme", "policy", b"one", "policy.md")
    write(claim_only(queue, v1.task_id), v1, ["Refunds within 30 days.", "Keep the receipt."])
    v2 = publisher.publish("acme", "policy", b"two", "policy.md")
    v3 = publisher.publish("acme", "policy", b"three", "policy.md")
    leases = {c.lease.task_id: c.lease for c in queue.claim("w1", limit=2)}
    write(leases[v3.task_id], v3, ["Refunds within 90 days.", "Keep the receipt.", "Ask the shop."])
    write(leases[v2.task_id], v2, ["Refunds within 60 days."])  # superseded: written as nothing
    report = verify(db)
    assert report.ok, report.to_dict()
    assert warned(report) == {"chunk_retained"}
    sql(db_url, "UPDATE superseded_version SET superseded_at = now() - interval '2 hours'")
    assert violated(verify(db, retention_seconds=3600)) == {"chunk_retained_past_window"}
    assert apply_retention(db, window_seconds=3600).chunks_deleted == 2
    report = verify(db, retention_seconds=3600)
    assert report.ok and report.warnings == [], report.to_dict()


# --- one corruption each, caught by exactly its check -----------------------------------------------


def _constraint(db_url: str, table: str, kind: str, like: str) -> str:
    (name,) = sql(
        db_url,
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = %s "
        "AND pg_get_constraintdef(oid) LIKE %s",
        (table, kind, like),
    )[0]
    return name


def dup_ordinal(db_url: str, s: State) -> None:
    name = _constraint(db_url, "chunk", "u", "%ordinal%")
    sql(db_url, f'ALTER TABLE chunk DROP CONSTRAINT "{name}"')
    insert_chunk(db_url, "acme", "refund-policy", 1, 0, "A second text at ordinal 0.")


def dup_content(db_url: str, s: State) -> None:
    insert_chunk(db_url, "acme", "refund-policy", 1, 7, "Keep the receipt.")


def delete_pointed_chunk(db_url: str, s: State) -> None:
    sql(db_url, "DELETE FROM chunk WHERE version_number = 2 AND ordinal = 1")
    reconcile(db_url)


def extra_pointed_chunk(db_url: str, s: State) -> None:
    insert_chunk(db_url, "acme", "refund-policy", 2, 3, "An extra chunk nobody published.")
    reconcile(db_url)


def pointer_count_lies(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE search_pointer SET chunk_count = 99")


def task_count_lies(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE index_task SET chunk_count = 2 WHERE task_id = %s", (s.policy_v2,))


def pointer_to_pending_version(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE search_pointer SET version_number = 3, task_id = %s, chunk_count = 0", (s.policy_v3,))
    reconcile(db_url)


def pointer_moved_by_other_task(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE search_pointer SET task_id = %s", (s.policy_v1,))


def pointed_version_turned_tombstone(db_url: str, s: State) -> None:
    """The served version says the document is deleted, yet its chunks are what search returns."""
    sql(db_url, "UPDATE document_version SET kind = 'tombstone', content_hash = NULL, byte_size = 0"
                " WHERE document_id = 'refund-policy' AND version_number = 2")


def chunks_of_pending_version(db_url: str, s: State) -> None:
    insert_chunk(db_url, "acme", "refund-policy", 3, 0, "Refunds within 90 days.")


def chunks_without_pointer(db_url: str, s: State) -> None:
    insert_chunk(db_url, "acme", "handbook", 1, 0, "Leave is 25 days.")


def backdate_lease(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE index_task SET lease_until = now() - interval '2 minutes' WHERE task_id = %s", (s.running,))


def drop_lease(db_url: str, s: State) -> None:
    name = _constraint(db_url, "index_task", "c", "%lease_owner IS NOT NULL%")
    sql(db_url, f'ALTER TABLE index_task DROP CONSTRAINT "{name}"')
    sql(db_url, "UPDATE index_task SET lease_owner = NULL WHERE task_id = %s", (s.running,))


def retry_wait_without_attempts(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE index_task SET max_attempts = 1 WHERE task_id = %s", (s.retry_wait,))


def attempts_above_max(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE index_task SET attempts = 9 WHERE task_id = %s", (s.policy_v2,))


def dead_without_code(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE index_task SET error_code = NULL WHERE task_id = %s", (s.dead,))


def dead_with_made_up_code(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE index_task SET error_code = 'SOMETHING_WENT_WRONG' WHERE task_id = %s", (s.dead,))


def forged_cancel_event(db_url: str, s: State) -> None:
    sql(db_url, "INSERT INTO task_event (task_id, attempt, from_status, to_status) VALUES (%s, 0, 'PENDING', 'CANCELLED')",
        (s.policy_v3,))


def status_changed_behind_events(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE index_task SET status = 'PENDING' WHERE task_id = %s", (s.cancelled,))


def event_attempt_ahead(db_url: str, s: State) -> None:
    sql(db_url, "INSERT INTO task_event (task_id, kind, attempt, from_status, to_status, stage) "
                "VALUES (%s, 'progress', 99, 'RUNNING', 'RUNNING', 'embed')", (s.running,))


def illegal_event_pair(db_url: str, s: State) -> None:
    sql(db_url, "INSERT INTO task_event (task_id, attempt, from_status, to_status) VALUES (%s, 0, 'PENDING', 'PENDING')",
        (s.policy_v3,))


def broken_event_chain(db_url: str, s: State) -> None:
    sql(db_url, "INSERT INTO task_event (task_id, attempt, from_status, to_status) VALUES (%s, 1, 'RUNNING', 'SUCCEEDED')",
        (s.policy_v2,))


def version_without_task(db_url: str, s: State) -> None:
    sql(db_url, "INSERT INTO document (tenant_id, document_id, latest_version) VALUES ('acme', 'lost', 1)")
    sql(db_url, "INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size, "
                "filename, media_type, partition_key) VALUES ('acme', 'lost', 1, 'x', 1, 'lost.txt', 'text/plain', 'lost')")


def lexical_row_missing(db_url: str, s: State) -> None:
    sql(db_url, "DELETE FROM lexical_chunk WHERE version_number = 1 AND chunk_id IN "
                "(SELECT chunk_id FROM chunk WHERE ordinal = 0)")


def lexical_row_stale(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE lexical_chunk SET content_digest = repeat('0', 64) WHERE version_number = 1")


def lexical_row_of_other_version(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE lexical_chunk SET version_number = 9 WHERE version_number = 1")


def lexical_length_lies(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE lexical_chunk SET length = 99 WHERE version_number = 1")


def lexical_posting_lost(db_url: str, s: State) -> None:
    sql(db_url, "DELETE FROM lexical_posting WHERE term = 7 AND version_number = 1")


def lexical_posting_tf_lies(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE lexical_posting SET tf = 5 WHERE term = 7 AND version_number = 1")


def lexical_df_drifts(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE lexical_term_stats SET df = df + 1 WHERE term = 7")


def lexical_chunk_total_drifts(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE lexical_term_stats SET df = df - 1 WHERE term = -1")


def lexical_bound_tightened(db_url: str, s: State) -> None:
    """A term's kept bound narrowed past its postings (a shorter chunk per occurrence than the shortest)."""
    sql(db_url, "UPDATE lexical_term_stats SET min_length_per_tf = min_length_per_tf * 2 + 1 WHERE term = 7")


def lexical_posting_stray(db_url: str, s: State) -> None:
    """A posting for a term its lexical row does not list: search would score a term the chunk lacks."""
    sql(db_url, "INSERT INTO lexical_posting (chunk_id, term, tenant_id, profile, document_id, version_number, tf, "
                "length) SELECT chunk_id, 424242, tenant_id, profile, document_id, version_number, 1, length "
                "FROM lexical_chunk WHERE version_number = 1 ORDER BY chunk_id LIMIT 1")


def lexical_posting_orphaned(db_url: str, s: State) -> None:
    """A posting of a chunk that has no lexical row (nor chunk) at all."""
    sql(db_url, "INSERT INTO lexical_posting (chunk_id, term, tenant_id, profile, document_id, version_number, tf, "
                "length) VALUES ('no-such-chunk', 7, 'acme', %s, 'refund-policy', 1, 1, 3)", (PROFILE,))


def lexical_terms_rewritten_without_stats(db_url: str, s: State) -> None:
    """Rows rewritten the way publish rewrites them (prune the terms they lose, rewrite, post the new ones),
    but without reconciling the statistics."""
    rows = sql(db_url, "SELECT chunk_id, tenant_id, document_id, profile, version_number FROM lexical_chunk "
                       "WHERE version_number = 2 AND terms[1] = 1000")
    ids = [r[0] for r in rows]
    sql(db_url, queries["lexical_posting_prune"], {
        "chunk_ids": ids, "tenant_ids": [r[1] for r in rows], "document_ids": [r[2] for r in rows],
        "profiles": [r[3] for r in rows], "version_numbers": [r[4] for r in rows], "terms": ["{5,7}"] * len(rows)})
    sql(db_url, "UPDATE lexical_chunk SET terms = '{5,7}' WHERE chunk_id = ANY (%s)", (ids,))
    sql(db_url, queries["lexical_posting_write"], {"chunk_ids": ids})


def pointer_allow_list_widened(db_url: str, s: State) -> None:
    """A pointer that lets the whole tenant read a version published for group:hr only."""
    sql(db_url, "UPDATE document_version SET allow_principals = '{group:hr}' WHERE version_number = 2")


def pointer_metadata_stale(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE search_pointer SET metadata = '{\"dept\": \"hr\"}'")


def two_active_profiles(db_url: str, s: State) -> None:
    sql(db_url, "DROP INDEX index_profile_one_active")
    sql(db_url, "INSERT INTO index_profile (name, model, dimension, chunk_tokens, chunk_overlap, is_active) "
                "VALUES ('shadow', 'other-model', 384, 128, 16, true)")


def no_active_profile(db_url: str, s: State) -> None:
    sql(db_url, "UPDATE index_profile SET is_active = false")


CORRUPTIONS: list[tuple[Callable[[str, State], None], str]] = [
    (dup_ordinal, "chunk_duplicate_ordinal"),
    (delete_pointed_chunk, "search_pointer_chunk_count"),
    (extra_pointed_chunk, "search_pointer_chunk_count"),
    (pointer_count_lies, "search_pointer_chunk_count"),
    (task_count_lies, "search_pointer_chunk_count"),
    (pointer_to_pending_version, "search_pointer_unsucceeded"),
    (pointer_moved_by_other_task, "search_pointer_unsucceeded"),
    (pointed_version_turned_tombstone, "search_pointer_tombstone_chunks"),
    (pointer_allow_list_widened, "search_pointer_scope_mismatch"),
    (pointer_metadata_stale, "search_pointer_scope_mismatch"),
    (chunks_of_pending_version, "chunk_unpointed"),
    (chunks_without_pointer, "chunk_unpointed"),
    (backdate_lease, "index_task_lease_stale"),
    (drop_lease, "index_task_running_without_lease"),
    (retry_wait_without_attempts, "index_task_attempts_exhausted"),
    (attempts_above_max, "index_task_attempts_exhausted"),
    (dead_without_code, "index_task_dead_without_code"),
    (dead_with_made_up_code, "index_task_dead_without_code"),
    (forged_cancel_event, "task_event_status_mismatch"),
    (status_changed_behind_events, "task_event_status_mismatch"),
    (event_attempt_ahead, "task_event_attempt_ahead"),
    (illegal_event_pair, "task_event_illegal_transition"),
    (broken_event_chain, "task_event_chain_broken"),
    (version_without_task, "document_version_without_task"),
    (two_active_profiles, "index_profile_active_count"),
    (no_active_profile, "index_profile_active_count"),
    (lexical_row_missing, "lexical_index_mismatch"),
    (lexical_row_stale, "lexical_index_mismatch"),
    (lexical_row_of_other_version, "lexical_index_mismatch"),
    (lexical_length_lies, "lexical_index_mismatch"),
    (lexical_posting_lost, "lexical_index_mismatch"),
    (lexical_posting_tf_lies, "lexical_index_mismatch"),
    (lexical_posting_stray, "lexical_index_mismatch"),
    (lexical_posting_orphaned, "lexical_index_mismatch"),
    (lexical_df_drifts, "lexical_stats_mismatch"),
    (lexical_chunk_total_drifts, "lexical_stats_mismatch"),
    (lexical_terms_rewritten_without_stats, "lexical_stats_mismatch"),
    (lexical_bound_tightened, "lexical_bounds_short"),
]


def test_every_violation_check_has_a_corruption() -> None:
    covered = {check for _, check in CORRUPTIONS}
    assert covered == {c.name for c in CHECKS if c.severity == "violation"}


@pytest.mark.parametrize(("corrupt", "check"), CORRUPTIONS, ids=[f.__name__ for f, _ in CORRUPTIONS])
def test_corruption_is_caught_by_exactly_its_check(db, db_url: str, state: State, corrupt, check: str) -> None:
    corrupt(db_url, state)
    report = verify(db)
    assert violated(report) == {check}, report.to_dict()
    (found,) = report.violations
    assert found.count >= 1 and 1 <= len(found.examples) <= found.count


def test_repeated_content_in_one_version_is_a_warning(db, db_url: str, state: State) -> None:
    dup_content(db_url, state)
    report = verify(db)
    assert report.ok, report.to_dict()
    assert warned(report) == {"chunk_duplicate_content", "chunk_retained"}
    (dup,) = [w for w in report.warnings if w.check == "chunk_duplicate_content"]
    assert dup.examples[0]["ordinals"] == [1, 7]


def test_lease_expired_within_one_claim_interval_is_not_stuck(db, db_url: str, state: State) -> None:
    sql(db_url, "UPDATE index_task SET lease_until = now() - interval '10 seconds' WHERE task_id = %s", (state.running,))
    assert verify(db).ok
    assert violated(verify(db, claim_interval=5)) == {"index_task_lease_stale"}


def test_retention_window_turns_old_retained_chunks_into_a_violation(db, db_url: str, state: State) -> None:
    assert verify(db, retention_seconds=7 * 86400).ok  # the pointer moved just now
    sql(db_url, "UPDATE superseded_version SET superseded_at = now() - interval '10 days'")
    assert verify(db).ok  # no window: retained chunks only warn
    report = verify(db, retention_seconds=7 * 86400)
    assert violated(report) == {"chunk_retained_past_window"}
    assert report.checked[-1] == "chunk_retained_past_window"


def test_count_covers_all_rows_examples_are_limited(db, db_url: str, state: State) -> None:
    for i in range(6):
        insert_chunk(db_url, "acme", f"stray-{i}", 1, 0, f"stray {i}")
    report = verify(db, examples=2)
    (stray,) = [v for v in report.violations if v.check == "chunk_unpointed"]
    assert stray.count == 6 and len(stray.examples) == 2


def test_publish_refused_for_no_active_profile_leaves_no_version(db, db_url: str, publisher: Publisher) -> None:
    sql(db_url, "UPDATE index_profile SET is_active = false")
    with pytest.raises(InvalidRequest):
        publisher.publish("acme", "orphan", b"text", "orphan.txt")
    assert "document_version_without_task" not in violated(verify(db))


# --- the CLI --------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_exits_0_on_a_clean_database(db_url: str, state: State) -> None:
    result = runner.invoke(app, ["verify"], env={"KBINDEX_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.output
    assert "no violations" in result.output and "chunk_retained" in result.output


def test_cli_exits_1_and_reports_each_violation(db_url: str, state: State) -> None:
    backdate_lease(db_url, state)
    delete_pointed_chunk(db_url, state)
    result = runner.invoke(app, ["verify", "--json"], env={"KBINDEX_DATABASE_URL": db_url})
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert {v["check"] for v in report["violations"]} == {"index_task_lease_stale", "search_pointer_chunk_count"}
    (stale,) = [v for v in report["violations"] if v["check"] == "index_task_lease_stale"]
    assert stale["examples"][0]["task_id"] == state.running


def test_cli_claim_interval_option(db_url: str, state: State) -> None:
    sql(db_url, "UPDATE index_task SET lease_until = now() - interval '10 seconds' WHERE task_id = %s", (state.running,))
    env = {"KBINDEX_DATABASE_URL": db_url}
    assert runner.invoke(app, ["verify"], env=env).exit_code == 0
    result = runner.invoke(app, ["verify", "--claim-interval", "2"], env=env)
    assert result.exit_code == 1 and "index_task_lease_stale" in result.output
    assert runner.invoke(app, ["verify", "--claim-interval", "-1"], env=env).exit_code == 2
