"""Folders and files only their owner can read: KBINDEX_HOME, blobs, run artifacts, the service key, locks, logs.

Any local user could otherwise read the logs, or hold a lock file (flock needs only read access) and stall
every process of the home (issue #31, finding 5). Folders are 0700, files 0600; the one exception is the
embedded PostgreSQL as root, which runs as its own user: KBINDEX_HOME and its ``postgres`` folder then let
that user's group traverse (0710), nothing more (resources/local_postgres.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

OPEN_TO_OTHERS = 0o067
"""Mode bits a private folder must not have: group read/write, anything for others (group traverse may stay)."""


class HomeNotOwned(PermissionError):
    """KBINDEX_HOME belongs to another user: using it would hand them the database, blobs and keys.

    Not a KbindexError, like HomeNotFound: the path is the point, for the person at the terminal.
    """

    def __init__(self, home: Path, owner: int) -> None:
        self.home = home
        super().__init__(
            f"KBINDEX_HOME {home} belongs to uid {owner}, not to this user (uid {os.geteuid()}): "
            "point KBINDEX_HOME at a folder of yours, or run kbindex as its owner"
        )


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


def private_home(home: str | os.PathLike[str]) -> Path:
    """KBINDEX_HOME, created 0700, or an existing one of ours closed to others (homes made before were 0755).

    HomeNotOwned if another user owns it. A group traverse bit set on purpose (the root case) is kept.
    """
    home = Path(home)
    try:
        st = os.stat(home)
    except FileNotFoundError:
        return make_private_dirs(home)
    if st.st_uid != os.geteuid():
        raise HomeNotOwned(home, st.st_uid)
    mode = stat.S_IMODE(st.st_mode)
    if mode & OPEN_TO_OTHERS:
        os.chmod(home, mode & ~OPEN_TO_OTHERS)
    return home


def open_private_fd(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """``os.open`` creating ``path`` 0600 (whatever the umask), never through a symlink; an existing file
    of ours that others could read (made before) is closed to them first."""
    fd = os.open(path, flags | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: str | os.PathLike[str], mode: str = "ab"):  # noqa: ANN201 - a file object
    """A log or lock opened for appending (``"a"`` or ``"ab"``), created 0600."""
    if mode not in ("a", "ab"):
        raise ValueError(f"open_private appends only, not {mode!r}")
    return os.fdopen(open_private_fd(path), mode)


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path``'s content with ``data``, the file 0600."""
    with os.fdopen(open_private_fd(path, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
        fh.write(data)
