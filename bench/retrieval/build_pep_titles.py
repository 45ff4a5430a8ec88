"""Build ``pep-titles``, an English retrieval set where keyword matching is not enough (issue #35).

``python -m bench.retrieval.build_pep_titles ../shared/corpus/en-peps OUT [--max-chars 2000] [--limit N]``

Queries are PEP titles ("Assignment Expressions"); a query's relevant document is its PEP's opening text, the
first sections of the body (header fields and title removed, so the title is not in the document unless the
author repeated it), read with the project's own reStructuredText parser and cut at a paragraph end after
``--max-chars`` characters. Titles answer with a handful of words what the body spends paragraphs on, so
neither word overlap nor a small embedding model is near 1.0 on it.

Near-duplicate titles: titles are compared folded (lower case, punctuation dropped, every number made ``#``);
PEPs sharing a folded title form one query judged with each of them relevant (two PEPs both called "New
Super"), and a folded title shared by more than ``MAX_FAMILY`` PEPs is dropped with its PEPs ("Python #.#
Release Schedule": 24 PEPs no title can tell apart). PEPs whose opening text is shorter than ``MIN_CHARS`` are
dropped (placeholders, withdrawn stubs).

The corpus ``title`` field is empty (the PEP title is the query, so it cannot be the document's title too).
Output: BEIR layout (corpus.jsonl ``{_id, title, text}``, queries.jsonl ``{_id, text}``, qrels/test.tsv) plus
ATTRIBUTION.md. Licence: every PEP is placed in the public domain or under CC0-1.0-Universal, whichever is
more permissive (each file's Copyright section says so); so is this derived set.
A missing corpus folder is skipped with a message and exit 0 (the shared corpus is optional).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

MAX_FAMILY = 3
"""A folded title shared by more PEPs than this is a series (release schedules), not a topic: dropped."""
MIN_CHARS = 200
"""Opening texts shorter than this are stubs: dropped."""
DEFAULT_MAX_CHARS = 2000
SKIP_SECTIONS = {"copyright", "references", "footnotes", "acknowledgements", "acknowledgments"}
_HEADER = re.compile(r"^([A-Za-z-]+):[ \t]*(.*)$")


def read_pep(path: Path) -> tuple[dict[str, str], str]:
    """(header fields, body) of one PEP source: the RFC 822 style header runs to the first blank line."""
    text = path.read_text(encoding="utf-8")
    head, _, body = text.partition("\n\n")
    fields: dict[str, str] = {}
    name = None
    for line in head.splitlines():
        match = _HEADER.match(line)
        if match:
            name = match.group(1).lower()
            fields[name] = match.group(2).strip()
        elif name and line[:1].isspace():  # a continuation line
            fields[name] = (fields[name] + " " + line.strip()).strip()
    return fields, body


def opening_text(body: str, filename: str, max_chars: int) -> str:
    """The body's paragraphs in reading order (sections like Copyright and References left out), cut at a
    paragraph end once ``max_chars`` is reached; the project's own rst parser reads the markup."""
    from pipelines.domain.parsing import parse_document

    parsed = parse_document(body.encode("utf-8"), filename=filename)
    out: list[str] = []
    size = 0
    for block in parsed.blocks:
        if any(h.strip().lower() in SKIP_SECTIONS for h in block.heading_path):
            continue
        out.append(block.text)
        size += len(block.text) + 2
        if size >= max_chars:
            break
    return "\n\n".join(out)


def fold(title: str) -> str:
    """The title compared for near-duplicates: lower case, numbers as '#', punctuation dropped."""
    title = re.sub(r"\d+(?:\.\d+)*", "#", title.lower())
    return " ".join(re.sub(r"[^\w#]+", " ", title).split())


def build(source: Path, out: Path, *, max_chars: int = DEFAULT_MAX_CHARS, limit: int = 0) -> dict[str, int]:
    """Write the set under ``out``; returns counts. ``limit``: keep only the first N queries (by PEP number),
    with their documents (the CI-sized fixture)."""
    peps: dict[str, tuple[str, str]] = {}  # doc id -> (title, text)
    short = 0
    for path in sorted(source.glob("pep-*.rst")):
        fields, body = read_pep(path)
        title = fields.get("title", "").strip()
        number = fields.get("pep", "").strip()
        if not title or not number.isdigit():
            continue
        text = opening_text(body, path.name, max_chars)
        if len(text) < MIN_CHARS:
            short += 1
            continue
        peps[f"pep-{int(number):04d}"] = (title, text)
    families: dict[str, list[str]] = defaultdict(list)
    for doc_id, (title, _) in peps.items():
        families[fold(title)].append(doc_id)
    series = {key for key, ids in families.items() if len(ids) > MAX_FAMILY}
    queries = sorted((ids[0], ids) for key, ids in families.items() if key not in series)
    if limit:
        queries = queries[:limit]
    kept = sorted({d for _, ids in queries for d in ids})
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for doc_id in kept:
            fh.write(json.dumps({"_id": doc_id, "title": "", "text": peps[doc_id][1]}, ensure_ascii=False) + "\n")
    with (out / "queries.jsonl").open("w", encoding="utf-8") as fh:
        for first, _ in queries:
            fh.write(json.dumps({"_id": f"q-{first}", "text": peps[first][0]}, ensure_ascii=False) + "\n")
    with (out / "qrels" / "test.tsv").open("w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for first, ids in queries:
            for doc_id in ids:
                fh.write(f"q-{first}\t{doc_id}\t1\n")
    counts = {"documents": len(kept), "queries": len(queries), "dropped_series_peps": sum(len(families[k]) for k in series),
              "dropped_short": short, "shared_title_queries": sum(1 for _, ids in queries if len(ids) > 1)}
    (out / "ATTRIBUTION.md").write_text(attribution(counts, max_chars, limit), encoding="utf-8")
    return counts


def attribution(counts: dict[str, int], max_chars: int, limit: int) -> str:
    return (
        "# pep-titles: PEP title -> PEP opening text (BEIR layout)\n\n"
        f"{counts['documents']} documents, {counts['queries']} queries"
        + (f" (the first {limit} queries by PEP number)" if limit else "") + ".\n"
        f"Built by `python -m bench.retrieval.build_pep_titles <en-peps> <out> --max-chars {max_chars}"
        + (f" --limit {limit}" if limit else "") + "` from the Python Enhancement Proposals\n"
        "(github python/peps, peps/pep-*.rst, as copied into the project's shared corpus `en-peps/`).\n\n"
        "- queries: PEP titles; documents: each PEP's body without its header fields and title, read as\n"
        "  reStructuredText, Copyright/References/Footnotes/Acknowledgements sections left out, cut at a\n"
        f"  paragraph end after {max_chars} characters; corpus `title` is empty (the title is the query)\n"
        "- PEPs with the same title up to case, punctuation and numbers share one query (all judged relevant);\n"
        f"  titles shared by more than {MAX_FAMILY} PEPs (release schedules) are dropped, as are opening texts\n"
        f"  under {MIN_CHARS} characters\n\n"
        "Licence: public domain / CC0-1.0-Universal. Each PEP says: \"This document is placed in the public\n"
        "domain or under the CC0-1.0-Universal license, whichever is more permissive.\" Authors: the PEP\n"
        "authors named in each PEP's header. Changes: header removed, markup read as plain text, text cut.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retrieval.build_pep_titles", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="folder of pep-*.rst files (the shared corpus's en-peps/)")
    parser.add_argument("out", type=Path, help="output folder (BEIR layout)")
    parser.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS,
                        help="opening text per PEP, cut at the first paragraph end past this many characters")
    parser.add_argument("--limit", type=int, default=0, help="keep the first N queries only (0: all)")
    args = parser.parse_args(argv)
    if not args.source.is_dir() or not any(args.source.glob("pep-*.rst")):
        print(f"skip: no pep-*.rst files under {args.source} (the shared corpus is optional)", file=sys.stderr)
        return 0
    counts = build(args.source, args.out, max_chars=args.max_chars, limit=args.limit)
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
