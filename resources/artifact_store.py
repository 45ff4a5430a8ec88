"""Intermediate outputs (parsed documents, chunks, vectors) kept per index task and stage.

Layout: ``root/task-<task_id>/<stage>.pickle``. Task ids are integers the database assigns, never
user data, so they may appear in paths; and a sweep can tell whose a file is from its folder name,
without unpickling it (resources/artifact_sweep.py). Re-execution from failure reads these back
instead of redoing finished steps; a task's folder is deleted when its task ends (RunState.discard)
or, when it ended elsewhere, by the sweep. Files are 0600 in 0700 folders: they hold document text,
and they are pickles (whoever can write one runs code here). So ``get`` loads a file only if it, its
task folder and the root are owned by this process's user, are not group- or other-writable, and are
no symbolic links (issue #31, finding 2); anything else is ArtifactUntrusted and is never unpickled.

Installs before issue #28 kept ``root/<8 hex>-<stage>/<2 hex>/<sha256 of the key>.pickle``: nothing
reads that layout any more, and ``legacy_files`` names those files so that the sweep removes them.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines.domain.errors import ArtifactUntrusted
from resources.private_files import make_private_dirs

_TASK_FOLDER = re.compile(r"task-([1-9][0-9]*)")
_STAGE = re.compile(r"[a-z][a-z0-9_]*")
_OWN_FILE = re.compile(r"[a-z][a-z0-9_]*\.pickle|\.[a-z][a-z0-9_]*\.[0-9a-f]{32}\.tmp")
_LEGACY_FOLDER = re.compile(r"([0-9a-f]{8})-([A-Za-z0-9_-]+)")
_LEGACY_SHARD = re.compile(r"[0-9a-f]{2}")
_LEGACY_FILE = re.compile(r"[0-9a-f]{64}(\.pickle|\.[0-9a-f]{32}\.tmp)")


def artifact_key(task_id: int) -> str:
    """The folder (and store key) of one task's outputs: ``task-<id>``."""
    task_id = int(task_id)
    if task_id < 1:
        raise ValueError(f"not a task id: {task_id}")
    return f"task-{task_id}"


def _task_id(key: int | str) -> int:
    """A task id, given as one or as its ``artifact_key`` (how benches name it)."""
    if not isinstance(key, str):
        artifact_key(key)  # refuses what is not a task id
        return int(key)
    match = _TASK_FOLDER.fullmatch(key)
    if match is None:
        raise ValueError(f"artifacts are kept per task: {key!r} is not a task id or task-<id>")
    return int(match.group(1))


def _stage(stage: str) -> str:
    if _STAGE.fullmatch(stage) is None:
        raise ValueError(f"not a stage name: {stage!r}")
    return stage


class ArtifactStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def task_folder(self, key: int | str) -> Path:
        return self.root / artifact_key(_task_id(key))

    def _path(self, stage: str, key: int | str) -> Path:
        return self.task_folder(key) / f"{_stage(stage)}.pickle"

    def put(self, stage: str, key: int | str, value: Any) -> None:
        path = self._path(stage, key)
        tmp = path.with_name(f".{stage}.{uuid.uuid4().hex}.tmp")
        for _ in range(2):  # the sweep may remove an emptied folder between the mkdir and the open
            make_private_dirs(path.parent)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                break
            except FileNotFoundError:
                continue
        else:
            raise FileNotFoundError(f"could not create {tmp}")
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get(self, stage: str, key: int | str) -> Any:
        """The stored value; raises KeyError if ``stage`` was never stored for this task."""
        path = self._path(stage, key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as exc:
            raise KeyError(f"{stage} has no stored output for {key}") from exc
        except OSError as exc:  # ELOOP: the file is a symbolic link
            raise ArtifactUntrusted(f"{stage} of {key}: not a regular file ({exc.strerror})") from exc
        with os.fdopen(fd, "rb") as fh:
            # Checked on the open descriptor (no swap between the check and the load), then its folders.
            _check_trusted(os.fstat(fh.fileno()), f"{stage} of {key}", regular=True)
            for folder in (path.parent, self.root):
                try:
                    _check_trusted(os.lstat(folder), f"{stage} of {key}: folder {folder.name}", regular=False)
                except FileNotFoundError as exc:  # pragma: no cover - removed while the file was open
                    raise KeyError(f"{stage} has no stored output for {key}") from exc
            return pickle.load(fh)  # only a file this user wrote (put()) and nobody else could have

    def delete(self, stage: str, key: int | str) -> None:
        self._path(stage, key).unlink(missing_ok=True)

    def delete_task(self, key: int | str, *, modified_before: float | None = None) -> int:
        """Delete the task's files (every stage, and temporary files of an interrupted put); the number
        deleted. With ``modified_before`` (a ``time.time()`` value), younger files are kept: a run may
        be writing them. The folder goes when nothing is left in it."""
        folder = self.task_folder(key)
        return _delete_files(folder, _OWN_FILE, modified_before)

    def task_ids(self) -> Iterator[int]:
        """Ids of the tasks that have a folder here, in no particular order (read lazily: a sweep
        takes them in bounded batches)."""
        try:
            entries = os.scandir(self.root)
        except FileNotFoundError:
            return
        with entries:
            for entry in entries:
                match = _TASK_FOLDER.fullmatch(entry.name)
                if match is not None and entry.is_dir(follow_symlinks=False):
                    yield int(match.group(1))

    def legacy_folders(self) -> list[Path]:
        """Top-level folders of the layout before issue #28 (``<8 hex>-<stage>``, the hex being the
        start of the stage name's sha256): nothing reads them any more."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            match = _LEGACY_FOLDER.fullmatch(entry.name)
            if (match is not None and entry.is_dir(follow_symlinks=False)
                    and hashlib.sha256(match.group(2).encode()).hexdigest()[:8] == match.group(1)):
                found.append(Path(entry.path))
        return sorted(found)

    def delete_legacy(self, folder: Path, *, modified_before: float | None = None) -> int:
        """Delete the old-layout files under one of ``legacy_folders()`` (only files of that layout's
        names; anything else is left where it is); the number deleted. Emptied folders go too."""
        deleted = 0
        try:
            shards = list(os.scandir(folder))
        except FileNotFoundError:
            return 0
        for shard in shards:
            if _LEGACY_SHARD.fullmatch(shard.name) and shard.is_dir(follow_symlinks=False):
                deleted += _delete_files(Path(shard.path), _LEGACY_FILE, modified_before)
        _remove_if_empty(folder)
        return deleted


def _check_trusted(st: os.stat_result, what: str, *, regular: bool) -> None:
    """Refuse (ArtifactUntrusted) what another user owns or could have written: not ours, group- or
    other-writable, a symbolic link, or not a regular file / folder as expected."""
    kind_ok = stat.S_ISREG(st.st_mode) if regular else stat.S_ISDIR(st.st_mode)
    if not kind_ok:
        raise ArtifactUntrusted(f"{what}: not a {'regular file' if regular else 'folder'}")
    if st.st_uid != os.geteuid():
        raise ArtifactUntrusted(f"{what}: owned by uid {st.st_uid}, not this process's uid {os.geteuid()}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ArtifactUntrusted(f"{what}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")


def _delete_files(folder: Path, names: re.Pattern[str], modified_before: float | None) -> int:
    deleted = 0
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if names.fullmatch(entry.name) is None or not entry.is_file(follow_symlinks=False):
            continue
        try:
            if modified_before is not None and entry.stat(follow_symlinks=False).st_mtime >= modified_before:
                continue
            os.unlink(entry.path)
        except FileNotFoundError:
            continue
        deleted += 1
    _remove_if_empty(folder)
    return deleted


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not empty (a younger file, a put in flight, or not ours), or already gone
        pass
