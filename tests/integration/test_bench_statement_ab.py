"""CI-sized round of bench.scale.statement_ab: the search paths with named statements swapped for another
revision's texts, interleaved, on a database a ``bench.scale.search --keep`` run seeded. Timings are the bench's
business; this checks it swaps what it says, refuses what it cannot compare, and reports differing answers."""

from __future__ import annotations

import subprocess

import psycopg
import pytest
from psycopg import sql as pgsql

import sql
from bench.scale import search as scale_search
from bench.scale import statement_ab


@pytest.fixture
def seeded(pg_server_url, monkeypatch):
    monkeypatch.setenv("KBINDEX_DATABASE_URL", pg_server_url)
    assert scale_search.main(["--chunks", "3000", "--queries", "3", "--keep"]) == 0
    yield
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(scale_search.SCRATCH)))


def test_statements_missing_or_unchanged_at_the_revision_are_refused_by_name():
    now = {"a": "SELECT 1", "b": "SELECT 2"}
    assert statement_ab.pick({"a": "SELECT 0", "b": "SELECT 2"}, ["a"], now, "REV") == {"a": "SELECT 0"}
    with pytest.raises(SystemExit, match="the same at REV as here: b"):
        statement_ab.pick({"a": "SELECT 0", "b": "SELECT 2"}, ["a", "b"], now, "REV")
    with pytest.raises(SystemExit, match="not at REV or not here: c"):
        statement_ab.pick({"a": "SELECT 0", "c": "SELECT 3"}, ["a", "c"], now, "REV")
    # A statement added since REV, against the one it stands in for there.
    now["a_new"] = "SELECT 4"
    assert statement_ab.pick({"a": "SELECT 0"}, ["a_new=a"], now, "REV") == {"a_new": "SELECT 0"}
    with pytest.raises(SystemExit, match="not at REV or not here: a_new"):
        statement_ab.pick({"b": "SELECT 0"}, ["a_new=a"], now, "REV")
    with pytest.raises(SystemExit, match="the same at REV as here: a_new"):
        statement_ab.pick({"a": "SELECT 4"}, ["a_new=a"], now, "REV")


def test_a_revisions_statements_are_read_from_git():
    try:
        found = statement_ab.all_statements_at("HEAD")
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout: {exc}")
    assert "search_hits_exact" in found and "lexical_hits_all_pointers" in found
    assert all(text.strip() for text in found.values())


def test_swapped_texts_are_in_force_inside_the_block_only():
    before = sql.queries["search_hits_exact"]
    with statement_ab.statements({"search_hits_exact": before + "\n-- then"}):
        assert sql.queries["search_hits_exact"].endswith("-- then")
    assert sql.queries["search_hits_exact"] == before


def test_the_bench_compares_both_sides_and_counts_differing_answers(seeded, monkeypatch, capsys):
    names = ["lexical_hits_all_pointers", "search_hits_exact"]
    same = {n: sql.queries[n] + "\n-- the same statement, another text" for n in names}
    monkeypatch.setattr(statement_ab, "statements_at", lambda revision, wanted: {n: same[n] for n in wanted})
    assert statement_ab.main(["--against", "REV", "--queries", "4", "--tenants", "t-huge"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("t-huge")]
    assert {(r[1], r[-1]) for r in rows} >= {("dense", "0"), ("hybrid", "0"), ("lexical", "0")}
    assert all(r[-1] == "0" for r in rows), "the same statements must give the same answers"
    assert all(r[-4] == r[-8] for r in rows), "and the same recall@10 on both sides"

    # A 'then' that answers differently is counted: a narrow scope's exact answer, farthest first.
    name = "search_hits_scoped"
    worst_first = {name: sql.queries[name].replace("ORDER BY (c.embedding <=> %(query)s::vector) + 0, c.chunk_id",
                                                   "ORDER BY (c.embedding <=> %(query)s::vector) + 0 DESC, c.chunk_id")}
    assert worst_first[name] != sql.queries[name]
    monkeypatch.setattr(statement_ab, "statements_at", lambda revision, wanted: worst_first)
    assert statement_ab.main(["--against", "REV", "--statements", name, "--queries", "4", "--tenants", "t-huge"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("t-huge")]
    assert any(r[1] == "dense" and "dept=" in " ".join(r) and int(r[-1]) > 0 for r in rows), rows
    unfiltered = [r for r in rows if "all" in r or "as" in r]  # scope "all" or "as group:finance"
    assert unfiltered and all(r[-1] == "0" for r in unfiltered), "paths without a filter never run it"


def test_without_a_seeded_database_it_says_how_to_seed_one(pg_server_url, monkeypatch):
    monkeypatch.setenv("KBINDEX_DATABASE_URL", pg_server_url)
    monkeypatch.setattr(statement_ab, "statements_at", lambda revision, wanted: {n: "SELECT 1" for n in wanted})
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(scale_search.SCRATCH)))
    with pytest.raises(SystemExit, match="seed one first .* python -m bench.scale.search --chunks 200000 --keep"):
        statement_ab.main(["--against", "REV"])
