"""``python -m bench.hosts`` end to end on a tiny burst: both rounds run, the figures and the ratio are printed,
and it exits 0 (it exits 1 when a task did not SUCCEED, a version was published twice, a takeover went
unreported or verify failed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.netns import ROOT, unavailable

# A soak round: tests/network/test_slow_link.py runs the same burst through the relay in the default run.
pytestmark = pytest.mark.soak


def test_bench_hosts_prints_both_rounds_and_exits_0(tmp_path):
    if reason := unavailable():
        pytest.skip(reason)
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.hosts", "--versions", "6", "--documents", "3", "--workers", "2",
         "--batch", "2", "--delay-ms", "50", "--loss", "2", "--lease-seconds", "3", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "bench.hosts: ok" in run.stdout and "slow / clean: wall" in run.stdout
    figures = json.loads(out.read_text())
    for name in ("clean", "slow"):
        f = figures[name]
        assert f["statuses"] == {"SUCCEEDED": 6} and f["verify_ok"] and f["double_publishes"] == 0
        assert f["takeovers"] >= 1 and f["silent_takeovers"] == 0  # the frozen worker's lease, at least
