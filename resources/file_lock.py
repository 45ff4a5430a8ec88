"""One exclusive, time-bounded file lock for processes that share KBINDEX_HOME (POSIX ``flock``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from resources.private_files import make_private_dirs, open_private_fd


@contextmanager
def exclusive_file_lock(path: Path, timeout: float, on_timeout: Callable[[], Exception]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600 if missing); the kernel drops it if the holder dies.

    Raises ``on_timeout()`` after ``timeout`` seconds rather than waiting forever on a stuck holder. The
    file is 0600 in a 0700 folder: another local user cannot open it, so cannot hold it (issue #31).
    """
    import fcntl  # POSIX only, like the Unix sockets kbindex serves on

    make_private_dirs(path.parent)
    deadline = time.monotonic() + timeout
    pause = 0.001  # doubling to 50 ms: a lock held for microseconds (the rate limiter's) is retaken quickly
    with os.fdopen(open_private_fd(path), "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise on_timeout() from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
