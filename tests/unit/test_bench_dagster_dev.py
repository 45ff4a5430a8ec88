"""bench.dagster_dev.spawn_in_own_session: a `dagster dev` started by a bench or test that ignores SIGINT (run with `&`
from a script, or under nohup) still stops on SIGTERM.

Dagster maps SIGTERM to its SIGINT handler; the child here does the same, so an inherited SIG_IGN makes it ignore
SIGTERM, as `dagster dev` did (its processes ran on until the SIGKILL 30 s later)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from bench.dagster_dev import spawn_in_own_session

# SIGTERM calls whatever SIGINT handler the process started with, as Dagster's does; says when it is ready.
LIKE_DAGSTER = (
    "import signal, sys, time\n"
    "inherited = signal.getsignal(signal.SIGINT)\n"
    "signal.signal(signal.SIGTERM, lambda *a: inherited(*a) if callable(inherited) else None)\n"
    "status = open('/proc/self/status').read()\n"
    "print(int(status.split('SigIgn:')[1].split()[0], 16) >> (signal.SIGINT - 1) & 1, flush=True)\n"
    "time.sleep(30)\n"
)


@pytest.fixture
def sigint_ignored():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _stops_on_sigterm(proc: subprocess.Popen, within: float) -> tuple[str, bool]:
    ignored = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(within)
        return ignored, True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return ignored, False


def test_a_child_spawned_while_sigint_is_ignored_stops_on_sigterm(sigint_ignored):
    proc = spawn_in_own_session([sys.executable, "-c", LIKE_DAGSTER], stdout=subprocess.PIPE, text=True)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the caller's own disposition is put back
    ignored, stopped = _stops_on_sigterm(proc, 10)
    assert ignored == "0" and stopped
    assert proc.returncode != -signal.SIGKILL


def test_control_a_plain_popen_inherits_the_ignored_sigint_and_ignores_sigterm(sigint_ignored):
    """What the helper prevents (and proof the check above can fail)."""
    proc = subprocess.Popen([sys.executable, "-c", LIKE_DAGSTER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert _stops_on_sigterm(proc, 2) == ("1", False)


def test_the_child_runs_in_a_session_of_its_own():
    proc = spawn_in_own_session([sys.executable, "-c", "import os; print(os.getsid(0) == os.getpid())"],
                                stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "True"
