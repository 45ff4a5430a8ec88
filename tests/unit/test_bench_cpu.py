"""bench/cpu.py counts a process tree's CPU, including children that already exited, and nothing twice."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.cpu import CpuMeter, budget, render, tree_seconds

BURN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"
AFTER = "print('burnt', flush=True)\ntime.sleep(60)\n"  # a live burner says when it is done, then idles


def _spawn_burners(seconds: float, finished: int, running: int) -> subprocess.Popen[bytes]:
    """A parent that waits for ``finished`` burners (reaped: only its children_* fields remember them),
    then starts ``running`` more and sleeps until killed."""
    script = (
        "import subprocess, sys, time\n"
        f"burn = {BURN.format(seconds=seconds)!r}\n"
        f"for _ in range({finished}): subprocess.run([sys.executable, '-c', burn])\n"
        f"live = [subprocess.Popen([sys.executable, '-c', burn + {AFTER!r}]) for _ in range({running})]\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)


@pytest.mark.timeout(60)
def test_a_tree_counts_reaped_and_live_children_once():
    proc = _spawn_burners(0.4, finished=2, running=1)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        assert proc.stdout.readline().strip() == b"burnt"  # the live one has burnt its share and sleeps
        spent = tree_seconds(proc.pid)
        # 3 burners x 0.4 s, plus the interpreters' start-up; a double count would pass 2.4 s
        assert 1.2 <= spent < 2.4
    finally:
        proc.kill()
        proc.wait()


def test_a_meter_reports_the_difference_since_start_and_a_gone_process_as_nothing():
    meter = CpuMeter({"gone": 2**22 + 12345})  # no such pid
    meter.start()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    spent = meter.spent()
    assert spent["gone"] == 0.0
    assert 0.15 <= spent["bench client"] < 1.0


def test_the_budget_says_how_busy_the_cores_were_and_what_ratio_the_cpu_allows():
    account = budget({"embedding service": 70.0, "PostgreSQL": 12.0, "Dagster": 18.0}, wall=60.0,
                     bare_core_seconds=71.0, cpus=2)
    assert account["total_core_seconds"] == 100.0
    assert account["cores_busy"] == 1.67
    assert account["ratio_cpu_allows"] == 0.71
    text = render(account)
    assert "Dagster 18.0" in text and "0.71 at most" in text


def test_a_millisecond_bare_encode_still_bounds_the_ratio_above_zero():
    """The fake model's bare encode takes a few ms against a minute of Dagster: rounding made the bound 0 (CI)."""
    account = budget({"Dagster": 40.0, "PostgreSQL": 5.0}, wall=30.0, bare_core_seconds=0.0021, cpus=2)
    assert account["bare_core_seconds"] == 0.0021
    assert 0 < account["ratio_cpu_allows"] < 1e-4
    assert "4.67e-05 at most" in render(account)
    assert "n/a at most" in render(budget({}, wall=1.0, bare_core_seconds=0.0, cpus=2))


def _spawn_fork_server(seconds: float) -> subprocess.Popen[bytes]:
    """A process named like the warm launcher's fork server (its command line holds ``pipelines.warm_launcher``)
    that forks a burner and reaps it, forks another that burns and stays alive, and a third that burns and exits
    unreaped (a zombie), and idles."""
    script = (
        "import os, time\n"
        f"burn = {BURN.format(seconds=seconds)!r}\n"
        "def child(stay):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        exec(burn)\n"
        "        os.write(1, b'burnt\\n')\n"  # one write: two burners' lines never interleave
        "        time.sleep(60 if stay else 0)\n"
        "        os._exit(0)\n"
        "    return pid\n"
        "os.waitpid(child(False), 0)\n"
        "child(True)\n"
        "child(False)\n"  # exits and stays a zombie: never waited for
        "time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", script, "pipelines.warm_launcher"], stdout=subprocess.PIPE)


@pytest.mark.timeout(60)
def test_dagster_parts_give_a_fork_servers_children_to_the_run_processes():
    proc = _spawn_fork_server(0.4)
    try:
        meter = CpuMeter({"Dagster": proc.pid}, parts_of="Dagster")
        meter.start()  # before either burner has burnt much: the differences hold nearly all of their CPU
        for _ in range(3):
            assert proc.stdout.readline().strip() == b"burnt"
        time.sleep(0.3)  # the last one has exited (a zombie: it has no command line any more)
        parts = meter.parts_spent()
        # the reaped one through the fork server's children_* fields, the live one and the zombie by their parent
        assert 0.95 <= parts["run processes"] < 1.5, parts
        assert parts.get("fork server", 0.0) < 0.3, parts  # its own time only, not its children's
        assert abs(sum(parts.values()) - meter.spent()["Dagster"]) < 0.1  # the parts add up to the tree
        assert f"run processes {parts['run processes']:.2f}" in render(budget({"Dagster": 1.0}, 1.0, 1.0, 2), parts)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("cmdline", "parent", "part"), [
    ("python -m dagster._daemon run --log-level info", None, "daemon"),
    ("python -m dagster api grpc --lazy-load-user-code", "code server", "code server"),
    ("python -m dagster api execute_run {...}", "code server", "run processes"),
    ("python -m pipelines.warm_launcher /tmp/fork.sock", "daemon", "fork server"),
    ("python -m pipelines.warm_launcher /tmp/fork.sock", "fork server", "run processes"),
    ("python -m dagster dev -m pipelines.definitions", None, "dagster dev"),
])
def test_a_dagster_process_is_named_by_its_command_line_and_parent(cmdline, parent, part):
    from bench.cpu import dagster_part

    assert dagster_part(cmdline, parent) == part
