"""The calm terminal of ``kbindex dev``: a short status block that stays on screen.

Dagster's own output goes to a log file; the terminal shows only the UI URL, that log's path, tasks by
state, runs in flight and whether (and how) the sample corpus can be searched. Each refresh costs one
named query per part (``task_stats``, ``index_task_tenant_summary``) and one GraphQL count from the
Dagster webserver. On a terminal the block is redrawn in place (rich ``Live``); elsewhere (tests, CI,
a log) each line is printed again only when it changes.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pipelines.domain.errors import KbindexError

SEARCH_EXAMPLE = 'kbindex search "how should docstrings be written" --tenant {tenant}'
TASK_STATES = (("PENDING", "pending"), ("RETRY_WAIT", "retry_waiting"), ("RUNNING", "running"),
               ("SUCCEEDED", "succeeded"), ("DEAD", "dead"), ("CANCELLED", "cancelled"))
OPEN_STATES = ("PENDING", "RUNNING", "RETRY_WAIT")
RUN_COUNTS_QUERY = (
    "{ inFlight: runsOrError(filter: {statuses: [STARTING, STARTED, CANCELING]}) { ... on Runs { count } }"
    "  queued: runsOrError(filter: {statuses: [QUEUED]}) { ... on Runs { count } } }"
)


@dataclass
class DevStatus:
    """What the status block shows; filled by :class:`StatusReader`, drawn by :func:`status_lines`."""

    ui_url: str
    log_path: Path
    sample_tenant: str | None = None
    ui_up: bool = False
    runs: tuple[int, int] | None = None
    """(in flight, queued) from the Dagster webserver; None while it does not answer."""
    tasks: dict[str, int] = field(default_factory=dict)
    sample: dict[str, int] = field(default_factory=dict)
    database_error: str | None = None
    stopping: bool = False
    dagster_exit: int | None = None
    stopped_in: float | None = None
    """Seconds from the stop signal until Dagster's group and the embedding service were gone."""
    killed: list[str] = field(default_factory=list)
    """What had to be SIGKILLed after the grace period (normally nothing)."""


def _searchable_lines(s: DevStatus) -> list[tuple[str, str]]:
    if s.sample_tenant is None:
        return [("searchable", "publish with `kbindex publish DIR --tenant T`, then: kbindex search \"QUERY\" --tenant T")]
    total = sum(s.sample.values())
    open_ = sum(s.sample.get(state, 0) for state in OPEN_STATES)
    done, dead = s.sample.get("SUCCEEDED", 0), s.sample.get("DEAD", 0)
    if total == 0 or open_:
        return [("searchable", f"indexing the sample corpus: {done} of {total} documents searchable so far")]
    failed = f", {dead} failed" if dead else ""
    return [("searchable", f"{done} sample documents in tenant '{s.sample_tenant}'{failed}. Try:"),
            ("", SEARCH_EXAMPLE.format(tenant=s.sample_tenant))]


def status_lines(s: DevStatus) -> list[tuple[str, str]]:
    """The block as (label, text) rows; the same rows on a terminal and in plain output."""
    if s.dagster_exit is not None:
        took = f" in {s.stopped_in:.1f} s" if s.stopped_in is not None else ""
        killed = f", killed: {', '.join(s.killed)}" if s.killed else ""
        ui = f"{s.ui_url}  (Dagster stopped{took}, exit {s.dagster_exit}{killed})"
    elif s.stopping:
        ui = f"{s.ui_url}  (stopping…)"
    else:
        ui = s.ui_url + ("" if s.ui_up else "  (starting…)")
    if s.database_error:
        tasks = f"database not answering: {s.database_error}"
    else:
        tasks = "  ".join(f"{state} {s.tasks[state]}" for state, _ in TASK_STATES if s.tasks.get(state)) or "none yet"
    runs = f"{s.runs[0]} in flight, {s.runs[1]} queued" if s.runs is not None else "-"
    return [
        ("Dagster UI", ui),
        ("Dagster log", str(s.log_path)),
        ("tasks", tasks),
        ("runs", runs),
        *_searchable_lines(s),
        ("stop", "Ctrl-C stops Dagster and the embedding service; `kbindex db stop` stops PostgreSQL"
                 if s.dagster_exit is None else "PostgreSQL keeps running: `kbindex db stop` stops it"),
    ]


def render(s: DevStatus) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, text in status_lines(s):
        grid.add_row(label, Text(text))  # Text: never read as rich markup
    return grid


def dagster_run_counts(ui_url: str, timeout: float = 2.0) -> tuple[int, int] | None:
    """(in flight, queued) runs from the webserver's GraphQL API; None if it does not answer (yet)."""
    body = json.dumps({"query": RUN_COUNTS_QUERY}).encode()
    request = urllib.request.Request(f"{ui_url}/graphql", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            data = json.loads(resp.read())["data"]
        return int(data["inFlight"]["count"]), int(data["queued"]["count"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class StatusReader:
    """Refreshes a :class:`DevStatus` from the kbindex database and the Dagster webserver."""

    def __init__(self, db: Any, run_counts: Callable[[str], tuple[int, int] | None] = dagster_run_counts) -> None:
        self.db, self.run_counts = db, run_counts

    def __call__(self, s: DevStatus) -> None:
        s.runs = self.run_counts(s.ui_url)
        s.ui_up = s.ui_up or s.runs is not None
        try:
            stats = self.db.fetch_one("task_stats", {"now": None}) or {}
            s.tasks = {state: int(stats.get(column) or 0) for state, column in TASK_STATES}
            if s.sample_tenant is not None:
                rows = self.db.fetch_all("index_task_tenant_summary", {"tenant_id": s.sample_tenant})
                s.sample = {r["status"]: int(r["n"]) for r in rows}
            s.database_error = None
        except KbindexError as exc:
            s.database_error = exc.message


def show_status(console: Console, s: DevStatus, refresh: Callable[[DevStatus], None], stop: threading.Event,
                interval: float = 2.0) -> None:
    """Refresh and draw the block every ``interval`` s until ``stop`` is set, then draw the final state."""
    if console.is_terminal:
        with Live(render(s), console=console, auto_refresh=False, transient=False) as live:
            _refresh_until(stop, interval, lambda: refresh(s), lambda: live.update(render(s), refresh=True))
        return
    printed: dict[str, str] = {}

    def print_changed_lines() -> None:
        for label, text in status_lines(s):
            if printed.get(label) != text:
                console.print(f"{label}: {text}" if label else f"  {text}", markup=False, highlight=False,
                              soft_wrap=True)
                printed[label] = text

    _refresh_until(stop, interval, lambda: refresh(s), print_changed_lines)


def _refresh_until(stop: threading.Event, interval: float, refresh: Callable[[], None],
                   draw: Callable[[], None]) -> None:
    while True:
        refresh()
        draw()
        if stop.wait(interval):
            draw()  # the state the caller set last (stopping, Dagster's exit code)
            return
