"""One exclusive, time-bounded file lock for processes that share KBINDEX_HOME (POSIX ``flock``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive_file_lock(path: Path, timeout: float, on_timeout: Callable[[], Exception]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing); the kernel drops it if the holder dies.

    Raises ``on_timeout()`` after ``timeout`` seconds rather than waiting forever on a stuck holder.
    """
    import fcntl  # POSIX only, like the Unix sockets kbindex serves on

    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    with open(path, "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise on_timeout() from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
