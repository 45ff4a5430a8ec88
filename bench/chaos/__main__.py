"""``python -m bench.chaos``: the chaos soak (see bench/chaos/__init__.py). Exit 1 on any must-be-0 figure or a failed verify."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench import exit_on_sigterm
from bench.chaos import MIGRATION_FAULTS, ChaosConfig, format_report, run_chaos

HTTP_FAULTS = "timeout=0.03,rate_limit=0.05,drop=0.03,unavailable=0.03,wrong_dimension=0.01"


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    d = ChaosConfig()
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    p.add_argument("--tasks", type=int, default=d.tasks, help="index tasks to create, at least (default %(default)s)")
    p.add_argument("--kills", type=int, default=d.kills, help="run processes to SIGKILL while they work (default %(default)s)")
    p.add_argument("--stops", type=int, default=d.stops, help="runs to SIGSTOP past their lease, then resume")
    p.add_argument("--pg-restarts", type=int, default=d.pg_restarts, help="PostgreSQL stop/start cycles")
    p.add_argument("--seconds-limit", type=float, default=d.seconds_limit, help="give up (exit 1) after this long")
    p.add_argument("--corpus", type=Path, default=None, help="publish real .txt/.md/.rst files from this folder")
    p.add_argument("--lease-seconds", type=float, default=d.lease_seconds)
    p.add_argument("--fake-delay", type=float, default=d.fake_delay, help="seconds per fake embedding call")
    p.add_argument("--faults", default=None,
                   help=f"KBINDEX_FAKE_FAULTS for the run processes (default {d.faults}; with --migration"
                        f" {MIGRATION_FAULTS}: a permanent fault would leave the new profile short of full coverage)")
    p.add_argument("--run-batch", type=int, default=d.run_batch,
                   help="KBINDEX_RUN_BATCH (default %(default)s; 0: runs sized as the product sizes them)")
    p.add_argument("--tenants", type=int, default=d.tenants)
    p.add_argument("--max-concurrent-runs", type=int, default=d.max_concurrent_runs, help="dagster.yaml run slots")
    p.add_argument("--tenant-run-limit", type=int, default=d.tenant_run_limit, help="dagster.yaml run slots per tenant")
    p.add_argument("--max-waiting-runs", type=int, default=d.max_waiting_runs, help="KBINDEX_MAX_WAITING_RUNS")
    p.add_argument("--backlog", type=int, default=d.backlog,
                   help="publish more only while fewer than this many tasks are unfinished (default %(default)s; "
                        "--tasks or more: the whole target as one burst)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--migration", action="store_true",
                   help="also migrate to a building profile (another model, another chunk size) backfilled from the UI")
    p.add_argument("--building-model", default=d.building_model)
    p.add_argument("--building-chunk-tokens", type=int, default=d.building_chunk_tokens)
    p.add_argument("--migration-at", type=float, default=d.migration_at,
                   help="start the migration once this share of the expected tasks finished (default %(default)s)")
    p.add_argument("--backfill-mode", choices=["job", "partitions"], default=d.backfill_mode,
                   help="job: launch the backfill_profile job once; partitions: UI partition backfills in chunks")
    p.add_argument("--backfill-partitions", type=int, default=d.backfill_partitions, help="partitions per UI backfill")
    p.add_argument("--vector-sample", type=int, default=d.vector_sample, help="stored vectors per profile re-embedded")
    p.add_argument("--http-provider", action="store_true",
                   help="embed through the fake OpenAI-compatible server (faults from --faults, default "
                        f"{HTTP_FAULTS}) with an HTTP-provider profile and a shared requests/min limit")
    p.add_argument("--http-rpm", type=int, default=d.http_rpm, help="the provider limit (profile and server)")
    p.add_argument("--delete-share", type=float, default=d.delete_share,
                   help="share of publisher operations that delete a live document (default %(default)s)")
    p.add_argument("--revive-share", type=float, default=d.revive_share,
                   help="share that publish a deleted document again, which must come back (default %(default)s)")
    p.add_argument("--source-passes", type=int, default=d.source_passes,
                   help="sync passes over the bench's own source folder, mutated before each (0: none; default %(default)s)")
    p.add_argument("--source-files", type=int, default=d.source_files, help="files in that folder at first")
    p.add_argument("--network", action="store_true",
                   help="PostgreSQL on a network namespace of its own, reached over a veth link that is cut silently"
                        " (nftables DROP) for longer than a lease, at embed and at publish; the API and the embedding"
                        " service on hosts of their own, each cut off too (bench/chaos/network.py; needs root, ip and"
                        " nft; skipped with the reason otherwise)")
    p.add_argument("--net-cuts", type=int, default=d.net_cuts, help="silent partitions (default %(default)s)")
    p.add_argument("--net-cut-seconds", type=float, default=d.net_cut_seconds, help="each (default %(default)s)")
    p.add_argument("--net-loss", type=int, default=d.net_loss_percent,
                   help="then drop this %% of the link's packets for --net-loss-seconds (default %(default)s: none)")
    p.add_argument("--net-loss-seconds", type=float, default=d.net_loss_seconds)
    p.add_argument("--net-loss-until-done", action="store_true",
                   help="end the lossy period once every task of --tasks is published and finished (--net-loss-seconds"
                        " is then the cap) and publish no top-up: a burst that must finish over the slow link")
    p.add_argument("--net-delay-ms", type=int, default=d.net_delay_ms,
                   help="and add this delay each way for that period (a relay every connection goes through; "
                        "default %(default)s: none)")
    p.add_argument("--net-api-cuts", type=int, default=d.net_api_cuts,
                   help="with --network: silent partitions between the API host and PostgreSQL while event streams"
                        " are open and searches run (default %(default)s)")
    p.add_argument("--net-api-cut-seconds", type=float, default=d.net_api_cut_seconds, help="each (default %(default)s)")
    p.add_argument("--net-embed-cuts", type=int, default=d.net_embed_cuts,
                   help="with --network: silent partitions between the run host and the embedding host, mid-batch"
                        " (default %(default)s)")
    p.add_argument("--net-embed-cut-seconds", type=float, default=d.net_embed_cut_seconds,
                   help="each (default %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (database, logs)")
    a = p.parse_args(argv)
    exit_on_sigterm()
    if a.network:
        from bench.netns import unavailable

        if reason := unavailable():
            print(f"bench.chaos --network skipped: {reason}", flush=True)
            return 0
    config = ChaosConfig(
        tasks=a.tasks, kills=a.kills, stops=a.stops, pg_restarts=a.pg_restarts, seconds_limit=a.seconds_limit,
        corpus=a.corpus, lease_seconds=a.lease_seconds, fake_delay=a.fake_delay,
        faults=a.faults if a.faults is not None else (
            MIGRATION_FAULTS if a.migration else HTTP_FAULTS if a.http_provider else d.faults),
        http_provider=a.http_provider, http_rpm=a.http_rpm,
        run_batch=a.run_batch, run_batch_min=max(1, a.run_batch // 2), seed=a.seed, keep=a.keep, tenants=a.tenants,
        max_concurrent_runs=a.max_concurrent_runs, tenant_run_limit=a.tenant_run_limit, max_waiting_runs=a.max_waiting_runs,
        migration=a.migration, building_model=a.building_model, building_chunk_tokens=a.building_chunk_tokens,
        migration_at=a.migration_at, backfill_mode=a.backfill_mode, backfill_partitions=a.backfill_partitions, vector_sample=a.vector_sample,
        delete_share=a.delete_share, revive_share=a.revive_share, source_passes=a.source_passes, source_files=a.source_files,
        network=a.network, net_cuts=a.net_cuts, net_cut_seconds=a.net_cut_seconds, net_loss_percent=a.net_loss,
        net_loss_seconds=a.net_loss_seconds, net_loss_until_done=a.net_loss_until_done,
        backlog=a.backlog, net_delay_ms=a.net_delay_ms, net_api_cuts=a.net_api_cuts,
        net_api_cut_seconds=a.net_api_cut_seconds, net_embed_cuts=a.net_embed_cuts,
        net_embed_cut_seconds=a.net_embed_cut_seconds,
    )
    report = run_chaos(config, out=lambda line: print(line, flush=True))
    print(format_report(report), flush=True)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2, default=str))
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
