"""Every API route that returns document data reads on behalf of the caller's principals (issue 30, DESIGN.md
invariant 8): search, GET /documents, GET /documents/{id}, GET /tasks, GET /tasks/{id}, the task's events and the
overview of the status page. A version the caller may not read answers 404 (or is left out of a listing) exactly
as another tenant's; a narrowed allow list takes effect for every route at the pointer flip; end-user and
service tokens are read-only.

The tenant "acme" holds two indexed documents: OPEN (no allow list) and SECRET (group:finance only).
Tokens: ACME (whole tenant), BOB (end user, user:bob), FIN (end user, group:finance), SVC (service, search_as).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from tests.api.conftest import ACME, TOKENS, fail_task, index_task, serve

OPEN, SECRET = "handbook/open.md", "handbook/salaries.md"
OPEN_TEXT, SECRET_TEXT = "holiday rules for every employee", "salary bands for every employee"
QUERY = "rules and bands for every employee"
MODES = ("dense", "lexical", "hybrid")
BOB = {"Authorization": "Bearer tok-bob"}
FIN = {"Authorization": "Bearer tok-fin"}
SVC = {"Authorization": "Bearer tok-svc"}
AS_FINANCE = {"as": "group:finance"}
PRINCIPAL_TOKENS = {
    **TOKENS,
    "tok-bob": {"tenant": "acme", "principals": ["user:bob"]},
    "tok-fin": {"tenant": "acme", "principals": ["group:finance", "user:carol"]},
    "tok-svc": {"tenant": "acme", "search_as": True},
}


def publish(client, document_id: str, data: bytes, *, metadata: dict[str, Any] | None = None,
            allow: list[str] | None = None, headers=ACME, raw_metadata: str | None = None):
    form: dict[str, Any] = {}
    if metadata is not None or raw_metadata is not None:
        form["metadata"] = raw_metadata if raw_metadata is not None else json.dumps(metadata)
    if allow is not None:
        form["allow"] = allow
    return client.post(f"/documents/{document_id}/versions", files={"file": ("doc.md", data, "text/markdown")},
                       data=form, headers=headers)


@pytest.fixture
def client(make_app) -> TestClient:
    return TestClient(make_app(tokens=PRINCIPAL_TOKENS), raise_server_exceptions=False)


@pytest.fixture
def http(client) -> Iterator[httpx.Client]:
    """The same app behind uvicorn: an event stream that leaks answers 200 at once instead of blocking a test."""
    server = serve(client.app)
    try:
        with httpx.Client(base_url=next(server), timeout=httpx.Timeout(10.0)) as h:
            yield h
    finally:
        server.close()


@pytest.fixture
def world(client, db, queue, embedder) -> dict[str, int]:
    """OPEN and SECRET published and indexed; their task ids."""
    tasks = {}
    for doc, text, meta, allow in ((OPEN, OPEN_TEXT, {"dept": "all"}, None),
                                   (SECRET, SECRET_TEXT, {"dept": "finance", "effective": "2026-02-01"},
                                    ["group:finance"])):
        response = publish(client, doc, text.encode(), metadata=meta, allow=allow)
        assert response.status_code == 202, response.text
        tasks[doc] = response.json()["task_id"]
        index_task(db, queue, embedder, tasks[doc], [text])
    return tasks


def hits(client, headers, mode: str = "hybrid", **params: Any) -> set[str]:
    response = client.get("/search", params={"q": QUERY, "mode": mode, **params}, headers=headers)
    assert response.status_code == 200, response.text
    return {h["document_id"] for h in response.json()["hits"]}


def listed(client, headers, **params: Any) -> set[str]:
    response = client.get("/documents", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return {d["document_id"] for d in response.json()}


def task_ids(client, headers, **params: Any) -> set[int]:
    response = client.get("/tasks", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return {t["task_id"] for t in response.json()}


def status(response) -> tuple[int, str | None]:
    body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
    return response.status_code, (body.get("error") or {}).get("code")


def events_status(http: httpx.Client, task_id: int, headers, **params: Any) -> int:
    """GET /tasks/{id}/events after the newest event: 204 for a visible terminal task, 200 (a stream, left
    unread) for a visible open one, 404 when hidden."""
    with http.stream("GET", f"/tasks/{task_id}/events", params=params,
                     headers={**headers, "Last-Event-ID": str(2**62)}) as response:
        return response.status_code


# -- search ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_search_reads_on_behalf_of_the_tokens_principals(client, world, mode):
    assert hits(client, BOB, mode) == {OPEN}  # an end user outside the allow list
    assert hits(client, FIN, mode) == {OPEN, SECRET}  # an end user inside it
    assert hits(client, SVC, mode) == {OPEN}  # a service without as=: fail-closed
    assert hits(client, SVC, mode, **AS_FINANCE) == {OPEN, SECRET}
    assert hits(client, SVC, mode, **{"as": "user:bob"}) == {OPEN}
    assert hits(client, ACME, mode) == {OPEN, SECRET}  # the whole tenant
    assert hits(client, ACME, mode, **{"as": "user:bob"}) == {OPEN}  # ... narrowed to bob
    assert status(client.get("/search", params={"q": QUERY, "mode": mode, **AS_FINANCE}, headers=BOB)) == (
        403, "FORBIDDEN")


def test_search_hits_carry_metadata_and_filters_apply_in_the_query(client, world):
    response = client.get("/search", params={"q": QUERY, **AS_FINANCE}, headers=SVC)
    by_doc = {h["document_id"]: h["metadata"] for h in response.json()["hits"]}
    assert by_doc == {OPEN: {"dept": "all"}, SECRET: {"dept": "finance", "effective": "2026-02-01"}}
    for mode in MODES:
        assert hits(client, FIN, mode, filter="dept=finance") == {SECRET}
        assert hits(client, FIN, mode, filter=["dept=finance|all", "effective>=2026-01-01"]) == {SECRET}
        assert hits(client, FIN, mode, filter="!effective") == {OPEN}
        assert hits(client, BOB, mode, filter="dept=finance") == set()  # a filter never widens the scope
    for bad in ("effective>=soon", "9key=1", ""):
        assert status(client.get("/search", params={"q": QUERY, "filter": bad}, headers=FIN)) == (400, "INVALID_FILTER")
    bad_principal = client.get("/search", params={"q": QUERY, "as": "finance"}, headers=SVC)
    assert status(bad_principal) == (400, "INVALID_FILTER")
    too_many = client.get("/search", params={"q": QUERY, "filter": [f"k{i}=1" for i in range(21)]}, headers=FIN)
    assert status(too_many) == (400, "INVALID_FILTER")
    crowd = [f"user:u{i}" for i in range(101)]
    assert status(client.get("/documents", params={"as": crowd}, headers=SVC)) == (400, "INVALID_FILTER")


# -- documents, tasks, events, overview --------------------------------------------------------------


def test_documents_show_only_what_the_caller_may_read(client, world):
    assert listed(client, BOB) == {OPEN}
    assert listed(client, BOB, task_status="SUCCEEDED") == {OPEN}
    assert listed(client, FIN) == listed(client, ACME) == {OPEN, SECRET}
    assert listed(client, SVC) == {OPEN}
    assert listed(client, SVC, **AS_FINANCE) == {OPEN, SECRET}
    assert status(client.get("/documents", params=AS_FINANCE, headers=BOB)) == (403, "FORBIDDEN")

    assert status(client.get(f"/documents/{SECRET}", headers=BOB)) == (404, "NOT_FOUND")
    assert status(client.get(f"/documents/{SECRET}", headers=SVC)) == (404, "NOT_FOUND")
    assert status(client.get(f"/documents/{SECRET}", params={"as": "user:bob"}, headers=ACME)) == (404, "NOT_FOUND")
    assert client.get(f"/documents/{OPEN}", headers=BOB).status_code == 200
    seen = client.get(f"/documents/{SECRET}", headers=FIN).json()
    assert (seen["status"], seen["metadata"]) == ("SEARCHABLE", {"dept": "finance", "effective": "2026-02-01"})
    assert "allow" not in seen  # an allow list names other people: whole-tenant tokens only
    assert client.get(f"/documents/{SECRET}", params=AS_FINANCE, headers=SVC).json()["status"] == "SEARCHABLE"
    owner = client.get(f"/documents/{SECRET}", headers=ACME).json()
    assert (owner["metadata"]["dept"], owner["allow"]) == ("finance", ["group:finance"])
    assert client.get(f"/documents/{OPEN}", headers=ACME).json()["allow"] is None


def test_tasks_and_their_events_show_only_what_the_caller_may_read(client, http, world):
    open_task, secret_task = world[OPEN], world[SECRET]
    assert task_ids(client, BOB) == task_ids(client, SVC) == {open_task}
    assert task_ids(client, BOB, status="SUCCEEDED") == {open_task}
    assert task_ids(client, FIN) == task_ids(client, ACME) == task_ids(client, SVC, **AS_FINANCE) == {
        open_task, secret_task}

    assert status(client.get(f"/tasks/{secret_task}", headers=BOB)) == (404, "TASK_NOT_FOUND")
    assert status(client.get(f"/tasks/{secret_task}", headers=SVC)) == (404, "TASK_NOT_FOUND")
    assert client.get(f"/tasks/{open_task}", headers=BOB).status_code == 200
    task = client.get(f"/tasks/{secret_task}", params=AS_FINANCE, headers=SVC).json()
    assert task["metadata"] == {"dept": "finance", "effective": "2026-02-01"} and "allow" not in task
    assert client.get(f"/tasks/{secret_task}", headers=ACME).json()["allow"] == ["group:finance"]
    assert status(client.get(f"/tasks/{open_task}", params=AS_FINANCE, headers=BOB)) == (403, "FORBIDDEN")

    assert events_status(http, secret_task, BOB) == 404
    assert events_status(http, secret_task, SVC) == 404
    assert events_status(http, secret_task, FIN) == 204  # terminal, nothing newer: visible
    assert events_status(http, secret_task, SVC, **AS_FINANCE) == 204
    assert events_status(http, open_task, BOB) == 204
    assert events_status(http, open_task, BOB, **AS_FINANCE) == 403
    stream = client.get(f"/tasks/{secret_task}/events", headers=FIN)  # the whole history, then the end
    assert stream.status_code == 200 and '"to_status": "SUCCEEDED"' in stream.text


def test_the_overview_counts_only_what_the_caller_may_read(client, db, queue, world):
    broken = publish(client, "handbook/bonus.md", b"bonus", allow=["group:finance"]).json()["task_id"]
    fail_task(queue, broken, "PARSE_ERROR")

    def overview(headers, **params):
        body = client.get("/overview", params=params, headers=headers).json()
        return body["documents"], body["tasks_by_status"]["SUCCEEDED"], {f["code"] for f in body["failures"]}

    assert overview(ACME) == (3, 2, {"PARSE_ERROR"})
    assert overview(FIN) == overview(SVC, **AS_FINANCE) == (3, 2, {"PARSE_ERROR"})
    assert overview(BOB) == overview(SVC) == overview(ACME, **{"as": "user:bob"}) == (1, 1, set())
    assert listed(client, ACME, error_code="PARSE_ERROR") == listed(client, FIN, error_code="PARSE_ERROR") == {
        "handbook/bonus.md"}
    assert listed(client, BOB, error_code="PARSE_ERROR") == set()
    assert listed(client, BOB, task_status="DEAD") == set()


def test_a_caller_who_may_read_few_documents_pages_through_short_pages(client, world, monkeypatch):
    """Each page walks a bounded number of index entries (PAGE_SCAN_BUDGET), so for a caller who may read few
    documents a page can be empty and still carry a next cursor; following the cursors to the end lists
    exactly what the caller may read, and the overview says when it counted over the newest tasks only."""
    import pipelines.api.app as app_module

    for i in range(5):
        assert publish(client, f"secret/{i}.md", f"secret {i}".encode(), allow=["group:finance"]).status_code == 202
    monkeypatch.setattr(app_module, "PAGE_SCAN_BUDGET", 2)
    monkeypatch.setattr(app_module, "SCOPED_SCAN_TASKS", 3)
    pages, seen, params = [], set(), {"limit": 10}
    while True:
        response = client.get("/documents", params=params, headers=BOB)
        assert response.status_code == 200, response.text
        pages.append([d["document_id"] for d in response.json()])
        seen |= set(pages[-1])
        if "X-Next-Cursor" not in response.headers:
            break
        params["cursor"] = response.headers["X-Next-Cursor"]
    assert seen == {OPEN}
    assert [] in pages and len(pages) >= 3  # 7 entries, 2 a page: short pages on the way
    assert sum(len(p) for p in listed_pages(client, ACME)) == 7  # whole-tenant pages are full as before

    coverage = client.get("/overview", headers=BOB).json()["coverage"]
    assert coverage == {"complete": False, "tasks_read": 3}
    assert client.get("/overview", headers=ACME).json()["coverage"] == {"complete": True, "tasks_read": None}
    assert task_ids(client, BOB, limit=1) == set()  # OPEN's task is not among the newest 3 read
    assert task_ids(client, BOB) == {world[OPEN]}  # a listing of 100 reads the newest 100
    assert len(task_ids(client, ACME, limit=3)) == 3


def listed_pages(client, headers) -> list[list[str]]:
    pages, params = [], {"limit": 10}
    while True:
        response = client.get("/documents", params=params, headers=headers)
        pages.append([d["document_id"] for d in response.json()])
        if "X-Next-Cursor" not in response.headers:
            return pages
        params["cursor"] = response.headers["X-Next-Cursor"]


# -- writes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [BOB, SVC], ids=["end-user", "service"])
def test_end_user_and_service_tokens_are_read_only(client, db, world, headers):
    before = client.get("/documents", headers=ACME).json()
    task = world[OPEN]
    for response in (
        publish(client, OPEN, b"other bytes", headers=headers),
        publish(client, "new.md", b"new", headers=headers),
        client.delete(f"/documents/{OPEN}", headers=headers),
        client.delete(f"/documents/{OPEN}", params={"erase": "true"}, headers=headers),
        client.delete(f"/tasks/{task}", headers=headers),
        client.post(f"/tasks/{task}/retry", headers=headers),
        client.delete("/tasks/999999", headers=headers),  # 403 before any lookup: nothing is told
    ):
        assert status(response) == (403, "FORBIDDEN"), response.text
    assert client.get("/documents", headers=ACME).json() == before
    assert hits(client, headers) == {OPEN}
    assert client.get("/whoami", headers=headers).json()["token"] in ("user", "service")


# -- publish with metadata and an allow list ---------------------------------------------------------


def test_publish_takes_metadata_and_an_allow_list(client, tmp_path):
    response = publish(client, "a.md", b"a", metadata={"dept": "hr", "tags": ["b", "a"], "year": 2026},
                       allow=["user:alice", "group:hr"])
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["metadata"] == {"dept": "hr", "tags": ["a", "b"], "year": 2026}
    assert body["allow"] == ["group:hr", "user:alice"]
    one_part = publish(client, "b.md", b"b", allow=['["group:hr", "user:alice"]'])
    assert one_part.json()["allow"] == ["group:hr", "user:alice"]
    assert publish(client, "a.md", b"a", metadata={"year": 2026, "tags": ["a", "b"], "dept": "hr"},
                   allow=["group:hr", "user:alice"]).status_code == 200  # the same version
    assert publish(client, "a.md", b"a", metadata={"dept": "hr", "tags": ["a", "b"], "year": 2026}).json()[
        "version_number"] == 2  # the allow list is part of the version


@pytest.mark.parametrize(("metadata", "allow"), [
    ("{not json", None),
    ('["a", "list"]', None),
    ('{"9key": 1}', None),
    ('{"nested": {"a": 1}}', None),
    (json.dumps({"big": "x" * 1001}), None),
    (None, ["finance"]),
    (None, ["group:fin ance"]),
    (None, ["[]"]),
    (None, ["[1, 2]"]),
], ids=["not-json", "not-object", "bad-key", "nested", "long", "no-kind", "space", "empty-list", "not-strings"])
def test_bad_metadata_or_allow_list_is_400_and_stores_nothing(client, tmp_path, metadata, allow):
    response = publish(client, "bad.md", b"some bytes", raw_metadata=metadata, allow=allow)
    assert status(response) == (400, "INVALID_METADATA"), response.text
    assert status(client.get("/documents/bad.md", headers=ACME)) == (404, "NOT_FOUND")
    blobs = Path(tmp_path / "blobs")
    assert not blobs.exists() or not [p for p in blobs.rglob("*") if p.is_file()]


# -- a narrowed allow list takes effect for every route at the pointer flip --------------------------


def visible_to_bob(client, http, task_ids_: dict[str, int]) -> dict[str, Any]:
    """What each route shows bob of OPEN (task_ids_: name -> task id to probe)."""
    document = client.get(f"/documents/{OPEN}", headers=BOB)
    return {
        "search": all(OPEN in hits(client, BOB, m) for m in MODES),
        "document": document.json()["latest_version"] if document.status_code == 200 else 404,
        "listed": OPEN in listed(client, BOB),
        "tasks": {name: client.get(f"/tasks/{t}", headers=BOB).status_code for name, t in task_ids_.items()},
        "listed_tasks": {name for name, t in task_ids_.items() if t in task_ids(client, BOB)},
        "events": {name: events_status(http, t, BOB) for name, t in task_ids_.items()},
        "overview": client.get("/overview", headers=BOB).json()["documents"],
    }


def test_a_narrowed_allow_list_takes_effect_for_every_route_at_the_pointer_flip(client, http, db, queue, embedder,
                                                                               world):
    v1 = world[OPEN]
    v2 = publish(client, OPEN, OPEN_TEXT.encode(), metadata={"dept": "all"}, allow=["group:finance"]).json()["task_id"]
    # Until v2's publish flips the pointer, bob still reads v1 everywhere, and v2 does not exist for him.
    assert visible_to_bob(client, http, {"v1": v1, "v2": v2}) == {
        "search": True, "document": 1, "listed": True, "tasks": {"v1": 200, "v2": 404},
        "listed_tasks": {"v1"}, "events": {"v1": 204, "v2": 404}, "overview": 1}
    assert client.get(f"/documents/{OPEN}", headers=ACME).json()["latest_version"] == 2

    index_task(db, queue, embedder, v2, [OPEN_TEXT])  # the fenced publish flips the pointer to v2

    assert visible_to_bob(client, http, {"v1": v1, "v2": v2}) == {
        "search": False, "document": 404, "listed": False, "tasks": {"v1": 404, "v2": 404},
        "listed_tasks": set(), "events": {"v1": 404, "v2": 404}, "overview": 0}
    assert client.get(f"/documents/{OPEN}", headers=FIN).json()["latest_version"] == 2
    assert client.get(f"/tasks/{v1}", params=AS_FINANCE, headers=SVC).status_code == 200

    # Widening back: v3 without an allow list is hidden from bob until its own flip, then shown.
    v3 = publish(client, OPEN, OPEN_TEXT.encode(), metadata={"dept": "all"}).json()["task_id"]
    before_flip = visible_to_bob(client, http, {"v3": v3})
    assert (before_flip["tasks"], before_flip["events"], before_flip["listed_tasks"]) == ({"v3": 404}, {"v3": 404}, set())
    assert client.get(f"/documents/{OPEN}", headers=BOB).status_code == 404
    index_task(db, queue, embedder, v3, [OPEN_TEXT])
    assert visible_to_bob(client, http, {"v1": v1, "v2": v2, "v3": v3}) == {
        "search": True, "document": 3, "listed": True, "tasks": {"v1": 200, "v2": 404, "v3": 200},
        "listed_tasks": {"v1", "v3"}, "events": {"v1": 204, "v2": 404, "v3": 204}, "overview": 1}


def test_the_fast_path_narrows_every_route_at_once(make_app, db, queue, embedder):
    client = TestClient(make_app(tokens=PRINCIPAL_TOKENS, fast_publish=True), raise_server_exceptions=False)
    first = publish(client, OPEN, OPEN_TEXT.encode())
    index_task(db, queue, embedder, first.json()["task_id"], [OPEN_TEXT])
    assert hits(client, BOB) == {OPEN}

    narrowed = publish(client, OPEN, OPEN_TEXT.encode(), allow=["group:finance"])  # metadata-only: copied at once

    assert (narrowed.json()["version_number"], narrowed.json()["status"]) == (2, "SUCCEEDED")
    assert all(hits(client, BOB, m) == set() for m in MODES)
    assert status(client.get(f"/documents/{OPEN}", headers=BOB)) == (404, "NOT_FOUND")
    assert listed(client, BOB) == set() and task_ids(client, BOB) == set()
    assert client.get(f"/tasks/{first.json()['task_id']}", headers=BOB).status_code == 404
    assert all(hits(client, FIN, m) == {OPEN} for m in MODES)


def test_an_open_event_stream_stops_when_a_flip_hides_its_task(client, db, queue, embedder, world):
    """A stream's reads check visibility in the same statement: after the flip it gets nothing more, and ends."""
    hub = client.app.state.event_hub
    bob = {"tenant_id": "acme", "principals": ["user:bob"], "see_all": False}
    v1 = world[OPEN]
    assert hub._read_sync(v1, 0, "acme", bob)  # bob reads v1's history
    v2 = publish(client, OPEN, OPEN_TEXT.encode(), allow=["group:finance"]).json()["task_id"]
    assert hub._read_sync(v1, 0, "acme", bob)
    index_task(db, queue, embedder, v2, [OPEN_TEXT])
    assert hub._read_sync(v1, 0, "acme", bob) is None
    assert hub._read_sync(v1, 0, "acme", {**bob, "principals": ["group:finance"]})
    assert hub._read_sync(v1, 0, "globex", {**bob, "principals": ["group:finance"]}) is None  # another tenant


# -- tokens ----------------------------------------------------------------------------------------


def test_token_file_and_table_carry_principals_and_search_as(make_app, db, tmp_path, world):
    from pipelines.api.auth import token_hash

    as_json = tmp_path / "tokens.json"
    as_json.write_text(json.dumps({"tokens": [
        {"token": "j-tenant", "tenant": "acme"},
        {"token": "j-fin", "tenant": "acme", "principals": ["group:finance"]},
        {"token": f"sha256:{token_hash('j-svc')}", "tenant": "acme", "search_as": True},
    ]}))
    as_toml = tmp_path / "tokens.toml"
    as_toml.write_text('[[tokens]]\ntoken = "t-bob"\ntenant = "acme"\nprincipals = ["user:bob"]\n\n'
                       '[[tokens]]\ntoken = "t-svc"\ntenant = "acme"\nsearch_as = true\n')
    with db.session() as s:
        s.conn.execute("INSERT INTO api_token (token_sha256, tenant_id, principals) VALUES (%s, 'acme', %s)",
                       (token_hash("db-fin"), ["group:finance"]))
        s.conn.execute("INSERT INTO api_token (token_sha256, tenant_id, search_as) VALUES (%s, 'acme', true)",
                       (token_hash("db-svc"), ))
    expected = {"j-tenant": ("tenant", {OPEN, SECRET}), "j-fin": ("user", {OPEN, SECRET}),
                "j-svc": ("service", {OPEN}), "t-bob": ("user", {OPEN}), "t-svc": ("service", {OPEN}),
                "db-fin": ("user", {OPEN, SECRET}), "db-svc": ("service", {OPEN})}
    for path in (as_json, as_toml):
        client = TestClient(make_app(tokens=None, tokens_file=str(path)), raise_server_exceptions=False)
        for token, (kind, docs) in expected.items():
            if token.startswith(("j-", "t-")) and not token.startswith("j-" if path == as_json else "t-"):
                continue
            headers = {"Authorization": f"Bearer {token}"}
            assert client.get("/whoami", headers=headers).json()["token"] == kind, token
            assert listed(client, headers) - {"x.md"} == docs, token  # x.md: published below
            assert (publish(client, "x.md", b"x", headers=headers).status_code == 202) == (kind == "tenant")


@pytest.mark.parametrize("entry", [
    {"token": "t", "tenant": "acme", "principals": ["group:finance"], "search_as": True},
    {"token": "t", "tenant": "acme", "principals": []},
    {"token": "t", "tenant": "acme", "principals": "group:finance"},
    {"token": "t", "tenant": "acme", "principals": ["finance"]},
    {"token": "t", "tenant": "acme", "search_as": "yes"},
    {"token": "t", "tenant": "acme", "role": "admin"},
], ids=["both", "empty", "string", "no-kind", "not-bool", "unknown-field"])
def test_a_malformed_token_entry_is_refused(entry):
    from pipelines.api.auth import parse_tokens
    from pipelines.domain.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        parse_tokens({"tokens": [entry]})
