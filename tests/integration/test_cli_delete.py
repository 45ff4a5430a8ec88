"""`kbindex delete DOCUMENT_ID --tenant T [--json]` in process (CliRunner), and how `kbindex tasks` / `kbindex task`
show a delete: exit 0 whether it deleted, was already deleted or had nothing to delete, and says which."""

from __future__ import annotations

import json

import numpy as np
import pytest

from resources.index_sink import IndexSink
from resources.task_queue import TaskQueue


def test_delete_then_again_then_nothing_to_delete_all_exit_0(cli, db, tmp_path):
    doc = tmp_path / "refunds.md"
    doc.write_text("# Refunds\n\nWithin 30 days.\n")
    assert cli("publish", str(doc), "--tenant", "acme").exit_code == 0

    first = cli("delete", "refunds.md", "--tenant", "acme", "--json")
    assert first.exit_code == 0, first.output
    body = json.loads(first.stdout)
    assert (body["outcome"], body["version"], body["status"], body["created"]) == ("deleted", 2, "PENDING", True)
    assert [t["task_id"] for t in body["tasks"]] == [body["task_id"]]

    again = cli("delete", "refunds.md", "--tenant", "acme")
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("already deleted: refunds.md v2 is a tombstone"), again.stdout

    missing = cli("delete", "never.md", "--tenant", "acme")
    assert missing.exit_code == 0 and "nothing to delete" in missing.stdout, missing.output
    assert json.loads(cli("delete", "never.md", "--tenant", "acme", "--json").stdout)["outcome"] == "not_found"
    assert cli("delete", "x", "--tenant", "bad tenant!").exit_code == 2

    listed = json.loads(cli("tasks", "--json").stdout)
    assert {t["version_number"]: t["kind"] for t in listed} == {1: "index", 2: "delete"}
    short = cli("tasks")
    assert "delete" in short.stdout, short.stdout

    queue = TaskQueue(db)
    claimed = queue.claim_task(body["task_id"], "cli-test")
    IndexSink(db, queue).publish(claimed.lease, [], np.zeros((0, 384), dtype=np.float32))
    shown = cli("task", str(body["task_id"]))
    assert shown.exit_code == 0, shown.output
    assert "tombstone: deletes the document" in shown.stdout and "deleted: search no longer returns" in shown.stdout
    assert json.loads(cli("task", str(body["task_id"]), "--json").stdout)["kind"] == "delete"
    assert "deleted" in cli("tasks").stdout
    done = cli("delete", "refunds.md", "--tenant", "acme")
    assert done.exit_code == 0 and "SUCCEEDED" in done.stdout and "already deleted" in done.stdout


def test_erase_refuses_without_yes_and_says_what_it_would_do(cli, db, tmp_path):
    doc = tmp_path / "refunds.md"
    doc.write_text("# Refunds\n\nWithin 30 days.\n")
    assert cli("publish", str(doc), "--tenant", "acme").exit_code == 0
    refused = cli("erase", "refunds.md", "--tenant", "acme")
    assert refused.exit_code == 2
    assert "purge every stored copy" in refused.output and "--yes" in refused.output
    assert TaskQueue(db).list()[0]["version_number"] == 1  # nothing happened: no tombstone


def test_erase_with_yes_prints_a_receipt(cli, db, tmp_path):
    doc = tmp_path / "refunds.md"
    doc.write_text("# Refunds\n\nWithin 30 days.\n")
    assert cli("publish", str(doc), "--tenant", "acme").exit_code == 0
    done = cli("erase", "refunds.md", "--tenant", "acme", "--yes", "--json")
    assert done.exit_code == 0, done.output
    body = json.loads(done.stdout)
    assert (body["outcome"], body["tombstone_version"]) == ("erased", 2)
    assert (body["removed"]["blobs"], body["removed"]["tasks_cancelled"], body["removed"]["versions_stripped"]) == (1, 1, 2)
    assert list((tmp_path / "blobs").rglob("*.txt")) == [] and not [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
    text = cli("erase", "refunds.md", "--tenant", "acme", "--yes")
    assert text.exit_code == 0 and "already erased" in text.output
