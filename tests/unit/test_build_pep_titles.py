"""The pep-titles builder (issue #35): titles as queries, header-less opening text as documents, near-duplicate
titles judged together, series dropped, an absent corpus skipped."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from bench.retrieval.build_pep_titles import MAX_FAMILY, build, fold, main

BODY = "Abstract\n========\n\n" + "This proposal adds a feature to the language and explains why. " * 6 + \
       "\n\nCopyright\n=========\n\nThis document is placed in the public domain.\n"


def pep(folder: Path, number: int, title: str, body: str = BODY) -> None:
    (folder / f"pep-{number:04d}.rst").write_text(
        f"PEP: {number}\nTitle: {title}\nAuthor: A. Author <a@example.org>,\n        B. Author\nStatus: Final\n\n{body}",
        encoding="utf-8")


def test_build_writes_beir_with_titles_as_queries_and_no_header_in_documents(tmp_path: Path) -> None:
    src, out = tmp_path / "peps", tmp_path / "out"
    src.mkdir()
    pep(src, 1, "Assignment Expressions")
    pep(src, 2, "New Super")
    pep(src, 3, "New super")  # same title up to case: one query, both relevant
    for n in range(MAX_FAMILY + 1):
        pep(src, 10 + n, f"Python 3.{n} Release Schedule")  # a series: dropped
    pep(src, 30, "Stub", "Abstract\n========\n\nToo short.\n")
    counts = build(src, out)
    assert counts == {"documents": 3, "queries": 2, "dropped_series_peps": MAX_FAMILY + 1, "dropped_short": 1,
                      "shared_title_queries": 1}
    docs = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    assert [d["_id"] for d in docs] == ["pep-0001", "pep-0002", "pep-0003"] and all(d["title"] == "" for d in docs)
    assert all("Author" not in d["text"] and "Final" not in d["text"] and "public domain" not in d["text"]
               and d["text"].startswith("This proposal") for d in docs)
    queries = [json.loads(line) for line in (out / "queries.jsonl").read_text().splitlines()]
    assert queries == [{"_id": "q-pep-0001", "text": "Assignment Expressions"}, {"_id": "q-pep-0002", "text": "New Super"}]
    with (out / "qrels" / "test.tsv").open() as fh:
        judged = [(r["query-id"], r["corpus-id"]) for r in csv.DictReader(fh, delimiter="\t")]
    assert judged == [("q-pep-0001", "pep-0001"), ("q-pep-0002", "pep-0002"), ("q-pep-0002", "pep-0003")]
    assert "CC0" in (out / "ATTRIBUTION.md").read_text()


def test_fold_and_an_absent_corpus(tmp_path: Path, capsys) -> None:
    assert fold("Python 2.7 Release Schedule!") == fold("python 3.10 release schedule") == "python # release schedule"
    assert main([str(tmp_path / "missing"), str(tmp_path / "out")]) == 0
    assert "skip" in capsys.readouterr().err and not (tmp_path / "out").exists()
