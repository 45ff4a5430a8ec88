"""Benchmarks (not installed; run from the checkout with python -m bench.<name>)."""

from collections.abc import Iterator
from contextlib import contextmanager

from resources.local_postgres import temporary_server


@contextmanager
def server_url() -> Iterator[str]:
    """KBINDEX_DATABASE_URL (an admin URL), or a throwaway embedded PostgreSQL under a temporary folder."""
    with temporary_server("kbindex-bench-pg-", external_env="KBINDEX_DATABASE_URL") as url:
        yield url
