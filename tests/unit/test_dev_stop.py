"""`kbindex dev`'s stop: the group and the service signalled at once, one grace period, SIGKILL only past it."""

from __future__ import annotations

import subprocess
import sys
import time

from pipelines.cli.dev_stop import stop_all

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
POLITE = "import time; print('ready', flush=True); time.sleep(60)"
# A leader with a child in its group that outlives it by 1 s after SIGTERM (a run finishing its teardown).
CHILD = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0))); "
         "time.sleep(60)")
LEADER = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {CHILD!r}]); {POLITE}"


def _start(code: str, *, group: bool) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=group)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    return proc


def test_everything_gets_sigterm_at_once_and_nothing_is_killed():
    group, service = _start(LEADER, group=True), _start(POLITE, group=False)
    time.sleep(0.5)  # the child is up too
    report = stop_all(group, service, grace=10)
    assert report.killed == []
    assert report.dagster_exit == -15 and report.service_seconds is not None and report.service_seconds < 1
    assert 0.9 < report.dagster_seconds < 5  # the leader's child was waited for, not killed on sight
    assert "killed" not in report.line()


def test_what_ignores_sigterm_is_killed_after_the_grace_period():
    group, service = _start(STUBBORN, group=True), _start(STUBBORN, group=False)
    started = time.monotonic()
    report = stop_all(group, service, grace=1.0)
    assert time.monotonic() - started < 3
    assert report.dagster_exit == -9 and report.killed == ["dagster dev", "embedding service"]
    assert "killed after the 1 s grace: dagster dev, embedding service" in report.line()  # the grace it was given


def test_a_group_already_gone_stops_at_once():
    group = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    group.wait()
    report = stop_all(group, None, grace=5)
    assert report.dagster_exit == 0 and report.killed == [] and report.seconds < 1


def test_what_outlives_its_leader_is_named_when_killed():
    """The leader exits on SIGTERM, a member of its group ignores it: the stop names that member (pid, command)."""
    child = "'stubborn-group-member'; import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    leader = f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {child!r}]); " \
             f"print(p.pid, flush=True); {POLITE}"
    group = subprocess.Popen([sys.executable, "-c", leader], stdout=subprocess.PIPE, start_new_session=True)
    assert group.stdout is not None
    member = int(group.stdout.readline())
    assert group.stdout.readline() == b"ready\n"
    time.sleep(0.3)  # the child has set its handler
    report = stop_all(group, None, grace=1.0)
    (killed,) = report.killed
    assert killed.startswith("the rest of Dagster's process group (") and f"{member} " in killed
    assert "stubborn-group-member" in killed


def test_a_member_started_after_the_signal_is_signalled_too():
    """As dagster dev's code-server proxy does: on SIGTERM the leader starts a new child in its group (which no
    group signal reached) and waits for it. The stop signals that newcomer, so nothing waits for the SIGKILL."""
    child = "import time; time.sleep(60)"
    leader = ("import signal, subprocess, sys, time\n"
              "def restart(*_):\n"
              f"    subprocess.Popen([sys.executable, '-c', {child!r}]).wait()\n"
              "    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, restart)\n"
              f"{POLITE}")
    group = _start(leader, group=True)
    report = stop_all(group, None, grace=8.0)
    assert report.killed == [] and report.dagster_seconds < 5, report.line()
