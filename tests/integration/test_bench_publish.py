"""The CI-sized bench.publish round: publish_many and one publish per document, side by side, equal work."""

from __future__ import annotations

from bench.publish import render, run


def test_both_sides_publish_every_document_and_the_batch_in_one_transaction():
    lines: list[str] = []
    report = run(None, 40, 2, out=lines.append)
    shown = "\n".join(lines) + "\n" + render(report)
    many, each = report["samples"]["publish_many"], report["samples"]["publish each"]
    assert [s["versions"] for s in many + each] == [40] * 4, shown  # equal work: every version, each side
    assert [s["transactions"] for s in many] == [1, 1], shown
    assert [s["transactions"] for s in each] == [40, 40], shown
    assert report["ratio"] > 0 and "publish each / publish_many" in shown, shown


def test_through_the_api_the_batch_endpoint_commits_once_and_one_post_each_once_per_document():
    lines: list[str] = []
    report = run(None, 30, 2, out=lines.append, http=True)
    shown = "\n".join(lines) + "\n" + render(report)
    batch, each = report["samples"]["POST /documents"], report["samples"]["POST each"]
    assert [s["versions"] for s in batch + each] == [30] * 4, shown
    assert [s["transactions"] for s in batch] == [1, 1], shown
    assert [s["transactions"] for s in each] == [30, 30], shown
    assert "POST each / POST /documents" in shown, shown


def test_a_manifest_and_shared_metadata_publish_the_same_batches_with_metadata_on_every_version(db_url):
    """--manifest: both sides POST /documents in one transaction; every version carries metadata and an allow
    list, per document on the manifest side (equal work but for reading the manifest)."""
    lines: list[str] = []
    report = run(None, 30, 2, out=lines.append, manifest=True)
    shown = "\n".join(lines) + "\n" + render(report)
    shared, manifest = report["samples"]["shared metadata"], report["samples"]["manifest"]
    assert [s["versions"] for s in shared + manifest] == [30] * 4, shown
    assert [s["transactions"] for s in shared + manifest] == [1] * 4, shown
    assert report["metadata"] == {"shared metadata": [30, 30], "manifest": [30, 30]}, shown
    assert report["distinct_allow"] == {"shared metadata": [1, 1], "manifest": [5, 5]}, shown
    assert "manifest / shared metadata" in shown, shown


def test_padded_metadata_makes_a_manifest_of_the_size_asked_on_both_sides_alike(db_url):
    """--metadata-bytes: each version's metadata is padded to about that size on both sides, so the manifest part
    grows with the batch while the shared part stays one version's worth; every version still gets it."""
    import json

    from bench.publish import _metadata

    assert len(json.dumps(_metadata(3, 4000))) == 4000 and _metadata(3) == _metadata(3, 0)
    report = run(None, 10, 1, out=lambda _: None, manifest=True, metadata_bytes=4000)
    shared, manifest = report["samples"]["shared metadata"][0], report["samples"]["manifest"][0]
    assert 4000 <= shared["largest_part_bytes"] < 4100, shared
    assert 10 * 4000 <= manifest["largest_part_bytes"] < 10 * 4200, manifest
    assert report["metadata"] == {"shared metadata": [10], "manifest": [10]}


def test_over_a_slow_link_a_batch_costs_a_few_round_trips_and_a_publish_a_few_each():
    """--delay-ms: 10 ms each way through bench/relay.py. The batch goes in a pipelined transaction, so once the pool
    is connected 20 documents cost it under 8 round trips (0.10 s here, ~5: the quota pre-check, BEGIN with the
    locks and the latest versions, the rows with their tasks, the totals with COMMIT; 0.24 s, ~12, with BEGIN,
    COMMIT and each lock kind waited for; at b2e5087, one round trip a statement, ~150). One publish per document
    pays under 4.2 each: the quota pre-check, then a pipelined transaction (the locks with the latest version, then
    the row, its tasks and the server's refusals with the COMMIT) and no check of a connection just returned (~3.4
    each with --docs 50; ~4.5 when the tasks were read before COMMIT was sent; ~13 before the pipeline and the idle
    check)."""
    lines: list[str] = []
    report = run(None, 20, 2, out=lines.append, delay_ms=10)
    shown = "\n".join(lines) + "\n" + render(report)
    many, each = report["samples"]["publish_many"], report["samples"]["publish each"]
    round_trip = 2 * 10 / 1000
    assert [s["versions"] for s in many + each] == [20] * 4, shown
    assert min(s["seconds"] for s in each) > 20 * 2 * round_trip, shown  # the link is in the way: 2+ a document
    assert max(s["seconds"] for s in each) < 20 * 4.2 * round_trip, shown
    assert many[0]["seconds"] < 60 * round_trip, shown  # the first round connects the pool through the relay too
    assert many[1]["seconds"] < 8 * round_trip, shown
    assert "through a relay adding 10 ms each way" in shown, shown
