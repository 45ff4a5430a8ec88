"""kbindex_metadata_match (PL/pgSQL since migration 0033) gives Filter.matches' answer, and the jsonpath built for
the metadata index (metadata_path) never leaves out a version that passes the filters."""

import json
import random

import psycopg

from pipelines.domain.metadata import Filter, canonical_metadata, filters_json, metadata_path

WORDS = ["a", "b", "c", "1", "true", "é\"x"]
KEYS = ["dept", "year", "effective", "tags", "draft", "n", "absent"]


def random_metadata(rng: random.Random) -> dict:
    values = lambda: [rng.choice(WORDS), rng.randint(2019, 2028), rng.randint(1, 3) + 0.0,  # noqa: E731
                      f"2026-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}", rng.sample(WORDS, rng.randint(1, 3)),
                      rng.random() < 0.5]
    return canonical_metadata({k: rng.choice(values()) for k in KEYS[:-1] if rng.random() < 0.6})


def random_filter(rng: random.Random) -> Filter:
    key, op = rng.choice(KEYS), rng.choice(["eq", "eq", "ne", "gt", "ge", "lt", "le", "exists", "missing"])
    if op in ("exists", "missing"):
        return Filter(key, op)
    if op in ("eq", "ne"):
        pool = ["a", "b", "1", 1, 1.0, 2020, True, False, "true", "2026-05-10", "é\"x"]
        return Filter(key, op, tuple(rng.choice(pool) for _ in range(rng.randint(1, 3))))
    return Filter(key, op, (rng.choice([2020, 2.5, "2026-05-01", 2024]),))


def test_sql_match_equals_python_and_the_index_path_is_a_necessary_condition(db_url):
    rng = random.Random(33)
    passed = 0
    with psycopg.connect(db_url) as conn:
        for _ in range(1500):
            metadata = random_metadata(rng)
            filters = tuple(random_filter(rng) for _ in range(rng.randint(0, 3)))
            expected = all(f.matches(metadata) for f in filters)
            path = metadata_path(filters)
            got, on_path = conn.execute(
                "SELECT kbindex_metadata_match(%s::jsonb, %s::jsonb), %s::jsonpath IS NULL OR %s::jsonb @? %s::jsonpath",
                (json.dumps(metadata), filters_json(filters), path, json.dumps(metadata), path)).fetchone()
            assert got == expected, (metadata, filters)
            if expected:
                passed += 1
                assert on_path, (metadata, filters, path)
    assert passed > 200  # the draw is not all misses
