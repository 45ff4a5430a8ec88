"""``python -m bench.delete``: per path (through runs, and the fast path), N one-page documents published, changed
(metadata and allow list only) and deleted, one operation at a time, through the real daemon and sensor; p50/p95/max
of each operation -> seen (or gone) in every search mode, and texts embedded (bench/delete/__init__.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench import exit_on_sigterm
from bench.delete import DeleteConfig, format_report, run_delete


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m bench.delete", description=__doc__)
    p.add_argument("--documents", type=int, default=DeleteConfig.documents, help="documents per path")
    p.add_argument("--gap", type=float, default=DeleteConfig.gap,
                   help="pause a random 0..GAP s before each operation, once idle (0: back to back)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (database, logs)")
    a = p.parse_args(argv)
    exit_on_sigterm()
    report = run_delete(DeleteConfig(documents=a.documents, gap=a.gap, keep=a.keep), out=lambda line: print(line, flush=True))
    print(json.dumps({k: v for k, v in report.items() if k != "dagster_log_tail"}, indent=2), flush=True)
    if report.get("dagster_log_tail"):
        print("--- dagster log tail ---\n" + report["dagster_log_tail"], flush=True)
    print(format_report(report), flush=True)
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
