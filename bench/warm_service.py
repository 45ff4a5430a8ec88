"""The warm embedding service under a bench's ``dagster dev``, started and stopped as ``kbindex dev`` does it.

bench.pipeline, bench.scale.small_docs and bench.scale.migration's real-model round all run their
``dagster dev`` with it, so their runs embed through one warm model instead of loading their own.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def warm_embedding_service(home: str | Path, env: dict[str, str], *, log: Path,
                           enabled: bool = True) -> Iterator[subprocess.Popen[bytes] | None]:
    """Start the embedding service for ``home`` and point ``env``'s runs at it (KBINDEX_EMBED_SERVICE);
    stop it on exit. With ``enabled`` false, yield None and change nothing."""
    if not enabled:
        yield None
        return
    from resources.embedding_service import start_service

    proc = start_service(home, env, log=log)
    env["KBINDEX_EMBED_SERVICE"] = str(home)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
