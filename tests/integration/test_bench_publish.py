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
