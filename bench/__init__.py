"""Benchmarks (not installed; run from the checkout with python -m bench.<name>)."""

from collections.abc import Iterator
from contextlib import contextmanager

from resources.local_postgres import temporary_server


@contextmanager
def server_url() -> Iterator[str]:
    """KBINDEX_DATABASE_URL (an admin URL), or a throwaway embedded PostgreSQL under a temporary folder."""
    with temporary_server("kbindex-bench-pg-", external_env="KBINDEX_DATABASE_URL") as url:
        yield url


def share_built_models() -> None:
    """Build derived models (the default profile's int8) once, in your KBINDEX_HOME's models folder, for
    the bench's scratch homes, its embedding service and its bare-encode processes alike (unless
    KBINDEX_MODELS_DIR already names a folder): not once per bench, on the clock."""
    import os

    from resources.settings import Settings

    os.environ.setdefault("KBINDEX_MODELS_DIR", str(Settings.from_env().home / "models"))
