"""GET /overview and the filtered, keyset-paginated GET /documents behind the status page.

Counts, the in-flight bar, rate and ETA, failures by code linking to their documents, pages that neither
skip nor repeat, cursors that refuse another filter, and no figure or row of another tenant.
"""

from __future__ import annotations

import psycopg
import pytest

from pipelines.api.views import encode_cursor
from tests.api.conftest import ACME, GLOBEX, fail_task, index_task, publish
from tests.api.test_api_contract import assert_error


def overview(client, headers=ACME) -> dict:
    response = client.get("/overview", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def listed(client, headers=ACME, **params) -> list[str]:
    response = client.get("/documents", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return [d["document_id"] for d in response.json()]


def all_pages(client, headers=ACME, **params) -> list[list[str]]:
    """Follow X-Next-Cursor to the end; each page's document ids."""
    pages, cursor = [], None
    while True:
        response = client.get("/documents", params={**params, **({"cursor": cursor} if cursor else {})}, headers=headers)
        assert response.status_code == 200, response.text
        pages.append([d["document_id"] for d in response.json()])
        cursor = response.headers.get("x-next-cursor")
        if cursor is None:
            assert "link" not in response.headers
            return pages
        assert response.headers["link"].endswith('>; rel="next"') and f"cursor={cursor}" in response.headers["link"]


def sql(db_url: str, statement: str, *params) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(statement, params)


@pytest.fixture
def mixed(client, db, queue, embedder) -> dict[str, int]:
    """acme: two SUCCEEDED, one DEAD (PARSE_ERROR), one RETRY_WAIT (EMBEDDING_TIMEOUT), two PENDING."""
    ids = {name: publish(client, name, name.encode()).json()["task_id"] for name in
           ("ok-1.md", "ok-2.md", "dead.md", "retry.md", "pending-1.md", "pending-2.md")}
    index_task(db, queue, embedder, ids["ok-1.md"], ["one"])
    index_task(db, queue, embedder, ids["ok-2.md"], ["two"])
    assert fail_task(queue, ids["dead.md"], "PARSE_ERROR", "the file is damaged") == "DEAD"
    assert fail_task(queue, ids["retry.md"], "EMBEDDING_TIMEOUT", "the model timed out") == "RETRY_WAIT"
    return ids


def test_overview_counts_bar_rate_eta_and_failures(client, mixed):
    body = overview(client)
    assert body["tenant_id"] == "acme" and body["documents"] == 6 and body["tasks_total"] == 6
    assert body["tasks_by_status"] == {"PENDING": 2, "RUNNING": 0, "RETRY_WAIT": 1, "SUCCEEDED": 2, "DEAD": 1, "CANCELLED": 0}
    flight = body["in_flight"]
    assert (flight["open"], flight["done"], flight["total"], flight["percent"]) == (3, 3, 6, 50.0)
    assert flight["since"] is not None
    # Everything started moments ago: the rate window is the one-minute floor, two successes in it.
    assert body["rate"] == {"succeeded_per_minute": 2.0, "succeeded_in_window": 2, "window_seconds": 60.0}
    assert body["eta_seconds"] == 90.0  # three open at two a minute
    assert body["failures"] == [
        {"code": "EMBEDDING_TIMEOUT", "dead": 0, "retry_wait": 1, "documents": 1},
        {"code": "PARSE_ERROR", "dead": 1, "retry_wait": 0, "documents": 1},
    ]


def test_rate_is_measured_over_the_last_ten_minutes(client, mixed, db_url):
    # The batch began an hour ago: the window is the full ten minutes. One success 5 minutes ago counts,
    # the other (20 minutes ago) is outside the window but still part of the work done in flight.
    sql(db_url, "UPDATE index_task SET created_at = now() - interval '1 hour' WHERE tenant_id = 'acme'")
    sql(db_url, "UPDATE index_task SET finished_at = now() - interval '5 minutes' WHERE task_id = %s", mixed["ok-1.md"])
    sql(db_url, "UPDATE index_task SET finished_at = now() - interval '20 minutes' WHERE task_id = %s", mixed["ok-2.md"])
    body = overview(client)
    assert body["rate"] == {"succeeded_per_minute": 0.1, "succeeded_in_window": 1, "window_seconds": 600.0}
    assert body["eta_seconds"] == 1800.0  # three open at 0.1 a minute
    assert (body["in_flight"]["done"], body["in_flight"]["total"]) == (3, 6)

    # Finished before the oldest open task was queued: not part of this work.
    sql(db_url, "UPDATE index_task SET finished_at = now() - interval '2 hours' WHERE task_id = %s", mixed["ok-2.md"])
    assert overview(client)["in_flight"]["done"] == 2


def test_eta_unknown_while_nothing_succeeds_and_zero_when_idle(client, queue):
    task_id = publish(client, "a.md", b"a").json()["task_id"]
    body = overview(client)
    assert body["in_flight"] == {"open": 1, "done": 0, "total": 1, "percent": 0.0, "since": body["in_flight"]["since"]}
    assert body["rate"]["succeeded_per_minute"] == 0.0 and body["eta_seconds"] is None
    client.delete(f"/tasks/{task_id}", headers=ACME)
    body = overview(client)
    assert body["in_flight"] == {"open": 0, "done": 0, "total": 0, "percent": 100.0, "since": None}
    assert body["eta_seconds"] == 0.0 and body["tasks_by_status"]["CANCELLED"] == 1


def test_each_failure_code_lists_exactly_its_documents(client, mixed):
    assert listed(client, error_code="PARSE_ERROR") == ["dead.md"]
    assert listed(client, error_code="EMBEDDING_TIMEOUT") == ["retry.md"]
    assert listed(client, error_code="EMBEDDING_TIMEOUT", task_status="DEAD") == []
    assert listed(client, error_code="NO_SUCH_CODE") == []
    assert listed(client, task_status="PENDING") == ["pending-2.md", "pending-1.md"]  # newest task first
    assert listed(client, task_status="SUCCEEDED") == ["ok-2.md", "ok-1.md"]
    rows = client.get("/documents", params={"error_code": "PARSE_ERROR"}, headers=ACME).json()
    assert rows[0]["status"] == "FAILED" and rows[0]["failure"]["code"] == "PARSE_ERROR"


def test_a_failure_fixed_by_a_new_version_leaves_the_failure_list(client, mixed):
    publish(client, "dead.md", b"repaired bytes")
    body = overview(client)
    assert [f["code"] for f in body["failures"]] == ["EMBEDDING_TIMEOUT"]
    assert body["tasks_by_status"]["DEAD"] == 1  # the old version's task is still DEAD: tasks are counted
    assert listed(client, error_code="PARSE_ERROR") == []
    assert "dead.md" in listed(client, task_status="PENDING")


def test_pages_cover_every_document_once_newest_first(client, db_url):
    names = [f"doc-{i}.md" for i in range(7)]
    for name in names:
        publish(client, name, name.encode())
    assert all_pages(client, limit=3) == [names[6:3:-1], names[3:0:-1], names[:1]]
    assert listed(client) == names[::-1]  # the default page holds them all (backward compatible)

    # A bulk publish gives many versions one timestamp: the document id breaks the tie, nothing is lost.
    sql(db_url, "UPDATE document_version SET published_at = '2025-01-01T00:00:00Z' WHERE tenant_id = 'acme'")
    pages = all_pages(client, limit=2)
    assert [len(p) for p in pages] == [2, 2, 2, 1] and sum(pages, []) == sorted(names, reverse=True)


def test_filtered_pages_follow_the_task_walk(client, mixed):
    assert all_pages(client, task_status="PENDING", limit=1) == [["pending-2.md"], ["pending-1.md"]]
    assert all_pages(client, error_code="PARSE_ERROR", limit=1) == [["dead.md"]]


def test_bad_filters_and_cursors_are_400(client, mixed):
    first = client.get("/documents", params={"limit": 1}, headers=ACME)
    recent_cursor = first.headers["x-next-cursor"]
    pending = client.get("/documents", params={"limit": 1, "task_status": "PENDING"}, headers=ACME)
    pending_cursor = pending.headers["x-next-cursor"]
    for params in (
        {"cursor": "not-a-cursor!"},
        {"cursor": "e30"},  # '{}': no kind
        {"cursor": encode_cursor({"kind": "task:PENDING:", "task_id": 2**64}), "task_status": "PENDING"},
        {"cursor": encode_cursor({"kind": "recent", "published_at": "yesterday", "document_id": "a", "version": 1})},
        {"cursor": recent_cursor, "task_status": "PENDING"},  # made for another listing
        {"cursor": pending_cursor},
        {"cursor": pending_cursor, "task_status": "DEAD"},
        {"task_status": "PENDING", "error_code": "PARSE_ERROR"},
        {"task_status": "NOPE"},
        {"error_code": "lower-case"},
        {"limit": 0},
    ):
        assert_error(client.get("/documents", params=params, headers=ACME), 400, "INVALID_REQUEST")
    assert client.get("/documents", params={"cursor": pending_cursor, "task_status": "PENDING"}, headers=ACME).status_code == 200


def test_overview_and_lists_never_show_another_tenant(client, mixed):
    empty = overview(client, GLOBEX)
    assert empty["documents"] == 0 and set(empty["tasks_by_status"].values()) == {0}
    assert empty["failures"] == [] and empty["in_flight"]["total"] == 0 and empty["rate"]["succeeded_in_window"] == 0
    for params in ({}, {"task_status": "DEAD"}, {"task_status": "PENDING"}, {"error_code": "PARSE_ERROR"}):
        assert listed(client, GLOBEX, **params) == []

    publish(client, "dead.md", b"globex's own", headers=GLOBEX)  # the same document id, another tenant
    theirs = overview(client, GLOBEX)
    assert theirs["documents"] == 1 and theirs["tasks_by_status"]["PENDING"] == 1 and theirs["failures"] == []
    assert overview(client)["tasks_by_status"]["PENDING"] == 2  # acme's figures did not move
    # acme's cursor in globex's hands walks globex's rows only: acme's next row (pending-1.md) stays hidden,
    # globex's one task is newer than the cursor.
    cursor = client.get("/documents", params={"limit": 1, "task_status": "PENDING"}, headers=ACME).headers["x-next-cursor"]
    assert listed(client, ACME, task_status="PENDING", cursor=cursor) == ["pending-1.md"]
    assert listed(client, GLOBEX, task_status="PENDING", cursor=cursor) == []
    assert client.get("/documents", params={"task_status": "PENDING"}, headers=GLOBEX).json()[0]["tenant_id"] == "globex"
    assert_error(client.get("/overview"), 401, "UNAUTHORIZED")
