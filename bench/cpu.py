"""Core-seconds each part of the system spends in a measured window: where a CPU-bound burst's time goes.

On a machine whose cores are all busy, wall time is about the CPU every part spends divided by the
cores; the bare-encode yardstick spends only the model's. So besides the wall-clock ratio the
pipeline benches report the CPU each part spent (embedding service, PostgreSQL, Dagster with its run
workers, the bench itself) and the ratio that CPU alone allows: ``bare core-seconds / pipeline
core-seconds``. The gap between that bound and the measured ratio is time lost to waiting (sensor
ticks, run start-up, idle cores); the gap between the bound and 1.0 is work the bare model does not do.

A process tree's CPU is the user + system time of its root and live descendants plus what the
children they already reaped spent (``children_user``/``children_system``): a run worker that exited
during the window is counted through the code server that waited for it. Trees must not nest.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def tree_seconds(pid: int) -> float:
    """CPU seconds spent so far by process ``pid``, its live descendants and their reaped children."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # exited between the listing and the read: its parent counts it once reaped
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


DAGSTER_PARTS = (
    ("dagster._daemon", "daemon"),
    ("dagster_webserver", "webserver"),
    ("dagster api grpc", "code server"),
    ("dagster code-server", "code server"),
    ("pipelines.warm_launcher", "fork server"),
    ("dagster api execute_run", "run processes"),
)
"""How ``tree_parts`` names a process of ``dagster dev``'s tree: the first marker its command line holds."""


def dagster_part(cmdline: str, parent_part: str | None) -> str:
    """The part of ``dagster dev`` a process is: a fork server's children are run processes (they keep its
    command line); anything unrecognised counts as ``dagster dev`` itself."""
    if parent_part == "fork server":
        return "run processes"
    for marker, part in DAGSTER_PARTS:
        if marker in cmdline:
            return part
    return "dagster dev"


def tree_parts(pid: int) -> dict[str, float]:
    """CPU seconds so far of ``dagster dev``'s tree by part (``dagster_part``): where Dagster's core-seconds go.

    A process's own time counts for its part; what its reaped children spent counts for the part they were: the
    fork server's and the code server's reaped children are run processes (the warm and the default launcher).
    """
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    part_of: dict[int, str] = {}
    out: dict[str, float] = {}
    for proc in procs:  # parents come before their children in this listing
        try:
            t, parent = proc.cpu_times(), proc.ppid()
        except psutil.Error:
            continue
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:  # a zombie (a run that exited, not yet reaped) has its times but no command line
            cmdline = ""
        part = dagster_part(cmdline, part_of.get(parent))
        part_of[proc.pid] = part
        out[part] = out.get(part, 0.0) + t.user + t.system
        reaped = "run processes" if part in ("fork server", "code server") else part
        out[reaped] = out.get(reaped, 0.0) + t.children_user + t.children_system
    return out


def own_seconds() -> float:
    """This process's own CPU seconds (not its children: Dagster and the services are measured apart)."""
    t = os.times()
    return t.user + t.system


def postgres_pid(url: str) -> int | None:
    """The postmaster serving ``url`` if it runs on this machine (parent of our backend), else None."""
    import psutil
    import psycopg

    from sql import queries

    with psycopg.connect(url, autocommit=True) as conn:  # ask while connected: a closed backend exits
        backend = conn.execute(queries["bench_backend_pid"]).fetchone()[0]
        try:
            return psutil.Process(backend).ppid()
        except psutil.Error:  # a server on another machine: its CPU is not ours to count
            return None


@dataclass
class CpuMeter:
    """Snapshots of named process trees' CPU; ``spent`` is the difference since ``start``; ``parts_spent`` the same
    for the tree named ``parts_of`` (``dagster dev``'s), by part (``tree_parts``)."""

    roots: Mapping[str, int | None]
    parts_of: str | None = None
    started: dict[str, float] = field(default_factory=dict)
    parts_started: dict[str, float] = field(default_factory=dict)

    def snapshot(self) -> dict[str, float]:
        out = {name: tree_seconds(pid) for name, pid in self.roots.items() if pid}
        out["bench client"] = own_seconds()
        return out

    def _parts(self) -> dict[str, float]:
        pid = self.roots.get(self.parts_of) if self.parts_of else None
        return tree_parts(pid) if pid else {}

    def start(self) -> None:
        self.started = self.snapshot()
        self.parts_started = self._parts()

    def spent(self) -> dict[str, float]:
        now = self.snapshot()
        return {name: round(now[name] - self.started.get(name, now[name]), 2) for name in now}

    def parts_spent(self) -> dict[str, float]:
        now = self._parts()
        spent = {name: round(now[name] - self.parts_started.get(name, 0.0), 2) for name in now}
        return dict(sorted(spent.items(), key=lambda item: -item[1]))


def budget(spent: Mapping[str, float], wall: float, bare_core_seconds: float, cpus: int) -> dict[str, Any]:
    """The CPU account of a burst beside the bare encode's: cores kept busy and the ratio CPU allows."""
    total = round(sum(spent.values()), 2)
    return {
        "core_seconds": dict(spent),
        "total_core_seconds": total,
        "cores_busy": round(total / wall, 2) if wall else None,
        "bare_core_seconds": round(bare_core_seconds, 6),  # the fake model's bare encode takes milliseconds
        "ratio_cpu_allows": bare_core_seconds / total if total else None,  # unrounded: tiny for the fake model
        "cpus": cpus,
    }


def render(account: Mapping[str, Any], dagster_parts: Mapping[str, float] | None = None) -> str:
    bound = account["ratio_cpu_allows"]
    parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in account["core_seconds"].items())
    return (f"CPU (core-seconds)   {parts}; total {account['total_core_seconds']:.1f}, "
            f"{account['cores_busy']} of {account['cpus']} cores busy on average\n"
            + (f"Dagster by part      {render_parts(dagster_parts)}\n" if dagster_parts else "")
            + f"CPU bound            bare encode spent {account['bare_core_seconds']:.1f} core-s on the same texts: "
            f"with every core busy the ratio could reach {'n/a' if bound is None else f'{bound:.3g}'} at most")


def render_parts(parts: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.2f}" for name, seconds in parts.items())
