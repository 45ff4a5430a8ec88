"""``python -m bench.source_sync [--files N] [--rounds R] [--first-pass seed|publish]`` (see __init__)."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench.source_sync import make_tree, measure, seed_ledger

DATABASE = "bench_source"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.source_sync", description=__doc__)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-pass", choices=("seed", "publish"), default="seed",
                        help="seed: write the ledger a first pass leaves in one batch; publish: run the real first pass")
    args = parser.parse_args(argv)

    import psycopg
    from psycopg import sql as pgsql

    from resources.blob_store import BlobStore
    from resources.database import Database
    from resources.local_postgres import temporary_server, with_database
    from resources.migrations import migrate
    from resources.publisher import Publisher
    from resources.source_sync import SourceSync

    work = Path(tempfile.mkdtemp(prefix="kbindex-bench-source-"))
    try:
        with temporary_server("kbindex-bench-source-pg-", external_env="KBINDEX_DATABASE_URL") as admin_url:
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(DATABASE)))
                conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(DATABASE)))
            url = with_database(admin_url, DATABASE)
            migrate(url)
            root = work / "share"
            started = time.perf_counter()
            made = make_tree(root, args.files)
            setup = {"create_files_seconds": round(time.perf_counter() - started, 1)}
            with Database(url, max_size=4) as db:
                sources = SourceSync(db, Publisher(db, BlobStore(str(work / "blobs")), quota_bytes=None))
                sources.add("bench", "bench", str(root))
                started = time.perf_counter()
                if args.first_pass == "publish":
                    first = sources.sync("bench")
                    setup["first_pass"] = first.summary()
                else:
                    setup["ledger_rows_seeded"] = seed_ledger(db, "bench", str(root), "**", made)
                setup["first_pass_seconds"] = round(time.perf_counter() - started, 1)
                report = {"setup": setup, **measure(sources, "bench", root, args.rounds)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report, indent=2))
    print(f"pass over {report['files']:,} unchanged files: {report['pass_seconds']} s median of {args.rounds} "
          f"(read {report['read']}, file opens {report['file_opens_during_passes']}); "
          f"os.walk {report['os_walk_seconds']} s, scandir+stat {report['scandir_stat_seconds']} s, "
          f"listing alone (list_location) {report['listing_seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
