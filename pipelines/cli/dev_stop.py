"""Stopping `kbindex dev`: every process told at once, one shared grace period, SIGKILL only as the last resort.

The old stop was sequential: SIGTERM to Dagster's process group, up to 30 s for ``dagster dev`` to exit, then the
embedding service, up to another 10 s. ``dagster dev`` itself waits for its webserver and daemon one after the other
(up to 60 s each) before it shuts its code servers down, so one slow member (a daemon thread mid-tick, a run's
teardown, a webserver request still running) held the whole stop until the 30 s SIGKILL (issue #29: 33 s,
``exit -9``). Here the group and the service get SIGTERM in the same instant, all of them share one deadline, and
whatever of Dagster's group outlives its leader (a run process, a code server) is waited for, not killed on sight.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

GRACE_SECONDS = 20.0
"""Shared by every process; past it, SIGKILL. Measured stops: 4-5 s idle on 2 cores, 5-10 s with both cores busy
(a CPU hog per core), 7-14 s with the sample corpus's run in flight (three one-off stops; with a bigger batch in
flight and a busy core, up to 21.6 s and a SIGKILL, until the embedding service stopped finishing the batch first:
6.3-8.2 s since, tests/acceptance/test_dev_command.py; and 20 s with a SIGKILL when dagster dev's code-server
proxy restarted its code server after the signal, until ``_signal_newcomers``); a loaded CI run went
past the old 12 s (SIGKILL, a red test) while a claiming tick waited out its wait for a publish, which the stop
now ends (pipelines/stopping.py). It leaves the warm launcher its own 15 s for the runs (STOP_GRACE_SECONDS).
The Dagster daemon joins each of its threads for up to 30 s on shutdown (``DagsterDaemonController``), so a daemon
thread stuck mid-tick is the case this bound cuts short."""


@dataclass
class StopReport:
    """What a stop took: Dagster's exit code, seconds from the signal until each part was gone, what was killed."""

    dagster_exit: int
    seconds: float
    dagster_seconds: float
    service_seconds: float | None
    killed: list[str] = field(default_factory=list)
    grace: float = GRACE_SECONDS

    def line(self) -> str:
        killed = f"; killed after the {self.grace:g} s grace: {', '.join(self.killed)}" if self.killed else ""
        service = f", embedding service {self.service_seconds:.1f} s" if self.service_seconds is not None else ""
        return (f"kbindex dev stopped in {self.seconds:.1f} s (Dagster {self.dagster_seconds:.1f} s, "
                f"exit {self.dagster_exit}{service}){killed}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed user: still there
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_pids(pgid: int) -> set[int]:
    """The live (not zombie) members of process group ``pgid``, read from /proc (Linux; elsewhere none)."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # after "pid (comm)": state, ppid, pgrp, ...
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.add(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return pids


def _group_members(pgid: int, limit: int = 4) -> list[str]:
    """``pid command`` of up to ``limit`` live members of process group ``pgid``: what outlived the grace, named
    in the stop's last line so a slow stop can be told apart."""
    members = []
    for pid in sorted(_group_pids(pgid))[:limit]:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        members.append(f"{pid} {command.strip()[:80]}")
    return members


NEWCOMER_SCAN_SECONDS = 0.25
"""How often a stop reads /proc for members that joined Dagster's group after its signal (a few ms a scan)."""


def _signal_newcomers(pgid: int, signalled: set[int]) -> None:
    """SIGTERM the members of ``pgid`` that joined it after the group was signalled, and remember them.

    ``dagster dev``'s code-server proxy restarts a code server that exits before the proxy has begun its own
    shutdown (Dagster's log: "Code server process has exited with code 0. Restarting the code server
    process"). Signalled with the rest, the proxy then waits for that new code server, which no signal
    reached, until the grace's SIGKILL: two 20-s stops in one fresh-clone run of the suite (ac8fc82), and the idle
    SIGHUP case of tests/acceptance/test_dev_command.py failed 2 of 3 runs alone before this.
    """
    for pid in _group_pids(pgid) - signalled:
        signalled.add(pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def stop_all(group: subprocess.Popen[bytes], service: subprocess.Popen[bytes] | None,
             grace: float = GRACE_SECONDS) -> StopReport:
    """SIGTERM to ``group``'s whole process group and to ``service`` at once; SIGKILL what is left after ``grace``.

    ``group`` is the leader of its own process group (``start_new_session=True``). A member already gone is fine.
    """
    started = time.monotonic()
    deadline = started + grace
    pgid = group.pid
    signalled = _group_pids(pgid)  # before the signal: a member started after it is signalled on its own
    _signal_group(pgid, signal.SIGTERM)
    if service is not None and service.poll() is None:
        service.terminate()
    killed: list[str] = []
    dagster_done: float | None = None
    service_done: float | None = None if service is not None else 0.0
    next_scan = started  # newcomers are looked for every NEWCOMER_SCAN_SECONDS, not on every 50-ms poll
    while True:
        now = time.monotonic()
        if dagster_done is None and group.poll() is not None and not _group_alive(pgid):
            dagster_done = now - started
        if service is not None and service_done is None and service.poll() is not None:
            service_done = now - started
        if dagster_done is not None and service_done is not None:
            break
        if dagster_done is None and now >= next_scan:
            _signal_newcomers(pgid, signalled)
            next_scan = now + NEWCOMER_SCAN_SECONDS
        if now >= deadline:
            if dagster_done is None:
                rest = "; ".join(_group_members(pgid))
                killed.append("dagster dev" if group.poll() is None else
                              f"the rest of Dagster's process group ({rest or 'gone meanwhile'})")
                _signal_group(pgid, signal.SIGKILL)
            if service is not None and service_done is None:
                killed.append("embedding service")
                service.kill()
            break
        time.sleep(0.05)
    code = group.wait()
    if service is not None:
        service.wait()
    return StopReport(dagster_exit=code, seconds=time.monotonic() - started,
                      dagster_seconds=dagster_done if dagster_done is not None else time.monotonic() - started,
                      service_seconds=service_done if service is not None else None, killed=killed, grace=grace)
