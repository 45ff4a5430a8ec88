"""The content-addressed blob store: write once, read back, never escape its root."""

import pytest

from pipelines.domain.errors import BlobNotFound, InvalidRequest
from resources.blob_store import BlobStore, content_hash


def test_put_get_roundtrip_and_dedup(tmp_path):
    store = BlobStore(str(tmp_path))
    a = store.put(b"bytes")
    b = store.put(b"bytes")
    assert a == b == content_hash(b"bytes")
    assert store.get(a) == b"bytes"
    assert len([p for p in tmp_path.rglob("*") if p.is_file()]) == 1


def test_missing_blob_is_blob_not_found(tmp_path):
    with pytest.raises(BlobNotFound):
        BlobStore(str(tmp_path)).get("0" * 64)


@pytest.mark.parametrize("key", ["../../etc/passwd", "/etc/passwd", "ab", "Z" * 64])
def test_keys_that_are_not_hashes_are_refused(tmp_path, key):
    with pytest.raises(InvalidRequest):
        BlobStore(str(tmp_path)).get(key)


def test_memory_filesystem_works_too():
    store = BlobStore("memory://kbindex-test-blobs")
    digest = store.put(b"in memory")
    assert store.get(digest) == b"in memory"
