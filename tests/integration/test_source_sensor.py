"""The source sensor (pipelines/source_sensor.py): one pass per source per tick, counts on the tick, state
in PostgreSQL (a fresh context without a cursor finds nothing to do)."""

from __future__ import annotations

import dagster as dg

from pipelines.definitions import defs
from pipelines.source_sensor import sync_sources
from resources.blob_store import BlobStore
from resources.dagster_resources import BlobStoreResource, DatabaseResource
from resources.publisher import Publisher
from resources.source_sync import SourceSync


def tick(db_url: str, blob_dir: str) -> dg.SkipReason:
    resources = {"database": DatabaseResource(url=db_url), "blobs": BlobStoreResource(url=blob_dir)}
    with dg.build_sensor_context(resources=resources) as context:  # no cursor: every tick starts fresh
        return sync_sources(context)


def test_each_tick_syncs_every_source_and_says_how_much(db, db_url, tmp_path):
    share, wiki = tmp_path / "share", tmp_path / "wiki"
    for folder, n in ((share, 4), (wiki, 2)):
        folder.mkdir()
        for i in range(n):
            (folder / f"{folder.name}{i}.md").write_text(f"{folder.name} {i}")
    sources = SourceSync(db, Publisher(db, BlobStore(str(tmp_path / "b"))))
    assert "no sources" in tick(db_url, str(tmp_path / "b")).skip_message
    sources.add("share", "acme", str(share))
    sources.add("wiki", "acme", str(wiki), id_prefix="wiki/")  # two unprefixed sources of a tenant: SOURCE_OVERLAP

    first = tick(db_url, str(tmp_path / "b")).skip_message
    assert "share: listed 4, unchanged 0, read 4, published 4" in first, first
    assert "wiki: listed 2, unchanged 0, read 2, published 2" in first, first
    second = tick(db_url, str(tmp_path / "b")).skip_message  # a lost cursor costs nothing: the ledger says
    assert "share: listed 4, unchanged 4, read 0, published 0" in second, second
    for f in share.iterdir():
        f.unlink()
    third = tick(db_url, str(tmp_path / "b")).skip_message
    assert "share: listed 0" in third and "deleted 0/4 vanished" in third and "deleted nothing" in third, third
    assert [s.passes for s in sources.list()] == [3, 3]


def test_the_sensor_is_in_the_code_location_and_runs_by_default():
    sensor = defs.get_repository_def().get_sensor_def("sync_sources")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_a_rehash_slice_per_tick_reads_that_many_unchanged_files(db, db_url, tmp_path, monkeypatch):
    """KBINDEX_SOURCE_REHASH_PER_PASS: each tick reads and hashes that many files whose size and stamp did not
    move; without it (the default) a tick over unchanged files reads none."""
    import pipelines.source_sensor as sensor_module

    share = tmp_path / "share"
    share.mkdir()
    for i in range(5):
        (share / f"d{i}.md").write_text(f"doc {i}")
    SourceSync(db, Publisher(db, BlobStore(str(tmp_path / "b")))).add("share", "acme", str(share))
    tick(db_url, str(tmp_path / "b"))
    assert "share: listed 5, unchanged 5, read 0" in tick(db_url, str(tmp_path / "b")).skip_message
    monkeypatch.setattr(sensor_module, "REHASH_PER_PASS", 2)
    message = tick(db_url, str(tmp_path / "b")).skip_message
    assert "share: listed 5, unchanged 3, read 2" in message and "rehashed 2 (0 changed" in message, message
