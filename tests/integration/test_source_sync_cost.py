"""Issue 29's target, CI-sized: a pass over 2,000 unchanged files (after a real first pass that published them)
reads none of their bytes: no open of any file under the source, counted by patching builtins.open, os.open and
fsspec's local open. Its time is printed beside os.walk and a scandir+stat walk of the same folder
(bench/source_sync does the same at 100,000 files)."""

from __future__ import annotations

import os

from bench.source_sync import count_opens, make_tree, measure
from resources.blob_store import BlobStore
from resources.publisher import Publisher
from resources.source_sync import SourceSync

FILES = 2000


def test_a_pass_over_unchanged_files_opens_none_of_them(db, tmp_path):
    root = tmp_path / "share"
    make_tree(root, FILES)
    sources = SourceSync(db, Publisher(db, BlobStore(str(tmp_path / "blobs"))))
    sources.add("share", "acme", str(root))
    with count_opens(root) as first_opens:
        first = sources.sync("share")
    assert (first.read, first.published) == (FILES, FILES), first
    assert len(first_opens) >= FILES  # the spy sees reads: a zero below means none happened, not a blind spy

    report = measure(sources, "share", root, rounds=3)
    print(f"\n{FILES} unchanged files: pass {report['pass_seconds']} s, listing "
          f"{report['listing_seconds']} s, os.walk {report['os_walk_seconds']} s, "
          f"scandir+stat {report['scandir_stat_seconds']} s")
    assert (report["unchanged"], report["read"], report["file_opens_during_passes"]) == (FILES, 0, 0), report

    changed = root / "d0001" / "f0001500.txt"
    changed.write_bytes(b"changed")
    with count_opens(root) as opened:
        counts = sources.sync("share")
    assert (counts.read, counts.published, counts.unchanged) == (1, 1, FILES - 1), counts
    assert opened and {os.path.realpath(p) for p in opened} == {os.path.realpath(changed)}
