"""A bench stopped with SIGTERM stops the ``dagster dev`` it started and its scratch PostgreSQL (bench.exit_on_sigterm).

``dagster dev`` runs in a session of its own, so a signal to the bench never reaches it: before, a bench killed with
``kill`` left it (daemon, code server, webserver, fork server) and its PostgreSQL running, idle at ~0.2 core-s a
second, under every later measurement on the machine. Here bench.scale.small_docs is stopped mid-pass.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _started_by(root_prefix: str, since: float) -> list[psutil.Process]:
    """Live processes started since ``since`` whose DAGSTER_HOME or command line names a folder ``root_prefix``."""
    found = []
    for proc in psutil.process_iter(["create_time", "cmdline"]):
        try:
            if proc.info["create_time"] < since - 1:
                continue
            home = proc.environ().get("DAGSTER_HOME", "")
            if root_prefix in home or any(root_prefix in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.timeout(300)
def test_a_bench_stopped_with_sigterm_leaves_no_dagster_dev_running(tmp_path):
    since = time.time()
    # The bench's folders (its PostgreSQL's and dagster dev's sockets among them) go under a short folder of our
    # own, by which its processes are told apart: pytest's tmp_path can pass a Unix socket path's 107 bytes.
    scratch = Path(tempfile.mkdtemp(prefix="kbsig-"))
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "HF_HUB_OFFLINE": "1", "TMPDIR": str(scratch)}
    env.pop("KBINDEX_DATABASE_URL", None)  # the bench starts its own scratch PostgreSQL, which must go too
    (tmp_path / "corpus" / "en-sotu").mkdir(parents=True)
    words = "refund invoice travel hotel contract retention employee approval budget audit".split()
    paragraphs = [f"Paragraph {i}: " + " ".join(words[(i + j) % len(words)] for j in range(50)) for i in range(24)]
    (tmp_path / "corpus" / "en-sotu" / "a.txt").write_text("\n\n".join(paragraphs))
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench.scale.small_docs", "--corpus", str(tmp_path / "corpus"), "--docs", "20",
         "--fake-model", "--passes", "1", "--timeout", "200"],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    printed = []
    try:
        for line in bench.stdout:  # dagster dev is up once the first pass publishes
            printed.append(line)
            if "pass 1/1: pipeline" in line:
                break
        else:
            pytest.fail(f"the bench ended before its pass (exit {bench.wait()}):\n{''.join(printed)[-4000:]}")
        alive = _started_by(str(scratch), since)
        assert any("dagster" in " ".join(p.cmdline()) for p in alive), [p.cmdline() for p in alive]
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(60) == 143
        _, gone_late = psutil.wait_procs(alive, timeout=30)
        assert not gone_late, [p.cmdline()[:4] for p in gone_late]
        assert _started_by(str(scratch), since) == []
    finally:
        if bench.poll() is None:
            bench.kill()
        for proc in _started_by(str(scratch), since):
            proc.kill()
        shutil.rmtree(scratch, ignore_errors=True)
