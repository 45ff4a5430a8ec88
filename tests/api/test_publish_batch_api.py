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


def test_a_manifest_gives_each_document_its_own_metadata_and_allow(client):
    manifest = {"own.md": {"metadata": {"title": "Own"}, "allow": ["user:alice"]},
                "public.md": {"allow": None}}
    response = post_batch(client, [("own.md", b"one"), ("public.md", b"two"), ("shared.md", b"three")],
                          metadata=json.dumps({"dept": "finance"}), allow="group:finance",
                          manifest=json.dumps(manifest))
    assert response.status_code == 202, response.text
    tasks = {r["document_id"]: client.get(r["location"], headers=ACME).json() for r in response.json()["results"]}
    assert tasks["own.md"]["metadata"] == {"title": "Own"} and tasks["own.md"]["allow"] == ["user:alice"]
    assert tasks["public.md"]["metadata"] == {"dept": "finance"} and tasks["public.md"]["allow"] is None
    assert tasks["shared.md"]["metadata"] == {"dept": "finance"} and tasks["shared.md"]["allow"] == ["group:finance"]


def test_a_malformed_manifest_entry_refuses_its_document_only(client):
    manifest = {"bad.md": {"metadata": "not an object"}, "big.md": {"metadata": {"k": "v" * 9000}}}
    response = post_batch(client, [("bad.md", b"one"), ("big.md", b"two"), ("fine.md", b"three")],
                          manifest=json.dumps(manifest))
    assert response.status_code == 202, response.text
    bad, big, fine = response.json()["results"]
    assert bad["status"] == 400 and bad["error"]["code"] == "INVALID_METADATA" and "'bad.md'" in bad["error"]["message"]
    assert big["status"] == 400 and big["error"]["code"] == "INVALID_METADATA", "the publisher's own check, per file"
    assert fine["status"] == 202
    assert {t["document_id"] for t in client.get("/tasks", headers=ACME).json()} == {"fine.md"}


def test_a_manifest_naming_a_file_not_sent_refuses_the_batch_and_stores_nothing(client):
    response = post_batch(client, [("a.md", b"one")], manifest=json.dumps({"a.md": {}, "typo.md": {"allow": []}}))
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_METADATA"
    assert "'typo.md'" in response.json()["error"]["message"]
    assert post_batch(client, [("a.md", b"one")], manifest="[]").status_code == 400
    two_parts = client.post("/documents", files=[("file", ("a.md", b"one")), ("manifest", (None, "{}")),
                                                 ("manifest", (None, "{}"))], headers=ACME)
    assert two_parts.status_code == 400 and "one 'manifest' part" in two_parts.json()["error"]["message"]
    assert client.get("/tasks", headers=ACME).json() == []


def test_a_manifest_may_be_longer_than_a_metadata_part_but_has_its_own_limit(client, monkeypatch):
    from pipelines.api import app as app_module

    files = [(f"doc-{i:03}.md", f"body {i}".encode()) for i in range(200)]
    manifest = {name: {"metadata": {"title": f"Title of {name}", "owner": "x" * 60}} for name, _ in files}
    assert len(json.dumps(manifest)) > 16 * 1024, "past a metadata part's 16 KiB limit"
    response = post_batch(client, files, manifest=json.dumps(manifest))
    assert response.status_code == 202, response.text
    assert all(r["status"] == 202 for r in response.json()["results"])
    first = client.get(response.json()["results"][0]["location"], headers=ACME).json()
    assert first["metadata"]["title"] == "Title of doc-000.md"
    monkeypatch.setattr(app_module, "MAX_MANIFEST_BYTES", 4096)  # read at request time
    too_long = post_batch(client, [("late.md", b"x")],
                          manifest=json.dumps({"late.md": {"metadata": {"k": "v" * 5000}}}))
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "INVALID_METADATA"
    assert "larger than 4096 bytes" in too_long.json()["error"]["message"]


def test_a_manifest_is_room_on_top_of_the_batch_body_limit(make_app):
    """Files that fill the batch limit still fit with a manifest longer than the multipart envelope's 64 KiB."""
    from starlette.testclient import TestClient

    client = TestClient(make_app(max_batch_bytes=12 * 1000), raise_server_exceptions=False)
    files = [(f"full-{i:02}.md", bytes([65 + i]) * 1000) for i in range(12)]
    manifest = json.dumps({name: {"metadata": {f"note{k}": "n" * 900 for k in range(7)}} for name, _ in files})
    assert len(manifest) > 64 * 1024
    response = post_batch(client, files, manifest=manifest)
    assert response.status_code == 202, response.text
    assert all(r["status"] == 202 for r in response.json()["results"])
