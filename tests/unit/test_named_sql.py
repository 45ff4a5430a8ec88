"""Named SQL: every statement name the code uses exists, every statement is used, none is built from strings."""

import ast
from pathlib import Path

from sql import queries

ROOT = Path(__file__).resolve().parents[2]
CALLS = {"fetch_one", "fetch_all", "execute", "execute_many", "fetch_many", "submit"}
BENCH_CALLS = {"_sql": 1, "q": 0, "sql": 0}
"""The benches' own helpers (bench.chaos._sql(url, name, ...), its ``q`` shorthands, bench.pipeline's Bench.sql),
by the position of the statement name."""


def _names_used(folders=("pipelines", "resources", "bench")) -> dict[str, list[str]]:
    """Literal statement names passed to the Database/Session helpers and the benches' own (no inline SQL)."""
    used: dict[str, list[str]] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in CALLS
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    used.setdefault(node.args[0].value, []).append(str(path.relative_to(ROOT)))
                if isinstance(node, ast.Call):
                    called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                    at = BENCH_CALLS.get(called)
                    if (at is not None and len(node.args) > at and isinstance(node.args[at], ast.Constant)
                            and isinstance(node.args[at].value, str)):
                        used.setdefault(node.args[at].value, []).append(str(path.relative_to(ROOT)))
                if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "queries":
                    if isinstance(node.slice, ast.Constant):
                        used.setdefault(node.slice.value, []).append(str(path.relative_to(ROOT)))
    return used


def test_every_name_the_code_uses_exists():
    missing = {name: where for name, where in _names_used().items() if name not in queries}
    assert not missing, f"unknown query names: {missing}"


def test_every_statement_is_used_somewhere():
    used = set(_names_used())
    text = "\n".join(
        p.read_text(encoding="utf-8") for folder in ("pipelines", "resources", "bench", "tests") for p in (ROOT / folder).rglob("*.py")
    )
    # The verifier runs its checks by name: "verify_" + the check name it reports.
    unused = sorted(
        n for n in queries
        if n not in used and f'"{n}"' not in text and not (n.startswith("verify_") and f'"{n[len("verify_"):]}"' in text)
    )
    assert not unused, f"statements nothing runs: {unused}"


def test_statements_take_parameters_not_formatting():
    for name, body in queries.items():
        assert "{" not in body.replace("'{}'", "").replace("{}", ""), f"{name} looks like a format string"


def test_no_statement_has_a_stray_percent_sign():
    """psycopg reads every % of a statement, comments too: anything but %(name)s, %(name)b or %% breaks it
    at run time ("incomplete placeholder"), and only for the code path that runs that statement."""
    import re

    stray = {name: text for name, text in queries.items()
             if "%" in re.sub(r"%%|%\(\w+\)[sbt]", "", str(text))}
    assert not stray, f"escape it as %% or reword: {sorted(stray)}"


def test_a_fragment_is_included_where_a_statement_names_it_and_is_no_statement_itself():
    import pytest

    from sql import _parse

    text = ("-- name: a_one\nSELECT 1 AS x\n-- include: tail\n\n-- fragment: tail\nFROM t;\n\n"
            "-- name: a_two\nSELECT 2 AS x\n-- include: tail\n")
    assert _parse(text, "t.sql") == {"a_one": "SELECT 1 AS x\nFROM t;", "a_two": "SELECT 2 AS x\nFROM t;"}
    with pytest.raises(ValueError, match="unknown fragment 'nope'"):
        _parse("-- name: a_one\nSELECT 1\n-- include: nope\n", "t.sql")
    with pytest.raises(ValueError, match="duplicate fragment 'tail'"):
        _parse("-- fragment: tail\nA\n-- fragment: tail\nB\n", "t.sql")
    assert "lexical_hits_tail" not in queries and "-- include:" not in queries["lexical_hits_pruned"]
    assert queries["lexical_hits"].endswith(queries["lexical_hits_pruned"][-200:])  # the same tail in both
