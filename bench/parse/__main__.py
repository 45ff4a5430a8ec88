"""``python -m bench.parse [--corpus ../shared/corpus] [--ocr-pages 4] [--json out.json]`` (see __init__)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path

from bench.parse.groups import GROUPS, OCR_PAGES, ROOT, _run_group

DEFAULT_CORPUS = ROOT.parent / "shared" / "corpus"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.parse", description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--ocr-pages", type=int, default=OCR_PAGES, help="generated A4 pages to OCR")
    parser.add_argument("--groups", default=",".join(GROUPS))
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    if not args.corpus.is_dir():
        print(f"no corpus at {args.corpus}", file=sys.stderr)
        return 2
    context = multiprocessing.get_context("spawn")
    rows = []
    for group in args.groups.split(","):
        for engine in (("pdfium", "pypdf") if group.startswith("pdf") else ("pdfium",)):
            queue = context.Queue()
            child = context.Process(target=_run_group, args=(str(args.corpus), group, engine, args.ocr_pages, queue))
            child.start()
            row = queue.get()
            child.join()
            if "error" in row:
                print(f"{group}: {row['error']}", file=sys.stderr)
                continue
            rows.append(row)
            print(_format(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print("\n" + _table(rows))
    return 0


_COLUMNS = ("group", "files", "failed", "pages", "MB", "seconds", "pages_per_s", "MB_per_s", "text_pages_per_s",
            "ocr_pages", "ocr_pages_per_s", "peak_rss_MB")


def _format(row: dict) -> str:
    return "  ".join(f"{key}={row.get(key)}" for key in _COLUMNS)


def _table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join("" if row.get(key) is None else str(row[key]) for key in _COLUMNS) + " |" for row in rows]
    lines.append("\n`*` generated (the corpus has no slides, sheets, mail or scans); pages = slides for .pptx, "
                 "1 per file for formats without pages; text_pages_per_s leaves OCR time and pages out.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
