"""POST /documents: many documents in one form, one transaction, one result each (issue #34: API importers get
the batch `kbindex publish DIR` has, so a burst is planned as a few big runs)."""

from __future__ import annotations

import json

import psycopg

from tests.api.conftest import ACME, GLOBEX, MAX_UPLOAD, publish


def post_batch(client, files, headers=ACME, **data):
    return client.post("/documents", files=[("file", f) for f in files], data=data, headers=headers)


def test_a_batch_publishes_every_document_in_one_transaction_with_a_result_each(client, db_url):
    response = post_batch(client, [("a.md", b"# A\n\nalpha"), ("b.md", b"# B\n\nbeta"), ("c/d.md", b"# D\n\ndelta")])
    assert response.status_code == 202, response.text
    results = response.json()["results"]
    assert [r["document_id"] for r in results] == ["a.md", "b.md", "c/d.md"]
    assert all(r["status"] == 202 and r["version_number"] == 1 and r["task_status"] == "PENDING" for r in results)
    assert all(r["location"] == f"/tasks/{r['task_id']}" for r in results)
    with psycopg.connect(db_url) as conn:
        xids = conn.execute("SELECT DISTINCT xmin::text FROM document_version WHERE tenant_id = 'acme'").fetchall()
    assert len(xids) == 1, "the versions were committed by more than one transaction"
    for r in results:  # each readable like a single publish's task
        assert client.get(r["location"], headers=ACME).json()["document_id"] == r["document_id"]


def test_a_refused_document_changes_nothing_and_the_others_publish(client):
    publish(client, "same.md", b"unchanged")
    response = post_batch(client, [("ok.md", b"fine"), ("x" * 1001, b"an id over 1000 characters"), ("same.md", b"unchanged")])
    assert response.status_code == 202
    ok, bad, same = response.json()["results"]
    assert ok["status"] == 202
    assert bad["status"] == 400 and bad["error"]["code"] == "INVALID_REQUEST" and "task_id" not in bad
    assert same["status"] == 200 and same["version_number"] == 1, "same bytes: the existing task, no new version"
    listed = {t["document_id"] for t in client.get("/tasks", headers=ACME).json()}
    assert listed == {"ok.md", "same.md"}


def test_a_batch_with_nothing_new_answers_200(client):
    publish(client, "x.md", b"x")
    response = post_batch(client, [("x.md", b"x")])
    assert response.status_code == 200 and response.json()["results"][0]["status"] == 200


def test_shared_metadata_and_allow_apply_to_every_document(client):
    response = post_batch(client, [("m1.md", b"one"), ("m2.md", b"two")],
                          metadata=json.dumps({"dept": "finance"}), allow="group:finance")
    assert response.status_code == 202, response.text
    for r in response.json()["results"]:
        task = client.get(r["location"], headers=ACME).json()
        assert task["metadata"] == {"dept": "finance"} and task["allow"] == ["group:finance"]


def test_bad_shared_metadata_refuses_the_whole_batch_and_stores_nothing(client):
    response = post_batch(client, [("n1.md", b"one")], metadata="{not json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_METADATA"
    assert client.get("/tasks", headers=ACME).json() == []


def test_limits_files_bytes_and_names(make_app):
    from starlette.testclient import TestClient

    client = TestClient(make_app(max_batch_files=2, max_batch_bytes=3 * MAX_UPLOAD // 2), raise_server_exceptions=False)
    too_many = post_batch(client, [("1.md", b"1"), ("2.md", b"2"), ("3.md", b"3")])
    assert too_many.status_code == 400 and "more than 2 'file' parts" in too_many.json()["error"]["message"]
    one_too_big = post_batch(client, [("big.md", b"x" * (MAX_UPLOAD + 1))])
    assert one_too_big.status_code == 413 and one_too_big.json()["error"]["code"] == "DOCUMENT_TOO_LARGE"
    body_too_big = post_batch(client, [("h1.md", b"x" * (MAX_UPLOAD - 10)), ("h2.md", b"y" * (MAX_UPLOAD - 10))])
    assert body_too_big.status_code == 413
    unnamed = client.post("/documents", files=[("file", ("", b"no name", "text/plain"))], headers=ACME)
    assert unnamed.status_code == 200, unnamed.text  # nothing new; the file's own result says why
    (entry,) = unnamed.json()["results"]
    assert entry["status"] == 400 and "needs a filename" in entry["error"]["message"]
    assert client.get("/tasks", headers=ACME).json() == [], "a refused batch or file stored nothing"


def test_a_batch_is_the_callers_tenant_only(client):
    post_batch(client, [("t.md", b"acme's")])
    assert client.get("/tasks", headers=GLOBEX).json() == []
    assert post_batch(client, [("t.md", b"x")], headers={"Authorization": "Bearer nope"}).status_code == 401
