"""Reading EXPLAIN (FORMAT JSON) plans in tests: every node, and the rows a node read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The node and every node under it, CTEs and subplans included."""
    yield node
    for child in node.get("Plans", []):
        yield from walk(child)


def rows_read(node: dict[str, Any]) -> int:
    """Rows the node produced or threw away (filter, recheck), over all its loops."""
    per_loop = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0))
    return int(per_loop * node.get("Actual Loops", 1))
