"""DELETE /documents/{id}: a tombstone and its task (202), idempotent repeats (200), ?erase=true a receipt; the
task and the document say what a delete is; search keeps the old version until the tombstone's publish."""

from __future__ import annotations

import numpy as np
import pytest

from tests.api.conftest import ACME, GLOBEX, claim_task, index_task, publish

DOC = "policies/refunds.md"
MODES = ("dense", "lexical", "hybrid")


def hits(client, mode: str) -> list[tuple[str, int]]:
    response = client.get("/search", params={"q": "refunds within thirty days", "mode": mode}, headers=ACME)
    assert response.status_code == 200, response.text
    return [(h["document_id"], h["version_number"]) for h in response.json()["hits"]]


def publish_tombstone(db, queue, task_id: int) -> None:
    from resources.index_sink import IndexSink

    IndexSink(db, queue).publish(claim_task(queue, task_id), [], np.zeros((0, 384), dtype=np.float32))


def test_delete_is_a_tombstone_task_and_the_document_leaves_search_at_its_publish(client, db, queue, embedder):
    v1 = publish(client, DOC, b"# Refunds\n\nWithin 30 days.\n").json()["task_id"]
    index_task(db, queue, embedder, v1, ["refunds within thirty days"])
    assert all(hits(client, m) == [(DOC, 1)] for m in MODES)

    deleted = client.delete(f"/documents/{DOC}", headers=ACME)
    assert deleted.status_code == 202, deleted.text
    body = deleted.json()
    assert (body["outcome"], body["kind"], body["version_number"], body["status"]) == ("deleted", "delete", 2, "PENDING")
    assert deleted.headers["location"] == f"/tasks/{body['task_id']}"
    assert [t["task_id"] for t in body["tasks"]] == [body["task_id"]]

    task = client.get(f"/tasks/{body['task_id']}", headers=ACME).json()
    assert (task["kind"], task["status"]) == ("delete", "PENDING")
    assert client.get(f"/tasks/{v1}", headers=ACME).json()["kind"] == "index"
    assert {t["task_id"]: t["kind"] for t in client.get("/tasks", headers=ACME).json()} == {v1: "index",
                                                                                          body["task_id"]: "delete"}
    doc = client.get(f"/documents/{DOC}", headers=ACME).json()
    assert (doc["status"], doc["deleted"], doc["latest_version"], doc["searchable_version"]) == ("DELETING", True, 2, 1)
    assert all(hits(client, m) == [(DOC, 1)] for m in MODES)  # served until the tombstone's publish

    publish_tombstone(db, queue, body["task_id"])
    assert all(hits(client, m) == [] for m in MODES)
    doc = client.get(f"/documents/{DOC}", headers=ACME).json()
    assert (doc["status"], doc["deleted"], doc["searchable_version"], doc["searchable_chunks"]) == ("DELETED", True, 2, 0)
    assert doc["task"]["kind"] == "delete"
    assert {d["document_id"]: d["status"] for d in client.get("/documents", headers=ACME).json()} == {DOC: "DELETED"}

    again = client.delete(f"/documents/{DOC}", headers=ACME)
    assert again.status_code == 200
    assert (again.json()["outcome"], again.json()["task_id"], again.json()["status"]) == (
        "already_deleted", body["task_id"], "SUCCEEDED")

    back = publish(client, DOC, b"# Refunds\n\nWithin 30 days.\n")  # the same bytes as v1: a new version
    assert back.status_code == 202 and back.json()["version_number"] == 3 and back.json()["kind"] == "index"


def test_deleting_a_document_never_published_is_200_nothing_to_delete(client, db):
    response = client.delete("/documents/nope.md", headers=ACME)
    assert response.status_code == 200
    assert response.json()["outcome"] == "not_found" and "nothing to delete" in response.json()["message"]
    assert "task_id" not in response.json()
    assert client.get("/documents/nope.md", headers=ACME).status_code == 404  # nothing was created


def test_a_tenant_cannot_delete_another_tenants_document(client):
    publish(client, DOC, b"acme's policy")
    response = client.delete(f"/documents/{DOC}", headers=GLOBEX)
    assert (response.status_code, response.json()["outcome"]) == (200, "not_found")
    assert client.get(f"/documents/{DOC}", headers=ACME).json()["latest_version"] == 1


@pytest.mark.parametrize("value", ["true", "1"])
def test_erase_purges_at_once_and_answers_a_receipt(client, db, queue, embedder, value):
    v1 = publish(client, DOC, b"# Refunds\n\nWithin 30 days.\n").json()["task_id"]
    index_task(db, queue, embedder, v1, ["refunds within thirty days"])
    assert all(hits(client, m) == [(DOC, 1)] for m in MODES)

    response = client.delete(f"/documents/{DOC}", params={"erase": value}, headers=ACME)

    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["outcome"], body["tombstone_version"], body["document_id"]) == ("erased", 2, DOC)
    assert body["removed"]["chunks"] == 1 and body["removed"]["lexical_rows"] == 1
    assert body["removed"]["blobs"] == 1 and body["not_removed"] == []
    assert all(hits(client, m) == [] for m in MODES)  # at once: the tombstone's task is still PENDING
    assert client.get(f"/tasks/{body['tombstone_task_id']}", headers=ACME).json()["status"] == "PENDING"
    again = client.delete(f"/documents/{DOC}", params={"erase": value}, headers=ACME)
    assert (again.status_code, again.json()["outcome"]) == (200, "already_erased")
    nothing = client.delete("/documents/nope.md", params={"erase": value}, headers=ACME)
    assert (nothing.status_code, nothing.json()["outcome"]) == (200, "not_found")


def test_a_tenant_cannot_erase_another_tenants_document(client):
    publish(client, DOC, b"acme's policy")
    response = client.delete(f"/documents/{DOC}", params={"erase": "true"}, headers=GLOBEX)
    assert (response.status_code, response.json()["outcome"]) == (200, "not_found")
    assert client.get(f"/documents/{DOC}", headers=ACME).json()["latest_version"] == 1


def test_delete_needs_a_token(client):
    assert client.delete(f"/documents/{DOC}").status_code == 401
