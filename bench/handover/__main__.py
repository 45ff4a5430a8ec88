"""``python -m bench.handover``: a burst on busy cores, then the handover's waste beside issue #28's targets
(see bench/handover/__init__.py). Exit 1 when a target is missed, the burst times out, or the bench fails."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench.handover import HandoverConfig, format_table, run_handover


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    d = HandoverConfig()
    p = argparse.ArgumentParser(prog="python -m bench.handover", description=__doc__)
    p.add_argument("--versions", type=int, default=d.versions, help="versions published at once (default %(default)s)")
    p.add_argument("--hog", type=int, default=d.hog,
                   help="busy-loop processes keeping the cores busy during the burst (default %(default)s)")
    p.add_argument("--lease-seconds", type=float, default=d.lease_seconds, help="KBINDEX_LEASE_SECONDS (default %(default)s)")
    p.add_argument("--timeout", type=float, default=d.timeout,
                   help="seconds from the publish until every task must have ended (default %(default)s)")
    p.add_argument("--settle-seconds", type=float, default=d.settle_seconds,
                   help="after the burst, how long live runs may take to finish before measuring (default %(default)s)")
    p.add_argument("--tenants", type=int, default=d.tenants)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", type=Path, default=None, help="also write the whole report as JSON here")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (database, logs)")
    a = p.parse_args(argv)
    config = HandoverConfig(versions=a.versions, hog=a.hog, lease_seconds=a.lease_seconds, timeout=a.timeout,
                            settle_seconds=a.settle_seconds, tenants=a.tenants, seed=a.seed, keep=a.keep)
    report = run_handover(config, out=lambda line: print(line, flush=True))
    details = {k: v for k, v in report.items() if k not in ("targets", "dagster_log_tail")}
    print(json.dumps(details, indent=2, default=str), flush=True)
    if report.get("dagster_log_tail"):
        print("--- dagster log tail ---\n" + report["dagster_log_tail"], flush=True)
    print(format_table(report), flush=True)
    print(f"burst: {report.get('burst_seconds')} s (timed out: {report.get('timed_out')}); "
          f"{'all targets met' if report.get('ok') else 'FAILED: a target missed, a timeout or an error'}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2, default=str))
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
