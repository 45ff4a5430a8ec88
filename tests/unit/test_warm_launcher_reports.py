"""The fork server keeps a run's exit it could not record (PostgreSQL away) and tries again: run monitoring cannot
rescue a run that never left STARTING, so a lost report stalled a chaos round (issue #34)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pipelines.warm_launcher as warm


def test_an_exit_report_that_fails_is_kept_and_retried_until_it_lands(monkeypatch):
    calls: list[str] = []

    def report(run_id, ref, pid, status):
        calls.append(run_id)
        if len(calls) < 3:
            raise ConnectionError("PostgreSQL is restarting")

    monkeypatch.setattr(warm, "_report_exit", report)
    monkeypatch.setattr(warm, "REPORT_RETRY_SECONDS", 0.0)
    with tempfile.TemporaryDirectory(prefix="kbw-") as short:  # a Unix socket path must stay short
        server = warm.ForkServer(Path(short) / "s")
        try:
            pid = os.fork()
            if pid == 0:
                os._exit(1)  # a run process that died before its run started
            server.children[pid] = ("run-1", "ref")
            while server.children:
                server._reap()
            assert server.unreported  # the first report failed: kept, not dropped
            server._retry_reports()
            assert server.unreported
            server._retry_reports()
            assert not server.unreported and calls == ["run-1"] * 3
        finally:
            server.listener.close()
