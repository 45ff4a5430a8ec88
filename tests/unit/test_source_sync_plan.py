"""The sync planner (pipelines/domain/source_sync.py): what a pass reads, and when it deletes nothing."""

from __future__ import annotations

import pytest

from pipelines.domain.source_sync import (
    LedgerEntry,
    Listed,
    glob_matches,
    glob_head,
    is_hidden,
    needs_publish,
    plan_pass,
    sources_collide,
)


def ledger(n: int, prefix: str = "f") -> list[LedgerEntry]:
    return [LedgerEntry(f"{prefix}{i}.md", f"{prefix}{i}.md", 10, "t1", f"h{i}") for i in range(n)]


def listing(entries: list[LedgerEntry]) -> list[Listed]:
    return [Listed(e.path, e.size, e.stamp) for e in entries]


def test_unchanged_files_are_not_read():
    known = ledger(100)
    plan = plan_pass(listing(known), known)
    assert (plan.to_read, plan.unchanged, plan.vanished, plan.delete_blocked) == ([], 100, [], None)


def test_new_and_changed_by_size_or_stamp_are_read():
    known = ledger(10)
    seen = listing(known)
    seen[0] = Listed(seen[0].path, 11, "t1")  # size moved
    seen[1] = Listed(seen[1].path, 10, "t2")  # stamp (mtime/ETag) moved
    seen.append(Listed("new.md", 3, "t9"))
    plan = plan_pass(seen, known)
    assert sorted(x.path for x in plan.to_read) == ["f0.md", "f1.md", "new.md"]
    assert (plan.new, plan.restamped, plan.unchanged) == (1, 2, 8)


def test_a_changed_stamp_with_unchanged_bytes_is_not_published():
    entry = ledger(1)[0]
    assert not needs_publish(entry, entry.content_hash)
    assert needs_publish(entry, "other")
    assert needs_publish(None, "anything")


def test_vanished_within_the_safety_share_are_deleted():
    known = ledger(10)
    plan = plan_pass(listing(known[2:]), known)  # 2 of 10 = 20%: not more than the share
    assert [e.path for e in plan.to_delete] == ["f0.md", "f1.md"] and plan.delete_blocked is None


def test_more_than_the_safety_share_deletes_nothing_and_says_why():
    known = ledger(10)
    plan = plan_pass(listing(known[3:]), known)
    assert len(plan.vanished) == 3 and plan.to_delete == []
    assert "3 of 10 files vanished (30%)" in plan.delete_blocked and "--allow-mass-delete" in plan.delete_blocked
    assert len(plan_pass(listing(known[3:]), known, max_delete_share=0.5).to_delete) == 3
    assert len(plan_pass(listing(known[3:]), known, allow_mass_delete=True).to_delete) == 3


def test_an_empty_listing_deletes_nothing():
    known = ledger(50)
    plan = plan_pass([], known, max_delete_share=1.0)
    assert plan.to_delete == [] and "listing is empty" in plan.delete_blocked
    assert len(plan_pass([], known, allow_mass_delete=True).to_delete) == 50


def test_a_failed_listing_deletes_nothing_and_reads_nothing():
    plan = plan_pass(None, ledger(5), allow_mass_delete=True, list_error="bucket not found")
    assert plan.to_read == [] and plan.to_delete == [] and "bucket not found" in plan.delete_blocked


@pytest.mark.parametrize(("path", "pattern", "expected"), [
    ("a.md", "**", True), ("x/y/a.md", "**", True), ("a.md", "**/*.md", True), ("x/y/a.md", "**/*.md", True),
    ("x/a.txt", "**/*.md", False), ("x/a.md", "*.md", False), ("a.md", "*.md", True),
    ("docs/a.md", "docs/**", True), ("other/a.md", "docs/**", False), ("a1.md", "a?.md", True),
])
def test_glob(path, pattern, expected):
    assert glob_matches(path, pattern) is expected


def test_hidden_files_and_folders():
    assert is_hidden(".DS_Store") and is_hidden(".git/config") and not is_hidden("a/b.md")


@pytest.mark.parametrize(("glob", "head"), [
    ("**", ""), ("policies/**", "policies/"), ("docs/p?.md", "docs/p"), ("**/*.md", ""), ("a.md", "a.md"),
])
def test_glob_head_is_what_every_match_starts_with(glob, head):
    assert glob_head(glob) == head


@pytest.mark.parametrize(("a", "b", "collide"), [
    (("", "**"), ("", "**"), True),  # two folders with the same layout: the collision of issue 29's follow-up
    (("", "**"), ("", "policies/*.md"), True),  # a narrower glob inside the other's
    (("", "**/*.md"), ("", "**/*.txt"), True),  # disjoint endings, but the check only reads literal heads
    (("", "policies/**"), ("", "handbook/**"), False),  # disjoint folders of one layout
    (("", "**"), ("hr/", "**"), False),  # a prefix beside a wildcard glob: left to each pass, per file
    (("hr/", "**"), ("it/", "**"), False),
    (("hr/", "**"), ("hr/", "**"), True),
    (("", "hr/**"), ("hr/", "**"), True),  # the first source's files all have ids under hr/
    (("", "it/**"), ("hr/", "**"), False),
    (("hr", "x/**"), ("hr2/", "**"), False),  # "hr" + "x/..." never starts "hr2/"
])
def test_sources_collide(a, b, collide):
    assert sources_collide(a, b) is collide and sources_collide(b, a) is collide


def test_without_rehash_a_change_that_kept_size_and_stamp_is_not_read():
    known = ledger(10)
    plan = plan_pass(listing(known), known)
    assert (plan.to_read, plan.to_rehash, plan.unchanged) == ([], [], 10)


def test_rehash_all_reads_every_unchanged_file():
    known = ledger(10)
    seen = listing(known)
    seen.append(Listed("new.md", 1, "t"))
    plan = plan_pass(seen, known, rehash_all=True)
    assert [x.path for x in plan.to_read] == ["new.md"]
    assert sorted(x.path for x in plan.to_rehash) == sorted(e.path for e in known) and plan.unchanged == 0


def test_a_rehash_slice_takes_the_files_hashed_longest_ago():
    known = [LedgerEntry(f"f{i}.md", f"f{i}.md", 10, "t1", f"h{i}", hashed_pass=pass_no)
             for i, pass_no in enumerate([5, 1, 3, 1, 9])]
    plan = plan_pass(listing(known), known, rehash_slice=3)
    assert [x.path for x in plan.to_rehash] == ["f1.md", "f3.md", "f2.md"] and plan.unchanged == 2
    assert len(plan_pass(listing(known), known, rehash_slice=50).to_rehash) == 5


def test_a_file_that_failed_is_left_alone_until_it_changes():
    known = ledger(3) + [LedgerEntry("bad.md", "bad.md", 10, "t1", None, error_code="DOCUMENT_TOO_LARGE"),
                         LedgerEntry("was-ok.md", "was-ok.md", 10, "t1", "h", error_code="QUOTA_EXCEEDED")]
    plan = plan_pass(listing(known), known)
    assert (plan.to_read, plan.failing, plan.unchanged) == ([], 2, 3)
    moved = listing(known)
    moved[3] = Listed("bad.md", 10, "t2")
    plan = plan_pass(moved, known)
    assert [x.path for x in plan.to_read] == ["bad.md"] and plan.failing == 1
    retried = plan_pass(listing(known), known, retry_failed=True)
    assert sorted(x.path for x in retried.to_read) == ["bad.md", "was-ok.md"] and retried.failing == 0
    assert len(plan_pass(listing(known), known, rehash_all=True).to_rehash) == 5


def test_a_vanished_file_that_never_published_is_forgotten_not_deleted():
    known = ledger(4) + [LedgerEntry("bad.md", "bad.md", 10, "t1", None, error_code="DOCUMENT_TOO_LARGE")]
    plan = plan_pass(listing(known[:4]), known)
    assert (plan.vanished, [e.path for e in plan.forget], plan.delete_blocked) == ([], ["bad.md"], None)
    plan = plan_pass(listing(known[1:4]), known)  # 1 of the 4 that published: 25%, over the share
    assert [e.path for e in plan.vanished] == ["f0.md"] and "1 of 4 files vanished (25%)" in plan.delete_blocked
