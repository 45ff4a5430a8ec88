"""Intermediate outputs (parsed documents, chunks, vectors) kept per asset and partition key.

Dagster's built-in IO managers refuse outputs that cover several partitions; a run here covers
many versions, so each asset returns ``{partition_key: value}`` and this store keeps one file per
key. Keys are user data, so the file name is a digest of the key, never the key itself.
Re-execution from failure reads these back instead of redoing finished steps. Files are 0600 in
0700 folders: they hold document text, and they are pickles (whoever can write one runs code here).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import uuid
from pathlib import Path
from typing import Any

from resources.private_files import make_private_dirs


class ArtifactStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, asset: str, key: str) -> Path:
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        safe_asset = hashlib.sha256(asset.encode("utf-8")).hexdigest()[:8] + "-" + "".join(
            ch for ch in asset if ch.isalnum() or ch in "_-"
        )
        return self.root / safe_asset / digest[:2] / f"{digest}.pickle"

    def put(self, asset: str, key: str, value: Any) -> None:
        path = self._path(asset, key)
        make_private_dirs(path.parent)
        tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)

    def get(self, asset: str, key: str) -> Any:
        """The stored value; raises KeyError if this asset was never materialized for ``key``."""
        path = self._path(asset, key)
        try:
            with open(path, "rb") as fh:
                return pickle.load(fh)  # our own files, written by put(); never user-supplied
        except FileNotFoundError as exc:
            raise KeyError(f"{asset} has no stored output for {key}") from exc

    def delete(self, asset: str, key: str) -> None:
        self._path(asset, key).unlink(missing_ok=True)
