"""Content-addressed storage of document bytes: a local folder by default, any fsspec URL in production.

Blobs are written under their SHA-256, so a name from a user never becomes a path: ``../`` or an
absolute filename cannot leave the store. Writing the same bytes twice stores them once.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid

import fsspec

from pipelines.domain.errors import BlobNotFound, InvalidRequest

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
        if self.fs.exists(path):
            return digest
        parent = path.rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        if self._local:
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)  # atomic: readers never see a partial blob
        else:
            self.fs.pipe_file(path, data)
        return digest

    def get(self, digest: str) -> bytes:
        path = self._path(digest)
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError as exc:
            raise BlobNotFound(f"the stored bytes of this version are missing (sha256 {digest[:12]}…)") from exc

    def exists(self, digest: str) -> bool:
        return self.fs.exists(self._path(digest))
