"""Content-addressed storage of document bytes: a local folder by default, any fsspec URL in production.

Blobs are written under their SHA-256, so a name from a user never becomes a path: ``../`` or an
absolute filename cannot leave the store. Writing the same bytes twice stores them once (and marks
the blob as just written, so garbage collection leaves it to the publish that is using it). In a
local folder, blobs are 0600 files in 0700 folders: other local users cannot read documents.
``stored()`` and ``delete()`` serve the retention job's garbage collection (resources/blob_gc.py).

Known and accepted (issue #31, finding 9): the key is the bytes' hash alone, shared by every tenant, so a
tenant that times its publish (a second copy is not written) can tell whether *some* tenant already stored
exactly these bytes; it learns nothing of who, nor of any byte it did not already hold. Per-tenant keys
(hash of tenant and bytes) would close it but need a migration that copies every stored blob to its new
key(s) and rewrites every version's content_hash while publishes, runs and erases keep reading them (and
the erase's "another version still names this hash" check would change meaning); not done.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
from collections.abc import Iterator

import fsspec

from pipelines.domain.errors import BlobNotFound, InvalidRequest
from resources.private_files import make_private_dirs

_HASH_RE = re.compile(r"^[0-9a-f]{64}$")


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BlobStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, root = fsspec.core.url_to_fs(url)
        self.root = root.rstrip("/")
        self._local = self.fs.protocol in ("file", ("file", "local")) or "file" in (
            self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        )

    def _path(self, digest: str) -> str:
        if not _HASH_RE.match(digest):
            raise InvalidRequest("not a content hash")
        return f"{self.root}/sha256/{digest[:2]}/{digest[2:4]}/{digest}"

    def put(self, data: bytes) -> str:
        """Store ``data``; returns its SHA-256 hex digest (the key)."""
        digest = content_hash(data)
        path = self._path(digest)
        if self._local:
            if os.path.exists(path):
                os.utime(path)  # fresh again: garbage collection spares blobs younger than its grace period
                return digest
            make_private_dirs(path.rsplit("/", 1)[0])
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)  # atomic: readers never see a partial blob
        else:
            self.fs.pipe_file(path, data)  # always written: that also renews its modification time
        return digest

    def stored(self) -> Iterator[tuple[str, float, str]]:
        """Every stored file as (digest or "" for a leftover temporary file, age in seconds, path)."""
        top = f"{self.root}/sha256"
        if not self.fs.exists(top):
            return
        now = time.time()
        for path, info in self.fs.find(top, detail=True).items():
            name = path.rsplit("/", 1)[-1]
            modified = info.get("mtime") or info.get("LastModified") or info.get("last_modified") or info.get("created")
            if hasattr(modified, "timestamp"):
                modified = modified.timestamp()
            age = now - float(modified) if modified is not None else 0.0  # unknown age: treated as new
            yield (name if _HASH_RE.match(name) else "", age, path)

    def delete(self, path: str) -> None:
        """Remove one stored file named by ``stored()`` (missing is fine)."""
        if not path.startswith(f"{self.root}/sha256/"):
            raise InvalidRequest("not a path of this blob store")
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def erase(self, digest: str, *, stored_before: float) -> str:
        """Delete one blob for an erase (resources/eraser.py): ``deleted``, ``missing``, or ``renewed`` (kept: a
        publish stored the same bytes at or after ``stored_before``, a ``time.time()`` value, and may be about
        to commit a version that needs them; blob garbage collection removes them if none does)."""
        path = self._path(digest)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return "missing"
        modified = info.get("mtime") or info.get("LastModified") or info.get("last_modified")
        if hasattr(modified, "timestamp"):
            modified = modified.timestamp()
        if modified is not None and float(modified) >= stored_before:
            return "renewed"
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            return "missing"
        return "deleted"

    def get(self, digest: str) -> bytes:
        path = self._path(digest)
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError as exc:
            raise BlobNotFound(f"the stored bytes of this version are missing (sha256 {digest[:12]}…)") from exc

    def exists(self, digest: str) -> bool:
        return self.fs.exists(self._path(digest))
