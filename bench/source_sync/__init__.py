"""A sync pass over N unchanged files reads none of their bytes, and costs about a directory walk.

``python -m bench.source_sync --files 100000`` creates N tiny files (1,000 per folder) in a temporary folder,
registers it as a source, fills the ledger as a first pass would leave it (``--first-pass publish`` runs the
real first pass instead: N publishes), then times R passes over the unchanged folder beside a plain
``os.walk`` and a ``scandir`` walk that also stats every file (what a listing needs for size and mtime), in
the same run, alternating. Every open of a file under the folder is counted during the passes (builtins.open,
os.open, fsspec's local open): the figure that matters is 0.
"""

from __future__ import annotations

import builtins
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from fsspec.implementations.local import LocalFileSystem

from resources.blob_store import content_hash
from resources.database import Database
from resources.source_sync import SourceSync, list_location

PER_FOLDER = 1000


def make_tree(root: Path, files: int) -> dict[str, bytes]:
    """N tiny files, PER_FOLDER per folder; returns path (relative) -> bytes."""
    made: dict[str, bytes] = {}
    for i in range(files):
        rel = f"d{i // PER_FOLDER:04d}/f{i:07d}.txt"
        data = f"file {i}\n".encode()
        path = root / rel
        if i % PER_FOLDER == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        made[rel] = data
    return made


def seed_ledger(db: Database, name: str, url: str, glob: str, made: dict[str, bytes]) -> int:
    """The ledger a first pass leaves, written in one batch (hashes of the bytes we wrote, stamps from a listing)."""
    _, _, listing = list_location(url, glob)
    rows = [{"name": name, "path": item.path, "document_id": item.path, "byte_size": item.size, "stamp": item.stamp,
             "content_hash": content_hash(made[item.path]), "pass": 0} for item in listing]
    with db.transaction() as tx:
        tx.execute_many("source_file_upsert", rows)
    return len(rows)


@contextmanager
def count_opens(root: Path) -> Iterator[list[str]]:
    """Every open of a path under ``root`` while inside (builtins.open, os.open, fsspec's local open)."""
    opened: list[str] = []
    prefix = str(root)
    real_open, real_os_open, real_fs_open = builtins.open, os.open, LocalFileSystem._open

    def under(path: Any) -> bool:
        return isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(prefix)

    def spy_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if under(file):
            opened.append(os.fspath(file))
        return real_open(file, *args, **kwargs)

    def spy_os_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if under(path):
            opened.append(os.fspath(path))
        return real_os_open(path, *args, **kwargs)

    def spy_fs_open(self: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        if under(path):
            opened.append(os.fspath(path))
        return real_fs_open(self, path, *args, **kwargs)

    with mock.patch("builtins.open", spy_open), mock.patch("os.open", spy_os_open), \
            mock.patch.object(LocalFileSystem, "_open", spy_fs_open):
        yield opened


def walk_seconds(root: Path) -> tuple[float, int]:
    started, n = time.perf_counter(), 0
    for _, _, files in os.walk(root):
        n += len(files)
    return time.perf_counter() - started, n


def scandir_stat_seconds(root: Path) -> tuple[float, int]:
    """A walk that also stats each file (size and mtime): the least any listing with stamps must do."""
    started, n, stack = time.perf_counter(), 0, [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    entry.stat(follow_symlinks=False)
                    n += 1
    return time.perf_counter() - started, n


def measure(sources: SourceSync, name: str, root: Path, rounds: int) -> dict[str, Any]:
    """R unchanged passes beside os.walk and scandir+stat, alternating; opens counted during the passes."""
    walk_seconds(root)  # warm the dentry cache for all three alike
    passes, listings, walks, stats_walks, opens = [], [], [], [], 0
    counts = None
    for _ in range(rounds):
        walks.append(walk_seconds(root)[0])
        stats_walks.append(scandir_stat_seconds(root)[0])
        started = time.perf_counter()
        list_location(str(root), "**")
        listings.append(time.perf_counter() - started)
        with count_opens(root) as opened:
            started = time.perf_counter()
            counts = sources.sync(name)
            passes.append(time.perf_counter() - started)
        opens += len(opened)
    assert counts is not None
    med = statistics.median
    return {
        "files": counts.listed, "rounds": rounds, "unchanged": counts.unchanged, "read": counts.read,
        "published": counts.published, "deleted": counts.deleted, "file_opens_during_passes": opens,
        "pass_seconds": round(med(passes), 3), "listing_seconds": round(med(listings), 3),
        "os_walk_seconds": round(med(walks), 3), "scandir_stat_seconds": round(med(stats_walks), 3),
        "pass_over_os_walk": round(med(passes) / med(walks), 1),
        "pass_over_scandir_stat": round(med(passes) / med(stats_walks), 1),
        "all_pass_seconds": [round(p, 3) for p in passes],
    }
