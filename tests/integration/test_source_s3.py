"""Sources and document bytes on S3, against a real S3-compatible server the test starts: moto's server mode
on 127.0.0.1 and a free port, fake credentials, and the endpoint forced through the environment, so nothing
here can reach a real cloud (s3fs -> aiobotocore -> botocore honours AWS_ENDPOINT_URL)."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from resources.blob_store import BlobStore  # noqa: E402
from resources.publisher import Publisher  # noqa: E402
from resources.source_sync import SourceSync  # noqa: E402
from tests.integration.test_source_sync import versions  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    """An s3fs filesystem on the moto server, and an environment in which any other S3 client lands there too."""
    import fsspec

    for key, value in {
        "AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "fake-key", "AWS_SECRET_ACCESS_KEY": "fake-secret",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-creds"),
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    fsspec.filesystem("s3").clear_instance_cache()
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    assert fs.s3._endpoint.host == s3_endpoint  # the server started above, never a cloud
    return fs


def test_a_bucket_prefix_syncs_like_a_folder(s3, db, db_url, tmp_path):
    s3.mkdir("share")
    for i in range(5):
        s3.pipe(f"share/docs/team/p{i}.md", f"# Policy {i}\n".encode())
    s3.pipe("share/other/x.md", b"outside the prefix")
    sources = SourceSync(db, Publisher(db, BlobStore(str(tmp_path / "blobs"))))
    sources.add("bucket", "acme", "s3://share/docs")

    first = sources.sync("bucket")
    assert (first.listed, first.read, first.published) == (5, 5, 5), first
    assert sorted(versions(db_url)) == [f"team/p{i}.md" for i in range(5)]
    assert sources.sync("bucket").read == 0  # ETags unchanged: nothing read

    s3.pipe("share/docs/team/p0.md", b"# Policy 0\n\nAmended.\n")
    s3.rm("share/docs/team/p4.md")
    counts = sources.sync("bucket")
    assert (counts.read, counts.published, counts.deleted) == (1, 1, 1), counts  # 1 of 5 vanished: 20%
    assert versions(db_url)["team/p0.md"] == ["content", "content"] and versions(db_url)["team/p4.md"][-1] == "tombstone"

    for path in s3.find("share/docs"):
        s3.rm(path)
    held = sources.sync("bucket")  # an emptied prefix is a failed or empty listing: nothing deleted
    assert held.deleted == 0 and held.deletes_blocked, held
    assert sources.sync("bucket", allow_mass_delete=True).deleted == 4


def test_a_missing_bucket_fails_to_list_and_deletes_nothing(s3, db, tmp_path):
    sources = SourceSync(db, Publisher(db, BlobStore(str(tmp_path / "blobs"))))
    sources.add("ghost", "acme", "s3://no-such-bucket/docs")
    counts = sources.sync("ghost", allow_mass_delete=True)
    assert counts.list_error and counts.deleted == 0 and counts.read == 0, counts


def test_document_bytes_in_s3_blob_url(s3, db, db_url):
    """KBINDEX_BLOB_URL=s3://...: a publish stores the bytes in the bucket, content-addressed; the index run's
    read, the idempotent re-publish and garbage collection's listing see the same objects."""
    s3.mkdir("kb-blobs")
    blobs = BlobStore("s3://kb-blobs/tenant-bytes")
    published = Publisher(db, blobs).publish("acme", "refunds.md", b"# Refunds\n\nWithin 30 days.\n", "refunds.md")
    digest = published.content_hash
    assert s3.cat(f"kb-blobs/tenant-bytes/sha256/{digest[:2]}/{digest[2:4]}/{digest}") == b"# Refunds\n\nWithin 30 days.\n"
    assert blobs.get(digest) == b"# Refunds\n\nWithin 30 days.\n" and blobs.exists(digest)
    again = Publisher(db, blobs).publish("acme", "refunds.md", b"# Refunds\n\nWithin 30 days.\n", "refunds.md")
    assert (again.version, again.created) == (1, False)
    stored = list(blobs.stored())
    assert [name for name, _, _ in stored] == [digest]
    blobs.delete(stored[0][2])
    assert not blobs.exists(digest)
