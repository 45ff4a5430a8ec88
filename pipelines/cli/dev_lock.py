"""One `kbindex dev` per KBINDEX_HOME: an exclusive ``flock`` it holds until it exits (the kernel drops it if killed).

A second one on the same home started a second Dagster daemon on the same instance, bound the embedding service's
socket over the first's and shared its stop file; it is now refused before it starts anything.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

from pipelines.domain.errors import DevAlreadyRunning
from resources.file_lock import exclusive_file_lock

LOCK_NAME = "kbindex-dev.lock"


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def hold_dev_lock(home: Path) -> ExitStack:
    """Take the home's `kbindex dev` lock without waiting, and write our pid in it. Keep the result for as long
    as the lock must hold (dropped, it is released) and close it to release it.

    Raises DevAlreadyRunning, naming the holder's pid, if another process holds it."""
    path = home / LOCK_NAME
    held = ExitStack()

    def refused() -> DevAlreadyRunning:
        pid = _holder(path)
        return DevAlreadyRunning(f"kbindex dev is already running on this KBINDEX_HOME (pid {pid}): stop it "
                                 f"(Ctrl-C in its terminal, or kill -TERM {pid}), "
                                 "or set KBINDEX_HOME to another folder")

    held.enter_context(exclusive_file_lock(path, 0, refused))
    path.write_text(f"{os.getpid()}\n")  # the lock is on the open file, not its contents: rewriting it keeps it
    return held
