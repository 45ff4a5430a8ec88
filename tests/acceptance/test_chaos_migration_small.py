"""A CI-sized migration chaos round (bench/chaos --migration, issue #12): the real `dagster dev`, a
building profile with a really different model (fake-b-384) and another chunk size (64 against 200),
backfilled from the UI (the backfill_profile job launched through the webserver's GraphQL, as the
launchpad does; the claiming sensor builds the backlog) while new versions keep being published,
runs are SIGKILLed, one is SIGSTOPped past its lease and PostgreSQL is restarted; documents are
deleted and published back, and a small source folder is synced (bench/chaos's defaults, the folder
kept small so the round stays short). At the end: verify is clean, both profiles cover every current
version, every chunk obeys its own profile's chunk size, sampled vectors re-embedded with their
profile's model match, and no task is DEAD that no run ever started.
"""

from __future__ import annotations

import time
import warnings

import pytest

from bench.chaos import MIGRATION_FAULTS, ChaosConfig, format_report, run_chaos
from bench.chaos.progress import keep_stalled_report

pytestmark = pytest.mark.slow


@pytest.mark.timeout(480)
def test_small_migration_round_builds_the_new_profile_whole_and_its_own():
    config = ChaosConfig(
        tasks=30,
        kills=3,
        stops=1,
        pg_restarts=1,
        seconds_limit=330,
        faults=MIGRATION_FAULTS,
        seed=11,
        migration=True,
        backfill_mode="job",
        vector_sample=60,
        source_passes=4,
        source_files=6,
    )
    lines: list[str] = []
    started = time.monotonic()
    report = run_chaos(config, out=lines.append)
    shown = "\n".join(lines) + "\n" + format_report(report)
    print(shown)  # the figures, with -s or on failure
    stalled = keep_stalled_report(report, shown)
    if stalled:  # passed, but slowly: the warnings summary names the file with the snapshots taken during it
        warnings.warn(stalled, stacklevel=1)
    assert not report.get("errors"), shown
    assert not report["timed_out"], shown
    assert report["verify"]["ok"], shown
    assert all(v == 0 for v in report["must_be_zero"].values()), shown
    migration = report["migration"]
    assert migration["coverage_complete"], shown
    launched = migration["backfills"]
    assert migration["reindex_tasks_created"] > 0 and launched.get("backfill_jobs_launched", 0) == 1, shown
    chunks = migration["chunks"]
    assert chunks["shadow-b64"]["chunks"] > chunks["minilm-v1"]["chunks"], shown  # 64-token chunks: more of them
    assert chunks["shadow-b64"]["max_tokens"] <= 64 < chunks["minilm-v1"]["max_tokens"], shown
    assert migration["vectors_re_embedded"] > 0 and migration["own_model_cosine_min"] >= 0.999, shown
    assert migration["other_model_cosine_max"] < 0.5, shown  # the two models really differ
    assert migration["publishes_while_migrating"] > 0, shown  # new versions kept coming during the backfill
    assert report["faults"]["process_kills"] >= 3 and len(report["faults"]["postgres_restarts"]) == 1, shown
    assert time.monotonic() - started < 450, shown
