"""``python -m bench.hosts [--versions 200] [--delay-ms 250] [--loss 5]``: see bench/hosts/__init__.py."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql as pgsql


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hosts", description=__doc__)
    p.add_argument("--versions", type=int, default=200, help="versions in the burst (default %(default)s)")
    p.add_argument("--documents", type=int, default=50, help="documents they are versions of (default %(default)s)")
    p.add_argument("--workers", type=int, default=4, help="worker processes on the client host")
    p.add_argument("--batch", type=int, default=4, help="tasks per claim, published in one transaction")
    p.add_argument("--delay-ms", type=float, default=250.0, help="added each way (default %(default)s: 500 ms RTT)")
    p.add_argument("--loss", type=int, default=5, help="percent of packets dropped each way")
    p.add_argument("--lease-seconds", type=float, default=15.0)
    p.add_argument("--embed-seconds", type=float, default=0.0,
                   help="time the fake embedding takes per version (each worker sleeps it)")
    p.add_argument("--no-freeze", dest="freeze", action="store_false", help="no worker freezes past its lease")
    p.add_argument("--no-clean", dest="clean", action="store_false", help="skip the clean-link round")
    p.add_argument("--seconds-limit", type=float, default=900.0, help="per round")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from bench.netns import Hosts, unavailable

    reason = unavailable()
    if reason:
        print(f"bench.hosts skipped: {reason}")
        return 0
    from resources.migrations import migrate
    from tests.network.burst import run_burst, summary

    rounds = ([("clean", 0.0, 0)] if args.clean else []) + [("slow", args.delay_ms, args.loss)]
    figures: dict[str, dict] = {}
    ok = True
    with Hosts() as hosts, tempfile.TemporaryDirectory(prefix="kbindex-bench-hosts-") as tmp:
        hosts.wait_ready()
        for name, delay, loss in rounds:
            database = f"bench_hosts_{name}"
            with psycopg.connect(hosts.local_url(), autocommit=True) as conn:
                conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(database)))
            migrate(hosts.local_url(database))
            print(f"-- {name}: {args.versions} versions, {args.workers} workers x batch {args.batch}, "
                  f"+{delay:g} ms each way, {loss} % loss, lease {args.lease_seconds:g} s, embedding "
                  f"{args.embed_seconds:g} s per version", flush=True)
            report = run_burst(hosts, database, Path(tmp) / name, versions=args.versions, documents=args.documents,
                               workers=args.workers, delay_ms=delay, loss_percent=loss, lease_s=args.lease_seconds,
                               batch=args.batch, embed_s=args.embed_seconds, freeze=args.freeze,
                               timeout=args.seconds_limit)
            for line in report.lines():
                print("   ", line, flush=True)
            figures[name] = summary(report)
            ok = ok and (dict(report.statuses) == {"SUCCEEDED": args.versions} and report.verify_ok
                         and not report.silent_takeovers and set(report.succeeded_events.values()) == {1})
    if "clean" in figures:
        clean, slow = figures["clean"], figures["slow"]
        print(f"slow / clean: wall {slow['wall_s'] / clean['wall_s']:.1f}x, p50 claim -> publish "
              f"{slow['p50_claim_to_publish_s'] / clean['p50_claim_to_publish_s']:.1f}x")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print("bench.hosts:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
