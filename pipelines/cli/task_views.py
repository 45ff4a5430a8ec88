"""How `kbindex tasks` and `kbindex task ID` look in a terminal: pure rich renderables, no database.

The default views are made for an 80-column terminal: the list keeps ids and statuses whole and puts
one short detail per row (progress, error code or chunk count) in the only column that may wrap; the
rest is behind `--wide` (every column, never cut) and `--json` (every field, unchanged).
"""

from __future__ import annotations

import json

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from pipelines.domain.task_states import TERMINAL, TaskStatus

RECENT_EVENTS = 8
STATUS_STYLES = {
    "PENDING": "cyan", "RUNNING": "blue", "RETRY_WAIT": "yellow",
    "SUCCEEDED": "green", "DEAD": "bold red", "CANCELLED": "dim",
}


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _cells(*values: Any) -> list[Text]:
    """Cells as plain Text: a document id like '[/x]' is data, never rich markup."""
    return [value if isinstance(value, Text) else Text(_text(value)) for value in values]


def format_time(value: datetime | None) -> str:
    """Local time to the second (people compare it with their clock); blank when unset."""
    if value is None:
        return ""
    return (value.astimezone() if value.tzinfo else value).strftime("%Y-%m-%d %H:%M:%S")


def outcome_text(view: dict[str, Any]) -> str:
    """How a finished task ended: `done`, `failed in parse (0 of 1 done)`, `cancelled before it started`.

    Never a percent or a bare fraction: complete() leaves the publish stage's counter at 0 of 1, which read
    `publish 100% (0/1)` beside SUCCEEDED.
    """
    status = view["status"]
    if status == TaskStatus.SUCCEEDED:
        return "deleted: search no longer returns the document" if view.get("kind") == "delete" else "done"
    verb = "failed" if status == TaskStatus.DEAD else "cancelled"
    if not view.get("stage"):
        return f"{verb} before it started"
    counter = f" ({view.get('completed') or 0} of {view['total']} done)" if view.get("total") else ""
    return f"{verb} in {view['stage']}{counter}"


def progress_text(view: dict[str, Any]) -> str:
    """`embed 45% (120/300)`: stage, overall percent and the stage's own counter; a finished task's outcome."""
    if view["status"] in TERMINAL:
        return outcome_text(view)
    percent = f"{view['percent']:.0f}%"
    if not view.get("stage"):
        return percent
    counter = f" ({view.get('completed') or 0}/{view['total']})" if view.get("total") else ""
    return f"{view['stage']} {percent}{counter}"


def row_detail(view: dict[str, Any]) -> str:
    """The one thing worth knowing about a row of the short list, given its status (a delete says so)."""
    detail = _row_detail(view)
    if view.get("kind") != "delete":
        return detail
    return "deleted" if view["status"] == TaskStatus.SUCCEEDED else f"delete {detail}".rstrip()


def _row_detail(view: dict[str, Any]) -> str:
    status = view["status"]
    if status in (TaskStatus.DEAD, TaskStatus.RETRY_WAIT):
        return _text(view.get("error_code"))
    if status == TaskStatus.RUNNING:
        return f"{view['stage'] or 'starting'} {view['percent']:.0f}%"
    if status == TaskStatus.SUCCEEDED and view.get("chunk_count") is not None:
        return f"{view['chunk_count']} chunks"
    return ""


def _status(status: str) -> Text:
    return Text(status, style=STATUS_STYLES.get(status, ""))


def _list_table(**options: Any) -> Table:
    """A header rule and two spaces between columns (the box's blank separator plus one pad): no borders."""
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold",
                 **options)


def tasks_table(views: Sequence[dict[str, Any]], *, wide: bool = False) -> Table:
    """The task list. Short: id, tenant, document, version, status, detail. Wide: every column, unwrapped."""
    table = _list_table()
    whole = {"no_wrap": True}  # one line each; only a terminal narrower than the ids themselves cuts (with '…')
    if not wide:
        for header in ("id", "tenant", "document", "ver", "status"):
            table.add_column(header, justify="right" if header in ("id", "ver") else "left", **whole)
        table.add_column("detail", overflow="fold")  # the one column that gives way at 80 columns
        for v in views:
            table.add_row(*_cells(v["task_id"], v["tenant_id"], v["document_id"], v["version_number"],
                                  _status(v["status"]), row_detail(v)))
        return table
    headers = ("id", "tenant", "document", "ver", "type", "profile", "status", "progress", "attempts", "error",
               "updated")
    for header in headers:
        table.add_column(header, justify="right" if header in ("id", "ver") else "left", **whole)
    for v in views:
        table.add_row(*_cells(
            v["task_id"], v["tenant_id"], v["document_id"], v["version_number"],
            f"{v.get('task_type') or 'INDEX'} delete" if v.get("kind") == "delete" else v.get("task_type"), v.get("profile"),
            _status(v["status"]), progress_text(v), f"{v['attempts']}/{v['max_attempts']}", v.get("error_code"),
            format_time(v.get("updated_at")),
        ))
    return table


def print_whole(console: Console, renderable: RenderableType) -> None:
    """Print at the renderable's own width even past the terminal's (one line per row for `less -S`, grep)."""
    natural = console.measure(renderable, options=console.options.update(width=10_000)).maximum
    if natural <= console.width:
        console.print(renderable)
        return
    Console(file=console.file, width=natural, force_terminal=console.is_terminal, no_color=console.no_color,
            color_system=console.color_system).print(renderable)


def _next_step(view: dict[str, Any]) -> str:
    if view.get("can_retry"):
        return f"kbindex retry {view['task_id']}"
    if view.get("can_cancel"):
        return f"kbindex cancel {view['task_id']}  (or kbindex watch {view['task_id']})"
    return ""


def _state_line(view: dict[str, Any]) -> Text:
    """The status plus what it is waiting on: the lease for RUNNING, the next attempt for RETRY_WAIT."""
    line = _status(view["status"])
    if view["status"] == TaskStatus.RUNNING and view.get("lease_owner"):
        line.append(f"  leased to {view['lease_owner']} until {format_time(view.get('lease_until'))}")
    elif view["status"] == TaskStatus.RETRY_WAIT:
        line.append(f"  next attempt at {format_time(view.get('next_attempt_at'))}")
    elif view.get("finished_at"):
        line.append(f"  finished {format_time(view['finished_at'])}")
    return line


def summary_grid(view: dict[str, Any]) -> Table:
    """Label/value lines: state, progress (a finished task's outcome), attempts, error (code, then its message)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    tombstone = " (tombstone: deletes the document)" if view.get("kind") == "delete" else ""
    grid.add_row("document", Text(f"{view['tenant_id']} / {view['document_id']} v{view['version_number']}{tombstone}"))
    grid.add_row("profile", Text(f"{_text(view.get('profile'))} ({_text(view.get('task_type')) or 'INDEX'})"))
    if view.get("version_metadata"):
        grid.add_row("metadata", Text(json.dumps(view["version_metadata"], ensure_ascii=False)))
    if "version_allow" in view:
        allow = view.get("version_allow")
        grid.add_row("readers", Text(", ".join(allow) if allow else "the whole tenant"))
    grid.add_row("state", _state_line(view))
    grid.add_row("outcome" if view["status"] in TERMINAL else "progress", Text(progress_text(view)))
    grid.add_row("attempts", Text(f"{view['attempts']} of {view['max_attempts']}"))
    if view.get("error_code") or view.get("error_message"):
        grid.add_row("error", Text(_text(view.get("error_code")), style="red"))
        grid.add_row("", Text(_text(view.get("error_message"))))
    if view.get("chunk_count") is not None:
        grid.add_row("chunks", Text(str(view["chunk_count"])))
    grid.add_row("created", Text(format_time(view.get("created_at"))))
    for run in view.get("dagster_runs") or []:  # kept in the task's history, even after its partition key is pruned
        grid.add_row("run", Text(f"attempt {run['attempt']}: {run['url']}"))
    step = _next_step(view)
    if step:
        grid.add_row("next", Text(step))
    return grid


def recent_transitions(events: Sequence[dict[str, Any]], limit: int = RECENT_EVENTS) -> list[dict[str, Any]]:
    """The last ``limit`` state transitions (progress ticks are summed up in the progress line)."""
    return [e for e in events if e.get("kind", "transition") == "transition"][-limit:]


def events_table(events: Sequence[dict[str, Any]]) -> Table:
    """time, attempt, from, to, stage, code: one row per event given."""
    table = _list_table(title="recent events", title_justify="left")
    for header in ("time", "attempt", "from", "to", "stage"):
        table.add_column(header, no_wrap=True, justify="right" if header == "attempt" else "left")
    table.add_column("code", overflow="fold")
    for e in events:
        table.add_row(*_cells(format_time(e.get("created_at")), e["attempt"], e.get("from_status") or "-",
                              _status(e["to_status"]), e.get("stage"), e.get("error_code")))
    return table


def task_summary(view: dict[str, Any], events: Sequence[dict[str, Any]]) -> RenderableType:
    """`kbindex task ID`: a heading, the summary lines, the recent transitions and what was left out."""
    shown = recent_transitions(events)
    parts: list[RenderableType] = [Text(f"task {view['task_id']}", style="bold"), summary_grid(view), Text(""),
                                   events_table(shown)]
    if len(shown) < len(events):
        transitions = sum(e.get("kind", "transition") == "transition" for e in events)
        ticks = len(events) - transitions
        note = f"showing {len(shown)} of {transitions} transitions"
        note += f" and 0 of {ticks} progress ticks" if ticks else ""
        parts.append(Text(note + " (--json: all)", style="dim"))
    return Group(*parts)
