"""The CI-sized round of bench/scale/burst.py: the same burst through the real daemon, on an empty index
and on one already holding indexed versions (seeded in SQL, with the pruned Dagster key state)."""

import psycopg
import pytest
from psycopg import sql as pgsql

from bench.scale.burst import SEED_TENANT, render, run, seed_index


@pytest.mark.slow
@pytest.mark.soak  # 2-3 min: `python -m pytest -m soak`
def test_a_burst_on_a_seeded_index_and_on_an_empty_one(pg_server_url):
    report = run(seeded=2000, burst=100, live_keys=300, chunks=2, timeout=600, admin_url=pg_server_url,
                 out=lambda line: None)
    print(render(report))
    empty, seeded = report["rounds"]
    # The ratio compares equal work: every burst version SUCCEEDED and is pointed in both rounds, both wrote the
    # same chunks and lexical rows, the 2,000 seeded versions (x2 chunks) are intact and only in the seeded round.
    assert report["problems"] == [], report["problems"]
    assert empty["index"]["bench"] == seeded["index"]["bench"]
    assert empty["index"]["bench"]["pointers"] == 100 and empty["index"]["bench"]["chunks"] > 0
    assert seeded["index"]["seeded"] == {"pointers": 2000, "chunks": 4000, "lexical_chunks": 0, "unfinished": 0}
    assert report["ratio"] == round(seeded["versions_per_second"] / empty["versions_per_second"], 3)
    # Throughput itself is not asserted: CI machines are shared. `python -m bench.scale.burst` reports it.


def test_rounds_that_did_different_work_are_reported_not_compared():
    """consistency() names each way two rounds can differ; the bench exits 1 on any of them."""
    from bench.scale.burst import consistency

    def round_(label, states, pointers, chunks, seed):
        return {"round": label, "throughput": {"final_states": states, "chunks": chunks},
                "index": {"bench": {"pointers": pointers, "chunks": chunks, "lexical_chunks": chunks, "unfinished": 0},
                          "seeded": seed}}

    none = {"pointers": 0, "chunks": 0, "lexical_chunks": 0, "unfinished": 0}
    seed = {"pointers": 50, "chunks": 100, "lexical_chunks": 0, "unfinished": 0}
    ok = {"rounds": [round_("empty", {"SUCCEEDED": 10}, 10, 20, none), round_("seeded", {"SUCCEEDED": 10}, 10, 20, seed)]}
    assert consistency(ok, burst=10, seeded=50, chunks=2) == []
    dead = {"rounds": [round_("empty", {"SUCCEEDED": 10}, 10, 20, none),
                       round_("seeded", {"SUCCEEDED": 9, "DEAD": 1}, 9, 18, seed)]}
    problems = consistency(dead, burst=10, seeded=50, chunks=2)
    assert any("seeded: final states" in p for p in problems) and any("different indexes" in p for p in problems)
    lost_seed = {"rounds": [ok["rounds"][0], round_("seeded", {"SUCCEEDED": 10}, 10, 20, {**seed, "pointers": 49})]}
    assert any("seeded tenant changed" in p for p in consistency(lost_seed, burst=10, seeded=50, chunks=2))


def test_seeding_builds_indexed_versions_and_the_pruned_key_state(db_url, pg_server_url):
    from resources.local_postgres import with_database

    dg_name = f"dg_seed_{db_url.rpartition('/')[2].partition('?')[0]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(dg_name)))
    seed_index(db_url, with_database(pg_server_url, dg_name), versions=50, chunks=3, live_keys=10, out=lambda line: None)
    with psycopg.connect(db_url) as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM search_pointer WHERE tenant_id = %(t)s),"
            " (SELECT count(*) FROM chunk WHERE tenant_id = %(t)s),"
            " (SELECT count(*) FROM index_task WHERE tenant_id = %(t)s AND status = 'SUCCEEDED'),"
            " (SELECT count(*) FROM dagster_partition_key),"
            " (SELECT count(DISTINCT embedding::text) FROM chunk)", {"t": SEED_TENANT}).fetchone()
    assert counts == (50, 150, 50, 10, 150)  # every chunk its own random vector
    with psycopg.connect(with_database(pg_server_url, dg_name)) as conn:
        keys = [r[0] for r in conn.execute("SELECT partition FROM dynamic_partitions ORDER BY id")]
    assert keys == [f"{SEED_TENANT}/seed-{i}/v1" for i in range(41, 51)]  # the newest, oldest first
