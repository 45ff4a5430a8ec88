"""`kbindex source add|list|sync|remove` in process (CliRunner)."""

from __future__ import annotations

import json


def test_add_list_sync_remove(cli, tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    for i in range(3):
        (share / f"doc{i}.md").write_text(f"# Doc {i}\n")
    (share / "skip.txt").write_text("not matched")

    added = cli("source", "add", "handbook", "--tenant", "acme", "--url", str(share), "--glob", "**/*.md")
    assert added.exit_code == 0, added.output
    assert "added source handbook" in added.stdout
    assert cli("source", "add", "handbook", "--tenant", "acme", "--url", str(share)).exit_code == 2
    assert cli("source", "add", "Bad Name", "--tenant", "acme", "--url", str(share)).exit_code == 2
    overlap = cli("source", "add", "copy", "--tenant", "acme", "--url", str(share))  # same paths, same ids
    assert overlap.exit_code == 2 and "SOURCE_OVERLAP" in overlap.stderr, overlap.output
    assert "--prefix" in overlap.stderr
    prefixed = cli("source", "add", "copy", "--tenant", "acme", "--url", str(share), "--prefix", "copy/", "--json")
    assert prefixed.exit_code == 0 and json.loads(prefixed.stdout)["id_prefix"] == "copy/", prefixed.output
    assert cli("source", "remove", "copy").exit_code == 0

    synced = cli("source", "sync", "handbook")
    assert synced.exit_code == 0, synced.output
    assert "handbook: listed 3 files" in synced.stderr  # the progress line
    assert synced.stdout.startswith("handbook: listed 3, unchanged 0, read 3, published 3"), synced.stdout
    again = json.loads(cli("source", "sync", "handbook", "--json").stdout)
    assert (again["unchanged"], again["read"], again["published"]) == (3, 0, 0)
    tasks = json.loads(cli("tasks", "--json").stdout)
    assert sorted(t["document_id"] for t in tasks) == ["doc0.md", "doc1.md", "doc2.md"]

    listed = json.loads(cli("source", "list", "--json").stdout)
    assert [(s["name"], s["tenant_id"], s["glob"], s["files"], s["passes"]) for s in listed] == [
        ("handbook", "acme", "**/*.md", 3, 2)]
    table = cli("source", "list")
    assert table.exit_code == 0 and "handbook" in table.stdout and "unchanged 3" in table.stdout, table.stdout
    rehashed = json.loads(cli("source", "sync", "handbook", "--rehash", "--json").stdout)
    assert (rehashed["unchanged"], rehashed["read"], rehashed["rehashed"], rehashed["published"]) == (0, 3, 3, 0)

    for f in share.glob("*.md"):
        f.unlink()
    held = cli("source", "sync", "handbook")
    assert held.exit_code == 0 and "deleted nothing: the listing is empty" in held.stdout, held.stdout
    forced = json.loads(cli("source", "sync", "handbook", "--allow-mass-delete", "--json").stdout)
    assert forced["deleted"] == 3
    assert cli("source", "sync", "nope").exit_code == 2

    assert cli("source", "remove", "handbook").stdout.startswith("removed source handbook")
    assert "nothing to remove" in cli("source", "remove", "handbook").stdout
    assert json.loads(cli("source", "list", "--json").stdout) == []


def test_list_shows_failing_files_and_sync_leaves_them_alone(cli, tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    (share / "ok.md").write_text("# Fine\n")
    with open(share / "huge.md", "wb") as f:  # sparse: over the 50 MB limit without writing 50 MB
        f.truncate(50 * 1024 * 1024 + 1)
    assert cli("source", "add", "share", "--tenant", "acme", "--url", str(share)).exit_code == 0
    first = cli("source", "sync", "share")
    assert first.exit_code == 1 and "failed 1" in first.stdout, first.output  # failed in this pass: exit 1
    [listed] = json.loads(cli("source", "list", "--json").stdout)
    assert (listed["files"], listed["failing"], listed["failing_codes"]) == (2, 1, {"DOCUMENT_TOO_LARGE": 1})
    table = cli("source", "list")
    assert "failing" in table.stdout and "DOCUMENT_TOO_LARGE" in table.stdout, table.stdout
    again = cli("source", "sync", "share")
    assert again.exit_code == 0 and "failed 0, still failing 1" in again.stdout, again.output  # left alone
    retried = json.loads(cli("source", "sync", "share", "--retry-failed", "--json").stdout)
    assert (retried["failed"], retried["failing"], retried["errors"]) == (1, 0, ["huge.md: DOCUMENT_TOO_LARGE"])
