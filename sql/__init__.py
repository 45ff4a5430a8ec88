"""Named SQL statements, loaded once from ``sql/queries/*.sql``; migrations live in ``sql/migrations/``.

Each statement sits under a header line ``-- name: table_verb`` followed by a one-line
``-- description``. Code uses ``queries["task_claim"]``; statements take ``%(name)s``
parameters only and are never assembled from strings.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import LiteralString, cast

_HEADER = re.compile(r"^--\s*name:\s*(?P<name>[a-z0-9_]+)\s*$", re.MULTILINE)

SQL_DIR = Path(__file__).resolve().parent
MIGRATIONS_DIR = SQL_DIR / "migrations"


def _parse(text: str, source: str) -> dict[str, LiteralString]:
    found: dict[str, LiteralString] = {}
    matches = list(_HEADER.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        name = match.group("name")
        if name in found:
            raise ValueError(f"duplicate query name {name!r} in {source}")
        if not body:
            raise ValueError(f"empty query {name!r} in {source}")
        found[name] = cast(LiteralString, body)
    return found


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
