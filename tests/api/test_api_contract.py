"""The HTTP contract against the real app and a real PostgreSQL (in-process ASGI client)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.domain.errors import InvalidRequest
from tests.api.conftest import ACME, GLOBEX, MAX_UPLOAD, claim_task, fail_task, index_task, publish

DOC = "policies/eu/refund.md"  # ids may contain '/'


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code
    assert "Traceback" not in response.text and "/work/" not in response.text and "site-packages" not in response.text
    return body["error"]


# -- publish ---------------------------------------------------------------------------------------


def test_publish_202_then_same_bytes_200_with_the_same_task(client):
    first = publish(client, DOC, b"# Refunds\n\nWithin 30 days.\n")
    assert first.status_code == 202, first.text
    task = first.json()
    assert first.headers["location"] == f"/tasks/{task['task_id']}"
    assert (task["tenant_id"], task["document_id"], task["version_number"], task["status"]) == ("acme", DOC, 1, "PENDING")

    again = publish(client, DOC, b"# Refunds\n\nWithin 30 days.\n")
    assert again.status_code == 200
    assert again.json()["task_id"] == task["task_id"] and again.json()["version_number"] == 1

    changed = publish(client, DOC, b"# Refunds\n\nWithin 14 days.\n")
    assert changed.status_code == 202
    assert changed.json()["version_number"] == 2 and changed.json()["task_id"] != task["task_id"]
    listed = client.get("/tasks", headers=ACME).json()
    assert sorted(t["task_id"] for t in listed) == sorted([task["task_id"], changed.json()["task_id"]])


def test_get_task_fields_and_progress_never_100_before_succeeded(client, db, queue, embedder):
    task_id = publish(client, DOC, b"refund policy text").json()["task_id"]
    body = client.get(f"/tasks/{task_id}", headers=ACME).json()
    for field in ("status", "stage", "completed", "total", "percent", "attempts", "max_attempts", "error",
                  "created_at", "updated_at", "started_at", "finished_at", "can_cancel", "can_retry"):
        assert field in body
    assert body["status"] == "PENDING" and body["percent"] == 0 and body["can_cancel"] and not body["can_retry"]
    assert body["attempts"] == 0 and body["error"] is None and body["finished_at"] is None

    lease = claim_task(queue, task_id)
    queue.progress(lease, "embed", 5, 10)
    body = client.get(f"/tasks/{task_id}", headers=ACME).json()
    assert (body["status"], body["stage"], body["completed"], body["total"], body["attempts"]) == ("RUNNING", "embed", 5, 10, 1)
    assert body["percent"] == pytest.approx(52.5)
    queue.progress(lease, "publish", 1, 1)
    body = client.get(f"/tasks/{task_id}", headers=ACME).json()
    assert body["percent"] == 99.0  # everything done but not yet SUCCEEDED

    index_task(db, queue, embedder, task_id, ["refunds within thirty days"], lease=lease)
    body = client.get(f"/tasks/{task_id}", headers=ACME).json()
    assert body["status"] == "SUCCEEDED" and body["percent"] == 100.0 and body["finished_at"]
    assert not body["can_cancel"] and "SUCCEEDED" in body["cannot_cancel_reason"]


def test_failed_task_shows_code_and_sanitized_message(client, queue):
    task_id = publish(client, DOC, b"x").json()["task_id"]
    fail_task(queue, task_id, "PARSE_ERROR", "cannot parse /srv/kbindex/blobs/sha256/ab/cd/file: bad header")
    body = client.get(f"/tasks/{task_id}", headers=ACME).json()
    assert body["status"] == "DEAD" and body["can_retry"] and body["error"]["code"] == "PARSE_ERROR"
    assert "/srv/" not in body["error"]["message"] and "bad header" in body["error"]["message"]


def test_over_size_upload_is_413_checked_while_streaming(client):
    exact = publish(client, "a", b"x" * MAX_UPLOAD)
    assert exact.status_code == 202
    assert_error(publish(client, "b", b"x" * (MAX_UPLOAD + 1)), 413, "DOCUMENT_TOO_LARGE")

    # No Content-Length (chunked): refused once the stream passes the limit.
    boundary = "kbindexboundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.txt\"\r\n"
            "Content-Type: text/plain\r\n\r\n").encode()
    sent = []

    def body():
        yield head
        for _ in range(100):  # up to 100 x 16 KiB = 1.6 MiB offered
            sent.append(1)
            yield b"y" * 16384
        yield f"\r\n--{boundary}--\r\n".encode()

    response = client.post("/documents/c/versions", content=body(),
                           headers={**ACME, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert_error(response, 413, "DOCUMENT_TOO_LARGE")
    assert client.get("/documents/c", headers=ACME).status_code == 404  # nothing was published

    # A declared Content-Length over the limit is refused before reading.
    response = client.post("/documents/d/versions", content=b"z" * 10,
                           headers={**ACME, "Content-Type": f"multipart/form-data; boundary={boundary}",
                                    "Content-Length": str(MAX_UPLOAD * 4)})
    assert_error(response, 413, "DOCUMENT_TOO_LARGE")


def test_bad_uploads_are_400(client):
    assert_error(client.post(f"/documents/{DOC}/versions", content=b"hello", headers={**ACME, "Content-Type": "text/plain"}),
                 400, "INVALID_REQUEST")
    assert_error(client.post(f"/documents/{DOC}/versions", files={"other": ("a.txt", b"x")}, headers=ACME),
                 400, "INVALID_REQUEST")


# -- cancel and retry ------------------------------------------------------------------------------


def test_cancel_pending_then_409_for_cancelled_and_retry_requeues(client):
    task_id = publish(client, DOC, b"v1").json()["task_id"]
    response = client.delete(f"/tasks/{task_id}", headers=ACME)
    assert response.status_code == 200 and response.json()["status"] == "CANCELLED"
    assert response.json()["can_retry"] is True
    error = assert_error(client.delete(f"/tasks/{task_id}", headers=ACME), 409, "ILLEGAL_TRANSITION")
    assert "already cancelled" in error["message"]
    retried = client.post(f"/tasks/{task_id}/retry", headers=ACME)  # a cancel is never a dead end
    assert retried.status_code == 200
    body = retried.json()
    assert (body["task_id"], body["status"], body["attempts"], body["max_attempts"]) == (task_id, "PENDING", 0, 3)


def test_publishing_the_same_bytes_requeues_a_cancelled_task_with_202(client):
    task_id = publish(client, DOC, b"v1").json()["task_id"]
    assert publish(client, DOC, b"v1").status_code == 200  # same bytes, task still PENDING: nothing new
    assert client.delete(f"/tasks/{task_id}", headers=ACME).json()["status"] == "CANCELLED"
    again = publish(client, DOC, b"v1")
    assert again.status_code == 202  # re-queued: new work for the same task
    assert (again.json()["task_id"], again.json()["status"], again.json()["version_number"]) == (task_id, "PENDING", 1)
    assert again.headers["Location"] == f"/tasks/{task_id}"


def test_cancel_succeeded_and_dead_409_retry_dead_200(client, db, queue, embedder):
    ok = publish(client, "ok.md", b"fine").json()["task_id"]
    index_task(db, queue, embedder, ok, ["fine text"])
    error = assert_error(client.delete(f"/tasks/{ok}", headers=ACME), 409, "ILLEGAL_TRANSITION")
    assert "SUCCEEDED" in error["message"]
    assert "only DEAD or CANCELLED" in assert_error(client.post(f"/tasks/{ok}/retry", headers=ACME), 409,
                                                    "ILLEGAL_TRANSITION")["message"]

    dead = publish(client, "dead.md", b"broken").json()["task_id"]
    assert fail_task(queue, dead) == "DEAD"
    assert "DEAD" in assert_error(client.delete(f"/tasks/{dead}", headers=ACME), 409, "ILLEGAL_TRANSITION")["message"]
    retried = client.post(f"/tasks/{dead}/retry", headers=ACME)
    assert retried.status_code == 200
    body = retried.json()
    assert body["status"] == "PENDING" and body["attempts"] == 1 and body["max_attempts"] == 4


def test_retry_of_pending_and_running_is_409(client, queue):
    task_id = publish(client, DOC, b"v1").json()["task_id"]
    assert "PENDING" in assert_error(client.post(f"/tasks/{task_id}/retry", headers=ACME), 409, "ILLEGAL_TRANSITION")["message"]
    claim_task(queue, task_id)
    assert "RUNNING" in assert_error(client.post(f"/tasks/{task_id}/retry", headers=ACME), 409, "ILLEGAL_TRANSITION")["message"]
    assert client.delete(f"/tasks/{task_id}", headers=ACME).json()["status"] == "CANCELLED"  # RUNNING can be cancelled


def test_unknown_task_is_404(client):
    assert_error(client.get("/tasks/999999", headers=ACME), 404, "TASK_NOT_FOUND")
    assert_error(client.delete("/tasks/999999", headers=ACME), 404, "TASK_NOT_FOUND")
    assert_error(client.get("/tasks/not-a-number", headers=ACME), 400, "INVALID_REQUEST")


# -- tenancy and auth ------------------------------------------------------------------------------


def test_tenants_are_isolated_both_ways(client, db, queue, embedder):
    acme = publish(client, DOC, b"acme refund: 30 days", headers=ACME).json()
    globex = publish(client, DOC, b"globex refund: 90 days", headers=GLOBEX).json()  # same document id
    assert acme["task_id"] != globex["task_id"] and globex["tenant_id"] == "globex"
    for mine, theirs, headers in ((acme, globex, ACME), (globex, acme, GLOBEX)):
        other = theirs["task_id"]
        assert client.get(f"/tasks/{mine['task_id']}", headers=headers).status_code == 200
        assert_error(client.get(f"/tasks/{other}", headers=headers), 404, "TASK_NOT_FOUND")
        assert_error(client.get(f"/tasks/{other}/events", headers=headers), 404, "TASK_NOT_FOUND")
        assert_error(client.delete(f"/tasks/{other}", headers=headers), 404, "TASK_NOT_FOUND")
        assert_error(client.post(f"/tasks/{other}/retry", headers=headers), 404, "TASK_NOT_FOUND")
        assert [t["task_id"] for t in client.get("/tasks", headers=headers).json()] == [mine["task_id"]]
        assert [d["tenant_id"] for d in client.get("/documents", headers=headers).json()] == [mine["tenant_id"]]
    assert client.get("/tasks/%d" % acme["task_id"], headers=ACME).json()["status"] == "PENDING"  # not cancelled by globex

    index_task(db, queue, embedder, acme["task_id"], ["acme refunds are accepted within 30 days"])
    assert client.get(f"/documents/{DOC}", headers=ACME).json()["status"] == "SEARCHABLE"
    assert client.get(f"/documents/{DOC}", headers=GLOBEX).json()["status"] == "INDEXING"
    assert_error(client.get("/documents/only-acme.md", headers=GLOBEX), 404, "NOT_FOUND")
    hits = client.get("/search", params={"q": "refunds accepted days"}, headers=GLOBEX).json()["hits"]
    assert hits == []  # globex's version is not searchable yet, acme's is not theirs
    hits = client.get("/search", params={"q": "refunds accepted days"}, headers=ACME).json()["hits"]
    assert [h["document_id"] for h in hits] == [DOC]


def test_missing_or_bad_token_is_401(client):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic dG9rLWFjbWU="}):
        response = client.get("/tasks", headers=headers)
        assert_error(response, 401, "UNAUTHORIZED")
        assert response.headers["www-authenticate"] == "Bearer"
    assert_error(publish(client, DOC, b"x", headers={}), 401, "UNAUTHORIZED")


def test_tokens_from_file_and_table(make_app, db, tmp_path):
    from starlette.testclient import TestClient

    from pipelines.api.auth import token_hash

    path = tmp_path / "tokens.toml"
    path.write_text(f'[tokens]\n"file-token" = "initech"\n"sha256:{token_hash("hashed-token")}" = "hooli"\n')
    with db.session() as s:  # a database token, stored as its hash only
        s.conn.execute("INSERT INTO api_token (token_sha256, tenant_id) VALUES (%s, 'umbrella')", (token_hash("db-token"),))
        s.conn.execute("INSERT INTO api_token (token_sha256, tenant_id, revoked_at) VALUES (%s, 'x', now())",
                       (token_hash("revoked"),))
    client = TestClient(make_app(tokens=None, tokens_file=str(path)), raise_server_exceptions=False)
    for token, tenant in (("file-token", "initech"), ("hashed-token", "hooli"), ("db-token", "umbrella")):
        response = publish(client, "d", token.encode(), headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 202 and response.json()["tenant_id"] == tenant
    assert_error(client.get("/tasks", headers={"Authorization": "Bearer revoked"}), 401, "UNAUTHORIZED")


# -- documents -------------------------------------------------------------------------------------


def test_document_status_indexing_searchable_stale_failed(client, db, queue, embedder):
    v1 = publish(client, DOC, b"v1 bytes").json()["task_id"]
    doc = client.get(f"/documents/{DOC}", headers=ACME).json()
    assert (doc["status"], doc["latest_version"], doc["searchable_version"]) == ("INDEXING", 1, None)
    index_task(db, queue, embedder, v1, ["refunds within 30 days"])
    doc = client.get(f"/documents/{DOC}", headers=ACME).json()
    assert (doc["status"], doc["latest_version"], doc["searchable_version"], doc["failure"]) == ("SEARCHABLE", 1, 1, None)

    v2 = publish(client, DOC, b"v2 bytes").json()["task_id"]
    doc = client.get(f"/documents/{DOC}", headers=ACME).json()
    assert (doc["status"], doc["latest_version"], doc["searchable_version"]) == ("INDEXING", 2, 1)
    fail_task(queue, v2, "ENCRYPTED_DOCUMENT", "the file is password-protected")
    doc = client.get(f"/documents/{DOC}", headers=ACME).json()
    assert (doc["status"], doc["latest_version"], doc["searchable_version"]) == ("STALE", 2, 1)
    assert doc["failure"] == {"code": "ENCRYPTED_DOCUMENT", "message": "the file is password-protected"}

    other = publish(client, "never.md", b"nothing").json()["task_id"]
    fail_task(queue, other, "EMPTY_DOCUMENT", "no text")
    doc = client.get("/documents/never.md", headers=ACME).json()
    assert (doc["status"], doc["searchable_version"], doc["failure"]["code"]) == ("FAILED", None, "EMPTY_DOCUMENT")

    listed = {d["document_id"]: d["status"] for d in client.get("/documents", headers=ACME).json()}
    assert listed == {DOC: "STALE", "never.md": "FAILED"}
    assert_error(client.get("/documents/nope", headers=ACME), 404, "NOT_FOUND")


# -- search ----------------------------------------------------------------------------------------


def test_search_finds_searchable_versions_only(client, db, queue, embedder):
    task_id = publish(client, DOC, b"v1").json()["task_id"]
    assert client.get("/search", params={"q": "refund window"}, headers=ACME).json()["hits"] == []
    index_task(db, queue, embedder, task_id, ["the refund window is thirty days", "shipping takes a week"])
    body = client.get("/search", params={"q": "refund window", "k": 1}, headers=ACME).json()
    assert len(body["hits"]) == 1
    hit = body["hits"][0]
    assert (hit["document_id"], hit["version_number"], hit["text"]) == (DOC, 1, "the refund window is thirty days")
    assert_error(client.get("/search", params={"q": ""}, headers=ACME), 400, "INVALID_REQUEST")
    assert_error(client.get("/search", params={"q": "x", "k": 0}, headers=ACME), 400, "INVALID_REQUEST")


# -- errors ----------------------------------------------------------------------------------------


def test_error_bodies_are_sanitized(make_app):
    from starlette.testclient import TestClient

    def crashing(*args, **kwargs):
        raise RuntimeError('boom in File "/work/main/resources/search.py", line 12: SELECT * FROM chunk')

    def refusing(*args, **kwargs):
        raise InvalidRequest("cannot open /var/lib/kbindex/secret/config.toml\nTraceback (most recent call last):")

    client = TestClient(make_app(search_fn=crashing), raise_server_exceptions=False)
    error = assert_error(client.get("/search", params={"q": "x"}, headers=ACME), 500, "INTERNAL_ERROR")
    assert "boom" not in error["message"] and "SELECT" not in error["message"]

    client = TestClient(make_app(search_fn=refusing), raise_server_exceptions=False)
    error = assert_error(client.get("/search", params={"q": "x"}, headers=ACME), 400, "INVALID_REQUEST")
    assert "/var/lib" not in error["message"] and "Traceback" not in error["message"]

    assert_error(client.get("/no/such/route", headers=ACME), 404, "NOT_FOUND")
    assert_error(client.put("/tasks/1", headers=ACME), 405, "METHOD_NOT_ALLOWED")


def test_openapi_documents_the_routes(client):
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert "/documents/{document_id}/versions" in paths and "multipart/form-data" in str(paths["/documents/{document_id}/versions"])
    for path in ("/tasks/{task_id}", "/tasks/{task_id}/events", "/tasks/{task_id}/retry", "/documents/{document_id}", "/search", "/metrics"):
        assert path in paths
    assert set(paths["/tasks/{task_id}"]) == {"get", "delete"}
    assert "409" in paths["/tasks/{task_id}"]["delete"]["responses"]


def test_status_page_is_served(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert 'id="upload-form"' in page.text and "Last-Event-ID" in page.text and str(MAX_UPLOAD) in page.text


# -- metrics ---------------------------------------------------------------------------------------


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_parse_and_count_from_the_database(client, db, queue, embedder):
    empty = client.get("/metrics")
    assert empty.status_code == 200 and empty.headers["content-type"].startswith("text/plain")
    samples = _samples(empty.text)
    assert samples[("kbindex_queue_due", ())] == 0
    assert samples[("kbindex_publish_to_searchable_seconds_count", ())] == 0

    ok = publish(client, "ok.md", b"ok").json()["task_id"]
    bad = publish(client, "bad.md", b"bad").json()["task_id"]
    publish(client, "waiting.md", b"waiting")
    index_task(db, queue, embedder, ok, ["some text"])
    fail_task(queue, bad, "PARSE_ERROR")

    samples = _samples(client.get("/metrics").text)
    assert samples[("kbindex_queue_depth", (("status", "PENDING"),))] == 1
    assert samples[("kbindex_queue_due", ())] == 1
    assert samples[("kbindex_queue_oldest_due_age_seconds", ())] >= 0
    assert samples[("kbindex_tasks", (("status", "SUCCEEDED"),))] == 1
    assert samples[("kbindex_tasks_dead", (("code", "PARSE_ERROR"),))] == 1
    assert samples[("kbindex_task_failures_total", (("code", "PARSE_ERROR"),))] == 1
    assert samples[("kbindex_leases", (("state", "active"),))] == 0
    assert samples[("kbindex_publish_to_searchable_seconds_count", ())] == 1
    assert samples[("kbindex_publish_to_searchable_seconds_bucket", (("le", "+Inf"),))] == 1
    assert samples[("kbindex_publish_to_searchable_seconds_bucket", (("le", "86400.0"),))] == 1


def test_metrics_token_when_configured(make_app):
    from starlette.testclient import TestClient

    client = TestClient(make_app(metrics_token="scrape-me"), raise_server_exceptions=False)
    assert_error(client.get("/metrics"), 401, "UNAUTHORIZED")
    assert client.get("/metrics", headers={"Authorization": "Bearer scrape-me"}).status_code == 200
