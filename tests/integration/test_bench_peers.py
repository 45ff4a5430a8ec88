"""bench.peers at test size: three small documents through LlamaIndex and through kbindex's IndexingRun.

Checks the counts the bench reports: a re-run of the same documents embeds nothing on either side, an
edit of one document re-embeds something on both, and the report has every field ``render`` prints.
Skipped when LlamaIndex (the ``peers`` extra) is not installed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("llama_index.embeddings.huggingface")

from bench.peers import render, run  # noqa: E402


def documents() -> list[tuple[str, bytes]]:
    def doc(d: int) -> bytes:
        paragraphs = [" ".join(f"Rule {d}.{p}.{s} keeps records of kind {p * 4 + s} for {(p + s) % 7 + 1} years."
                               for s in range(4)) for p in range(6)]
        return f"Handbook {d}\n\n".encode() + "\n\n".join(paragraphs).encode()

    return [(f"handbook-{d}.txt", doc(d)) for d in range(3)]


@pytest.mark.timeout(300)
def test_rerun_embeds_nothing_and_an_edit_re_embeds_on_both_sides(db_url) -> None:
    lines: list[str] = []
    report = run(documents(), batch_size=16, bare_parallel=False, database_url=db_url, out=lines.append)

    first = report["llama"]
    assert first["nodes"] > 0 and first["embedded"] == first["nodes"] and first["texts_per_second"] > 0
    assert report["bare_one_process"]["chunks"] == first["distinct_embedded"]
    assert report["ratio"] > 0 and report["kbindex_first"]["embedded"] > 0

    assert report["rerun"]["llama"]["embedded"] == 0
    assert report["rerun"]["kbindex"] == {**report["rerun"]["kbindex"], "tasks": 0, "embedded": 0}

    edit = report["edit"]
    assert edit["docs_edited"] == 1 and len(edit["edited"]) == 1
    assert 0 < edit["llama"]["embedded"] <= first["embedded"]
    assert edit["kbindex"]["tasks"] == 1 and edit["kbindex"]["embedded"] > 0
    assert edit["kbindex"]["embedded"] + edit["kbindex"]["reused"] <= edit["kbindex"]["chunks"]

    text = render(report)
    for label in ("first run", "bare model.encode", "ratio LlamaIndex/bare", "kbindex first run", "re-run", "edit"):
        assert label in text
