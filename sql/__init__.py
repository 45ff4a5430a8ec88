"""Named SQL statements, loaded once from ``sql/queries/*.sql``; migrations live in ``sql/migrations/``.

Each statement sits under a header line ``-- name: table_verb`` followed by a one-line
``-- description``. Code uses ``queries["task_claim"]``; statements take ``%(name)s``
parameters only and are never assembled from strings at run time. Two statements of one file that end
alike share that part as a ``-- fragment: name`` block, which a line ``-- include: name`` in each
replaces when the file is loaded (a fragment is not a statement; it is only in its own file).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import LiteralString, cast

_HEADER = re.compile(r"^--\s*(?P<kind>name|fragment):\s*(?P<name>[a-z0-9_]+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^--\s*include:\s*(?P<name>[a-z0-9_]+)\s*$", re.MULTILINE)

SQL_DIR = Path(__file__).resolve().parent
MIGRATIONS_DIR = SQL_DIR / "migrations"


def _parse(text: str, source: str) -> dict[str, LiteralString]:
    found: dict[str, str] = {}
    fragments: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        name, into = match.group("name"), found if match.group("kind") == "name" else fragments
        if name in into:
            raise ValueError(f"duplicate {match.group('kind')} {name!r} in {source}")
        if not body:
            raise ValueError(f"empty {match.group('kind')} {name!r} in {source}")
        into[name] = body

    def include(line: re.Match[str]) -> str:
        if line.group("name") not in fragments:
            raise ValueError(f"unknown fragment {line.group('name')!r} included in {source}")
        return fragments[line.group("name")]

    return {name: cast(LiteralString, _INCLUDE.sub(include, body)) for name, body in found.items()}


def load_queries() -> dict[str, LiteralString]:
    """Every named statement under sql/queries, by name."""
    queries: dict[str, LiteralString] = {}
    folder = resources.files(__package__).joinpath("queries")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, body in _parse(entry.read_text(encoding="utf-8"), entry.name).items():
            if name in queries:
                raise ValueError(f"query name {name!r} defined twice (again in {entry.name})")
            queries[name] = body
    return queries


def migration_files() -> list[tuple[str, str]]:
    """(version, sql) for each migration, in order. Version = file stem, e.g. ``0001_initial``."""
    folder = resources.files(__package__).joinpath("migrations")
    files = sorted((e for e in folder.iterdir() if e.name.endswith(".sql")), key=lambda e: e.name)
    return [(e.name[: -len(".sql")], e.read_text(encoding="utf-8")) for e in files]


queries = load_queries()
