"""The status page's statements walk tenant-scoped indexes: no sequential scan of the queue or the documents,
no sort of a whole tenant, whatever the table size (the planner's own choice on 40k tasks; the tenant asked
about holds 5k of them, as one of many tenants would)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from sql import queries
from tests.plans import rows_read, walk

DOCUMENTS = {"acme": 5_000, "globex": 35_000}
BIG_TABLES = {"index_task", "document", "document_version"}


@pytest.fixture(scope="module")
def busy_tenants(template_url, database_from) -> Iterator[str]:
    """Two tenants' documents, one version and one INDEX task each, shaped like a big backfill half done:
    mostly SUCCEEDED over the last day, some DEAD and RETRY_WAIT with codes, the rest PENDING or RUNNING.
    Seeded once for the module (the tests only read it; EXPLAIN ANALYZE of a SELECT writes nothing)."""
    with database_from(template_url) as url:
        seed_busy_tenants(url)
        yield url


def seed_busy_tenants(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for tenant, n in DOCUMENTS.items():
            params = {"tenant": tenant, "n": n}
            conn.execute(
                "INSERT INTO document (tenant_id, document_id, latest_version)"
                " SELECT %(tenant)s, 'doc-' || g, 1 FROM generate_series(1, %(n)s) g", params)
            conn.execute(
                "INSERT INTO document_version (tenant_id, document_id, version_number, content_hash, byte_size,"
                " filename, media_type, partition_key, published_at)"
                " SELECT %(tenant)s, 'doc-' || g, 1, 'h' || g, 1, 'd.txt', 'text/plain', %(tenant)s || '/doc-' || g || '/v1',"
                " now() - g * interval '1 second' FROM generate_series(1, %(n)s) g", params)
            conn.execute(
                "INSERT INTO index_task (tenant_id, document_id, version_number, profile, status, lease_owner,"
                " lease_until, error_code, finished_at, created_at)"
                " SELECT %(tenant)s, 'doc-' || g, 1, 'minilm-v1',"
                "  CASE WHEN g %% 50 = 0 THEN 'DEAD' WHEN g %% 50 = 1 THEN 'RETRY_WAIT' WHEN g %% 50 = 2 THEN 'RUNNING'"
                "       WHEN g %% 3 = 0 THEN 'PENDING' ELSE 'SUCCEEDED' END,"
                "  CASE WHEN g %% 50 = 2 THEN 'w' END, CASE WHEN g %% 50 = 2 THEN now() + interval '1 minute' END,"
                "  CASE WHEN g %% 50 = 0 THEN 'PARSE_ERROR' WHEN g %% 50 = 1 THEN 'EMBEDDING_TIMEOUT' END,"
                "  CASE WHEN g %% 50 = 0 OR (g %% 50 > 2 AND g %% 3 <> 0) THEN now() - (g %% 1440) * interval '1 minute' END,"
                "  now() - interval '1 day'"
                " FROM generate_series(1, %(n)s) g", params)
        conn.execute("VACUUM ANALYZE document, document_version, index_task")


def plan(url: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The executed plan (EXPLAIN ANALYZE): the planner's own choice, with the rows each node really read."""
    with psycopg.connect(url) as conn:
        (raw,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries[name], params).fetchone()
    raw = raw if isinstance(raw, list) else json.loads(raw)
    return raw[0]["Plan"]


LIMIT = 51  # a page of 50 and one more to know whether there is a next page
SEE_ALL = {"see_all": True, "principals": []}  # a whole-tenant token's read scope
PAGE = {"tenant_id": "acme", "limit": LIMIT, "scan_budget": 2_000, **SEE_ALL}
PAGES = [
    ("api_document_page_recent", {**PAGE, "before_published_at": "infinity", "before_document_id": "", "before_version": 0}),
    ("api_document_page_by_task_status", {**PAGE, "task_status": "PENDING", "before_task_id": 2**63 - 1}),
    ("api_document_page_by_task_status", {**PAGE, "task_status": "SUCCEEDED", "before_task_id": 4_000}),
    ("api_document_page_by_error_code", {**PAGE, "error_code": "PARSE_ERROR", "task_status": None,
                                         "before_task_id": 2**63 - 1}),
    ("api_document_status", {"tenant_id": "acme", "document_ids": [f"doc-{i}" for i in range(1, 51)], **SEE_ALL}),
]
# An end user's pages over documents without allow lists walk the same indexes, a page at a time (each entry
# also probes its document's newest readable version and its search pointer).
AS_BOB = {"see_all": False, "principals": ["user:bob"]}
PAGES += [(name, {**params, **AS_BOB}) for name, params in PAGES]
COUNTS = [
    ("api_tenant_overview", {"tenant_id": "acme", "now": None, "window_seconds": 600.0}),
    ("api_tenant_failures_by_code", {"tenant_id": "acme", **SEE_ALL}),
]


@pytest.mark.parametrize(("name", "params"), PAGES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(PAGES)])
def test_a_page_reads_about_a_page_of_rows(busy_tenants, name, params):
    root = plan(busy_tenants, name, params)
    nodes = [n for n in walk(root) if n.get("Relation Name") in BIG_TABLES]
    read = sum(rows_read(n) for n in nodes)
    assert read <= 4 * LIMIT, f"{name} read {read} rows for a page of {LIMIT}:\n{json.dumps(root, indent=1)}"
    assert not [n for n in walk(root) if n["Node Type"] in ("Sort", "Incremental Sort", "Hash")], json.dumps(root, indent=1)


@pytest.mark.parametrize(("name", "params"), COUNTS, ids=[n for n, _ in COUNTS])
def test_counts_read_indexes_only(busy_tenants, name, params):
    """Counting a tenant's tasks or documents reads its index entries (index-only, no heap); anything that
    reads rows reads only the few it needs (the failures, the oldest open task)."""
    root = plan(busy_tenants, name, params)
    for node in walk(root):
        if node.get("Relation Name") not in BIG_TABLES:
            continue
        assert node["Node Type"] != "Seq Scan", f"{name} scans {node['Relation Name']}:\n{json.dumps(root, indent=1)}"
        if node["Node Type"] == "Index Only Scan":
            assert node.get("Heap Fetches", 0) == 0
        else:
            assert rows_read(node) <= 1000, f"{name} reads {rows_read(node)} rows:\n{json.dumps(root, indent=1)}"


def test_the_walks_use_the_new_indexes(busy_tenants):
    used: dict[str, set[str | None]] = {}
    for name, params in PAGES + COUNTS:
        used.setdefault(name, set()).update(n.get("Index Name") for n in walk(plan(busy_tenants, name, params)))
    assert "document_version_tenant_published_idx" in used["api_document_page_recent"]
    assert "index_task_tenant_status_task_idx" in used["api_document_page_by_task_status"]
    assert "index_task_tenant_failure_idx" in used["api_document_page_by_error_code"]
    assert {"index_task_tenant_status_task_idx", "index_task_tenant_finished_idx"} <= used["api_tenant_overview"]


# -- an end user who may read almost nothing: the cost is bounded by the scan budgets, not the tenant ----------

BUDGET = 300  # smaller than acme's 5,000 documents, so an unbounded walk would show
FEW = {"see_all": False, "principals": ["user:bob"]}
STATUSES = ["PENDING", "RUNNING", "RETRY_WAIT", "SUCCEEDED", "DEAD", "CANCELLED"]
SCOPED = [
    ("api_document_page_recent", {**PAGE, **FEW, "scan_budget": BUDGET, "before_published_at": "infinity",
                                  "before_document_id": "", "before_version": 0}),
    ("api_document_page_by_task_status", {**PAGE, **FEW, "scan_budget": BUDGET, "task_status": "SUCCEEDED",
                                          "before_task_id": 2**63 - 1}),
    ("api_document_page_by_error_code", {**PAGE, **FEW, "scan_budget": BUDGET, "error_code": "PARSE_ERROR",
                                         "task_status": None, "before_task_id": 2**63 - 1}),
    ("api_tenant_overview_scoped", {"tenant_id": "acme", **FEW, "now": None, "window_seconds": 600.0,
                                    "scan_tasks": BUDGET, "statuses": STATUSES}),
    ("api_task_list_visible", {"tenant_id": "acme", **FEW, "status": None, "limit": 100, "scan_tasks": BUDGET,
                               "statuses": STATUSES}),
    ("api_task_list_visible", {"tenant_id": "acme", **FEW, "status": "SUCCEEDED", "limit": 100,
                               "scan_tasks": BUDGET, "statuses": STATUSES}),
]


@pytest.fixture(scope="module")
def restricted_tenant(busy_tenants, database_from) -> Iterator[str]:
    """A copy of busy_tenants where acme's versions are all restricted to group:finance, but for a handful bob
    may read."""
    with database_from(busy_tenants) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE document_version SET allow_principals = ARRAY['group:finance']"
                         " WHERE tenant_id = 'acme' AND document_id NOT IN ('doc-4000', 'doc-4500')")
            conn.execute("VACUUM ANALYZE document_version")
        yield url


@pytest.mark.parametrize(("name", "params"), SCOPED, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SCOPED)])
def test_a_caller_who_may_read_few_documents_reads_a_bounded_number_of_rows(restricted_tenant, name, params):
    """Which versions a caller may read is in no index: without a budget, bob's page would walk all 5,000 of
    acme's entries to find the two he may read. With one, every statement reads a few rows per budgeted entry,
    whatever the tenant's size."""
    root = plan(restricted_tenant, name, params)
    read = sum(rows_read(n) for n in walk(root) if n.get("Relation Name") in BIG_TABLES)
    assert read <= 12 * BUDGET, f"{name} read {read} rows with a budget of {BUDGET}:\n{json.dumps(root, indent=1)}"
    assert not [n for n in walk(root) if n.get("Node Type") == "Seq Scan"
                and n.get("Relation Name") in BIG_TABLES], json.dumps(root, indent=1)


def test_a_page_that_spends_its_budget_returns_where_it_stopped(restricted_tenant):
    """The walk's last entry comes back (kept or not) so the next page starts after it, and walking pages
    to the end finds exactly the documents bob may read."""
    params = dict(SCOPED[0][1])
    found, pages = [], 0
    with psycopg.connect(restricted_tenant) as conn:
        while True:
            rows = conn.execute(queries["api_document_page_recent"], params).fetchall()
            pages += 1
            cols = ("document_id", "published_at", "version_number", "depth", "kept")
            rows = [dict(zip(cols, r)) for r in rows]
            found += [r["document_id"] for r in rows if r["kept"]]
            if not rows or rows[-1]["depth"] < BUDGET:
                break
            last = rows[-1]
            params.update(before_published_at=last["published_at"], before_document_id=last["document_id"],
                          before_version=last["version_number"])
    assert sorted(found) == ["doc-4000", "doc-4500"]
    assert pages == -(-5_000 // BUDGET)  # every entry walked once, a budget at a time
