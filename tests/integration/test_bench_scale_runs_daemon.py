"""The CI-sized round of ``python -m bench.scale.runs --daemon``: two real ``dagster dev`` stacks (100 and 2,000
seeded partition keys) index every published version in daemon-launched runs, and the bench reads a complete
sample for every batch from Dagster's runs table. Speed is not asserted (the full-size figures are in README)."""

from __future__ import annotations

import math

import pytest

from bench.scale.runs_daemon import FIGURES, medians, run_daemon, summary

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_daemon_launched_batches_over_two_key_counts(pg_server_url, tmp_path, monkeypatch):
    for name in ("KBINDEX_DATABASE_URL", "KBINDEX_BLOB_URL", "KBINDEX_ARTIFACTS", "KBINDEX_HOME"):
        monkeypatch.setenv(name, "")  # the bench points these at its stacks; restored after the test
    counts = [100, 2000]
    batches = run_daemon(pg_server_url, counts, versions=5, batches=2, warmup=1, seed=0, workdir=tmp_path,
                         timeout=120)
    assert [(b.label, b.keys) for b in batches if b.warmup] == [("w0", 100), ("w0", 2000)]
    assert sorted((b.label, b.keys) for b in batches if not b.warmup) == [
        ("b0", 100), ("b0", 2000), ("b1", 100), ("b1", 2000)]
    for b in batches:
        assert b.succeeded == b.versions == 5, b
        assert b.runs and sum(r.versions for r in b.runs) == 5, b  # every task in exactly one run
        assert all(r.status == "SUCCESS" for r in b.runs), b
        for r in b.runs:
            for value in (r.claim_to_create, r.create_to_start, r.create_to_enqueue, r.enqueue_to_dequeue,
                          r.dequeue_to_start, r.start_to_end):
                assert math.isfinite(value) and value >= 0, r
        assert 0 <= b.to_claim <= b.seconds and b.claim_to_done > 0, b
    table = medians(batches, counts)
    for name, _ in FIGURES:  # a median of the measured batches' samples for each key count
        assert sorted(table[name]) == counts and all(n >= 2 for *_, n in table[name].values()), name
    lines = summary(batches, counts)
    assert sum(1 for line in lines if "ok 5/5" in line) == len(batches)
    assert any(line.startswith("target (issue #33)") for line in lines)
    import psutil

    left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert left == []  # every dagster dev process stopped
