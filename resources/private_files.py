"""Folders and files only their owner can read: KBINDEX_HOME, blobs, run artifacts, the service key."""

from __future__ import annotations

import os
from pathlib import Path


def make_private_dirs(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` and every missing parent as 0700 (``os.makedirs``' mode covers only the last one).

    Existing folders are left as they are: their owner chose their mode.
    """
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
        else:
            os.chmod(folder, 0o700)  # mkdir's mode is filtered by the umask
    return path
