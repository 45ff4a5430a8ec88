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
