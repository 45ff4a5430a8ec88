"""One sync pass over a local folder (resources/source_sync.py): new and changed files are published,
unchanged ones are not read, vanished ones are deleted by tombstone within the safety share, and a pass
killed at a publish repeats nothing and leaves no document its ledger does not name."""

from __future__ import annotations

import os

import psycopg
import pytest

from bench.source_sync import count_opens
from pipelines.domain.errors import SourceOverlap
from resources.blob_store import BlobStore
import resources.publisher as publisher_module
from resources.publisher import Publisher
from resources.source_sync import SourceSync


def versions(db_url: str) -> dict[str, list[str]]:
    """document -> kinds of its versions, in order."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT document_id, kind FROM document_version ORDER BY document_id, version_number").fetchall()
    out: dict[str, list[str]] = {}
    for doc, kind in rows:
        out.setdefault(doc, []).append(kind)
    return out


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "share"
    (root / "policies").mkdir(parents=True)
    for i in range(10):
        (root / "policies" / f"p{i}.md").write_text(f"# Policy {i}\n\nRule {i}.\n")
    (root / ".hidden").write_text("not a document")
    return root


@pytest.fixture
def sources(db, publisher) -> SourceSync:
    return SourceSync(db, publisher)


def test_first_pass_publishes_then_nothing_is_read(sources, folder, db_url):
    sources.add("share", "acme", str(folder))
    first = sources.sync("share")
    assert (first.listed, first.read, first.published, first.deleted) == (10, 10, 10, 0), first
    assert sorted(versions(db_url)) == [f"policies/p{i}.md" for i in range(10)]
    second = sources.sync("share")
    assert (second.listed, second.unchanged, second.read, second.published) == (10, 10, 0, 0), second
    assert sources.get("share").last_pass["unchanged"] == 10 and sources.get("share").passes == 2


def test_a_first_pass_publishes_in_one_transaction_and_a_pass_killed_inside_it_publishes_nothing(
        sources, folder, db_url, monkeypatch):
    """The pass's files go in publish_many batches: all ten commit together (one writing transaction), so the
    claiming sensor sees them due at once; killed before that commit, nothing of the batch is left, not even a
    ledger row, and the next pass publishes each file once."""
    sources.add("share", "acme", str(folder))
    real_record, recorded = sources._record, []

    def record(db, row):
        real_record(db, row)
        recorded.append(row["path"])
        if len(recorded) == 7:
            raise RuntimeError("killed before the commit")

    monkeypatch.setattr(sources, "_record", record)
    with pytest.raises(RuntimeError):
        sources.sync("share")
    monkeypatch.undo()
    assert versions(db_url) == {}
    again = sources.sync("share")
    assert (again.read, again.published) == (10, 10), again
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(DISTINCT xmin::text) FROM document_version").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM source_file WHERE content_hash IS NOT NULL").fetchone()[0] == 10
    assert all(kinds == ["content"] for kinds in versions(db_url).values()) and len(versions(db_url)) == 10


def test_a_refused_file_in_a_batch_is_recorded_and_the_others_publish(db, tmp_path, folder, db_url):
    """A versions quota of 7: the batch's first seven (in listing order) publish, the other three are recorded
    with QUOTA_EXCEEDED and left alone by the next pass."""
    sources = SourceSync(db, Publisher(db, BlobStore(str(tmp_path / "blobs")), quota_versions=7))
    sources.add("share", "acme", str(folder))
    first = sources.sync("share")
    assert (first.read, first.published) == (10, 7), first
    assert len(versions(db_url)) == 7
    with psycopg.connect(db_url) as conn:
        failed = conn.execute("SELECT count(*) FROM source_file WHERE error_code = 'QUOTA_EXCEEDED'").fetchone()[0]
    assert failed == 3
    assert sources.sync("share").read == 0


def test_changed_bytes_publish_a_version_and_a_new_stamp_alone_does_not(sources, folder, db_url):
    sources.add("share", "acme", str(folder))
    sources.sync("share")
    (folder / "policies" / "p1.md").write_text("# Policy 1\n\nRule 1, amended.\n")
    st = os.stat(folder / "policies" / "p2.md")
    os.utime(folder / "policies" / "p2.md", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touched only
    counts = sources.sync("share")
    assert (counts.read, counts.published, counts.same_bytes, counts.unchanged) == (2, 1, 1, 8), counts
    assert versions(db_url)["policies/p1.md"] == ["content", "content"]
    assert versions(db_url)["policies/p2.md"] == ["content"]
    assert sources.sync("share").read == 0  # the new stamp is in the ledger


def test_vanished_files_are_deleted_within_the_share_and_come_back(sources, folder, db_url):
    sources.add("share", "acme", str(folder))
    sources.sync("share")
    (folder / "policies" / "p0.md").unlink()
    (folder / "policies" / "p9.md").unlink()
    counts = sources.sync("share")
    assert (counts.vanished, counts.deleted, counts.deletes_blocked) == (2, 2, None), counts
    assert versions(db_url)["policies/p0.md"] == ["content", "tombstone"]
    assert sources.sync("share").deleted == 0  # forgotten after the delete
    (folder / "policies" / "p0.md").write_text("back again")
    assert sources.sync("share").published == 1
    assert versions(db_url)["policies/p0.md"] == ["content", "tombstone", "content"]


def test_an_empty_or_unlistable_source_deletes_nothing_until_allowed(sources, folder, db_url):
    sources.add("share", "acme", str(folder))
    sources.sync("share")
    for f in (folder / "policies").iterdir():
        f.unlink()
    empty = sources.sync("share")
    assert (empty.listed, empty.vanished, empty.deleted) == (0, 10, 0) and "listing is empty" in empty.deletes_blocked
    assert "deleted nothing" in empty.summary()
    (folder / "policies").rmdir()
    folder.rename(folder.with_name("moved"))
    gone = sources.sync("share")
    assert gone.deleted == 0 and gone.list_error and "listing failed" in gone.deletes_blocked, gone
    folder.with_name("moved").rename(folder)
    (folder / "policies").mkdir()
    (folder / "policies" / "p0.md").write_text("# Policy 0\n\nRule 0.\n")
    share = sources.sync("share")  # 9 of 10 vanished: more than 20%
    assert share.deleted == 0 and "9 of 10 files vanished (90%)" in share.deletes_blocked
    allowed = sources.sync("share", allow_mass_delete=True)
    assert allowed.deleted == 9
    assert all(kinds[-1] == "tombstone" for doc, kinds in versions(db_url).items() if doc != "policies/p0.md")


def killed_at_third_publish(sources, folder, monkeypatch, *, committed: bool) -> None:
    """A first pass killed at its third publish, one file a transaction: inside its transaction (``committed``
    False: after the version and the ledger row were written, before the commit) or just after it committed."""
    sources.add("share", "acme", str(folder))
    monkeypatch.setattr(publisher_module, "BATCH_DOCUMENTS", 1)
    real_publish, real_record = sources.publisher.publish_many, sources._record
    published = []

    def record(db, row):
        real_record(db, row)
        if not committed and len(published) == 2:
            raise RuntimeError("killed before the commit")

    def publish_many(*args, **kwargs):
        results = real_publish(*args, **kwargs)
        published.extend(r.document_id for r in results)
        if committed and len(published) == 3:
            raise RuntimeError("killed after the commit")
        return results

    monkeypatch.setattr(sources, "_record", record)
    monkeypatch.setattr(sources.publisher, "publish_many", publish_many)
    with pytest.raises(RuntimeError):
        sources.sync("share")
    monkeypatch.undo()


@pytest.mark.parametrize("committed", [False, True], ids=["in-the-publish", "after-the-commit"])
def test_a_pass_killed_at_a_publish_repeats_nothing(sources, folder, db_url, committed, monkeypatch):
    killed_at_third_publish(sources, folder, monkeypatch, committed=committed)
    done = 3 if committed else 2
    assert len(versions(db_url)) == done  # the version and its ledger row commit together or not at all
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM source_file").fetchone()[0] == done
    again = sources.sync("share")
    assert (again.read, again.published, again.same_bytes) == (10 - done, 10 - done, 0), again
    assert all(kinds == ["content"] for kinds in versions(db_url).values()) and len(versions(db_url)) == 10
    assert sources.sync("share").read == 0


@pytest.mark.parametrize("committed", [False, True], ids=["in-the-publish", "after-the-commit"])
def test_a_file_removed_after_a_pass_killed_at_its_publish_is_deleted_or_never_published(
        sources, folder, db_url, committed, monkeypatch):
    """Found by test_chaos_migration_small (a fresh-clone .ci/run, 1 of 2 runs): the ledger row used to be written
    after the publish committed, so a pass killed in between left a document no row named, and removing its file
    then deleted nothing. Now the row commits with the version."""
    killed_at_third_publish(sources, folder, monkeypatch, committed=committed)
    for path in folder.glob("policies/*.md"):
        path.unlink()  # every file removed before any later pass saw them
    (folder / "policies" / "kept.md").write_text("# Kept\n\nThe listing is not empty.\n")
    gone = sources.sync("share", allow_mass_delete=True)
    assert gone.deleted == (3 if committed else 2), gone
    assert {doc: kinds[-1] for doc, kinds in versions(db_url).items()} == {
        **{doc: "tombstone" for doc in versions(db_url) if doc != "policies/kept.md"}, "policies/kept.md": "content"}


def test_one_pass_per_source_at_a_time(sources, folder, db_url):
    sources.add("share", "acme", str(folder))
    with psycopg.connect(db_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtextextended('kbindex.source:' || 'share', 0))")
        assert sources.sync("share").skipped == "another pass of this source is running"
        # Released here, not by the close: a closed connection's backend may hold the lock a moment longer
        # (a fresh-clone run skipped the next pass once).
        other.execute("SELECT pg_advisory_unlock(hashtextextended('kbindex.source:' || 'share', 0))")
    assert sources.sync("share").published == 10


def test_add_refuses_a_second_name_and_remove_keeps_the_documents(sources, folder, db_url):
    sources.add("share", "acme", str(folder), glob="**/p1.md")
    with pytest.raises(Exception, match="exists"):
        sources.add("share", "acme", str(folder))
    assert sources.sync("share").published == 1
    assert sources.remove("share") and not sources.remove("share")
    assert list(versions(db_url)) == ["policies/p1.md"]


def test_a_pass_out_of_time_stops_reading_and_the_next_goes_on(sources, folder, db_url):
    sources.add("share", "acme", str(folder))
    cut = sources.sync("share", budget_seconds=0.0)  # the sensor's tick budget, spent at once
    assert (cut.partial, cut.read, cut.published) == (True, 0, 0) and "partial" in cut.summary(), cut
    rest = sources.sync("share")
    assert (rest.partial, rest.read, rest.published) == (False, 10, 10), rest


def _latest(db_url: str, document_id: str) -> tuple[str, str | None]:
    """(kind, content hash) of the document's latest version."""
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT kind, content_hash FROM document_version WHERE document_id = %s"
                            " ORDER BY version_number DESC LIMIT 1", [document_id]).fetchone()


def test_two_sources_of_a_tenant_cannot_name_the_same_documents(sources, folder, tmp_path, db_url):
    """Same relative paths in two folders: without a check, the second source's p1.md overwrote the first's
    document and its vanishing deleted it. `source add` refuses the overlap; a prefix keeps them apart."""
    other = tmp_path / "other"
    (other / "policies").mkdir(parents=True)
    for i in range(10):
        (other / "policies" / f"p{i}.md").write_text(f"# Other policy {i}\n")
    sources.add("share", "acme", str(folder))
    with pytest.raises(SourceOverlap) as refused:
        sources.add("other", "acme", str(other))
    assert refused.value.code == "SOURCE_OVERLAP" and "--prefix" in refused.value.message
    with pytest.raises(SourceOverlap):
        sources.add("other", "acme", str(other), glob="policies/*.md")  # a narrower glob still meets "**"
    assert [s.name for s in sources.list()] == ["share"]  # nothing registered by a refusal
    sources.add("elsewhere", "globex", str(other))  # another tenant: other documents, no overlap
    added = sources.add("other", "acme", str(other), id_prefix="other/")
    assert added.id_prefix == "other/"

    assert sources.sync("share").published == 10 and sources.sync("other").published == 10
    assert _latest(db_url, "policies/p1.md")[0] == "content"
    prefixed = sorted(d for d in versions(db_url) if d.startswith("other/"))
    assert prefixed == [f"other/policies/p{i}.md" for i in range(10)]
    (other / "policies" / "p1.md").unlink()
    assert sources.sync("other").deleted == 1
    assert versions(db_url)["other/policies/p1.md"] == ["content", "tombstone"]
    assert versions(db_url)["policies/p1.md"] == ["content"]  # the first source's document is untouched


def test_overlapping_sources_from_before_the_check_neither_overwrite_nor_delete(sources, folder, tmp_path, db_url):
    """Sources registered before `source add` refused overlaps: a pass does not publish over a document another
    source's ledger names, and a vanished file whose document another source still names is only let go."""
    other = tmp_path / "other"
    (other / "policies").mkdir(parents=True)
    (other / "policies" / "p1.md").write_text("# Another p1\n")
    sources.add("share", "acme", str(folder))
    assert sources.sync("share").published == 10
    with psycopg.connect(db_url) as conn:  # what an older kbindex let anyone register
        conn.execute("INSERT INTO source (name, tenant_id, url) VALUES ('old', 'acme', %s)", [str(other)])
    before = _latest(db_url, "policies/p1.md")
    counts = sources.sync("old")
    assert (counts.published, counts.failed) == (0, 1) and "SOURCE_OVERLAP" in counts.errors[0], counts
    assert _latest(db_url, "policies/p1.md") == before

    assert sources.sync("old").failing == 1  # recorded with its code: not tried again until it changes
    with psycopg.connect(db_url) as conn:  # both ledgers name p1.md, as a pass before the fix left them
        conn.execute("UPDATE source_file SET content_hash = 'y', error_code = NULL WHERE source_name = 'old'")
    (other / "policies" / "p1.md").unlink()
    gone = sources.sync("old", allow_mass_delete=True)
    assert (gone.vanished, gone.deleted) == (1, 0) and "SOURCE_OVERLAP" in gone.errors[0], gone
    assert versions(db_url)["policies/p1.md"] == ["content"]  # still the first source's, not a tombstone
    assert sources.sync("old").vanished == 0  # let go: the old source's ledger no longer names it


def _rewrite_keeping_size_and_mtime(path, text: str) -> None:
    """What a copy tool that restores mtimes does (or a rewrite within the stamp's resolution)."""
    st = os.stat(path)
    assert len(text.encode()) == st.st_size
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_rehash_finds_a_change_that_kept_size_and_stamp(sources, folder, db_url):
    sources.add("share", "acme", str(folder))
    sources.sync("share")
    _rewrite_keeping_size_and_mtime(folder / "policies" / "p3.md", "# Policy 3\n\nRule X.\n")
    with count_opens(folder) as opened:
        normal = sources.sync("share")
    assert (normal.read, normal.published, normal.unchanged, opened) == (0, 0, 10, []), normal  # still no bytes read
    assert versions(db_url)["policies/p3.md"] == ["content"]  # the gap --rehash closes

    rehashed = sources.sync("share", rehash=True)
    assert (rehashed.read, rehashed.rehashed, rehashed.rehash_changed, rehashed.published, rehashed.unchanged) == \
        (10, 10, 1, 1, 0), rehashed
    assert "rehashed 10 (1 changed under the same size and stamp)" in rehashed.summary()
    assert versions(db_url)["policies/p3.md"] == ["content", "content"]
    with count_opens(folder) as opened:
        after = sources.sync("share")
    assert (after.read, after.rehashed, opened) == (0, 0, []), after


def test_a_rehash_slice_per_pass_covers_the_source_in_turn(sources, folder, db_url):
    sources.add("share", "acme", str(folder))
    sources.sync("share")
    _rewrite_keeping_size_and_mtime(folder / "policies" / "p9.md", "# Policy 9\n\nRule Z.\n")
    read: list[str] = []
    found = []
    for _ in range(3):  # 10 files, 4 per pass: every file within 3 passes
        with count_opens(folder) as opened:
            counts = sources.sync("share", rehash_slice=4)
        read += [os.path.basename(p) for p in opened]
        assert (counts.rehashed, counts.unchanged, counts.read) == (4, 6, 4), counts
        found.append(counts.rehash_changed)
    assert sorted(set(read)) == sorted(f"p{i}.md" for i in range(10))  # the oldest-hashed first: all of them
    assert sum(found) == 1 and versions(db_url)["policies/p9.md"] == ["content", "content"]


def test_a_failing_file_is_recorded_and_not_tried_again_until_it_changes(db, folder, tmp_path, db_url, monkeypatch):
    """A file that fails every pass was read (and parsed, and refused) on every pass, its failure only in the
    summary. The ledger records it with its code; passes leave it alone until its size or stamp moves."""
    from fsspec.implementations.local import LocalFileSystem

    sources = SourceSync(db, Publisher(db, BlobStore(str(tmp_path / "blobs")), max_bytes=200))
    (folder / "big.md").write_bytes(b"x" * 201)
    locked = folder / "locked.md"
    locked.write_text("# Locked\n")
    real_cat = LocalFileSystem.cat_file
    attempts: list[str] = []

    def cat_file(self, path, *args, **kwargs):
        if str(path).endswith("locked.md"):
            attempts.append(str(path))
            raise PermissionError(13, "Permission denied")
        return real_cat(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "cat_file", cat_file)
    sources.add("share", "acme", str(folder))
    first = sources.sync("share")
    assert (first.published, first.failed) == (10, 2), first
    assert sorted(first.errors) == ["big.md: DOCUMENT_TOO_LARGE", "locked.md: SOURCE_FILE_UNREADABLE (PermissionError)"]
    source = sources.get("share")
    assert (source.files, source.failing, source.failing_codes) == (12, 2, {"DOCUMENT_TOO_LARGE": 1,
                                                                            "SOURCE_FILE_UNREADABLE": 1})

    with count_opens(folder) as opened:
        second = sources.sync("share")
    assert (second.read, second.failed, second.failing, second.unchanged) == (0, 0, 2, 10), second
    assert opened == [] and len(attempts) == 1  # neither failing file was tried again
    assert "still failing 2" in second.summary()

    st = os.stat(locked)
    os.utime(locked, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # its stamp moved: tried again
    assert (sources.sync("share").failed, len(attempts)) == (1, 2)
    monkeypatch.setattr(LocalFileSystem, "cat_file", real_cat)  # permissions fixed, the file untouched
    untouched = sources.sync("share")
    assert (untouched.failing, untouched.read) == (2, 0), untouched  # its stamp did not move: still left alone
    retried = sources.sync("share", retry_failed=True)
    assert (retried.read, retried.published, retried.failed, retried.failing) == (1, 1, 1, 0), retried
    assert sources.get("share").failing_codes == {"DOCUMENT_TOO_LARGE": 1}

    # A file that published, then fails: its document keeps the version it had, and the ledger the hash.
    p0 = folder / "policies" / "p0.md"
    original = p0.read_bytes()
    p0.write_bytes(b"y" * 300)
    assert sources.sync("share").errors == ["policies/p0.md: DOCUMENT_TOO_LARGE"]
    assert versions(db_url)["policies/p0.md"] == ["content"] and sources.get("share").failing == 2
    p0.write_bytes(original)  # back to the bytes it published: no new version, no longer failing
    back = sources.sync("share")
    assert (back.read, back.same_bytes, back.published) == (1, 1, 0), back
    assert versions(db_url)["policies/p0.md"] == ["content"] and sources.get("share").failing == 1

    (folder / "big.md").unlink()  # it never published anything: its row goes, no document is deleted
    gone = sources.sync("share")
    assert (gone.vanished, gone.deleted, gone.failed) == (0, 0, 0) and "big.md" not in versions(db_url), gone
    assert (sources.get("share").failing, sources.get("share").files) == (0, 11)


def test_a_pass_whose_lock_connection_dies_stops_and_another_pass_can_run(sources, folder, db_url, monkeypatch):
    """The pass lock is a session lock: when its connection ends mid-pass (a restart, a terminated backend) the
    lock is gone, so the pass stops at its next file (partial, with the reason) instead of running beside a new
    one, and its release on the dead connection is not an error (found by bench/chaos's PostgreSQL restart)."""
    import resources.source_sync as source_sync

    monkeypatch.setattr(source_sync._PassLock, "CHECK_SECONDS", 0.0)
    sources.add("share", "acme", str(folder))
    real_one_file = SourceSync._one_file
    seen = []

    def one_file(self, *args, **kwargs):
        if not seen:  # the first file: end the session that holds the pass lock
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted")
        seen.append(args[3].path)
        return real_one_file(self, *args, **kwargs)

    monkeypatch.setattr(SourceSync, "_one_file", one_file)
    stopped = sources.sync("share")
    assert stopped.partial and len(seen) == 1, stopped
    assert any("pass lock" in e for e in stopped.errors), stopped.errors
    monkeypatch.undo()
    following = sources.sync("share")  # the lock is free: the next pass finishes the job
    assert following.skipped is None and not following.partial
    assert len(versions(db_url)) == 10
