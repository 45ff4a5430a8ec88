"""`kbindex tasks | task ID | cancel ID | retry ID | stats | watch [ID]`."""

from __future__ import annotations

import time

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipelines.cli.app import JsonOption, app, console, errors_to_exit, open_database, print_json
from pipelines.cli.task_views import print_whole, task_summary, tasks_table
from pipelines.domain.task_states import TERMINAL, Stage, TaskStatus, overall_percent


def _queue(db):
    from resources.task_queue import TaskQueue

    return TaskQueue(db)


def task_view(task: dict) -> dict:
    """A task as people and scripts see it: the row plus kind (index or delete), percent, can_cancel, can_retry."""
    status = TaskStatus(task["status"])
    stage = Stage(task["stage"]) if task.get("stage") else None
    view = dict(task)
    view["kind"] = "delete" if task.get("version_kind") == "tombstone" else "index"
    view["percent"] = overall_percent(status, stage, task.get("completed") or 0, task.get("total") or 0)
    view["can_cancel"] = status in (TaskStatus.PENDING, TaskStatus.RETRY_WAIT, TaskStatus.RUNNING)
    view["can_retry"] = status in (TaskStatus.DEAD, TaskStatus.CANCELLED)
    return view


@app.command("tasks")
def tasks_command(
    status: str | None = typer.Option(None, "--status", help="PENDING, RUNNING, RETRY_WAIT, SUCCEEDED, DEAD, CANCELLED"),
    tenant: str | None = typer.Option(None, "--tenant"),
    limit: int = typer.Option(100, "--limit", min=1, max=10000),
    wide: bool = typer.Option(False, "--wide", help="Every column (profile, stage, attempts, error...), never cut."),
    as_json: bool = JsonOption,
) -> None:
    """List tasks, newest first (fits 80 columns; --wide or --json for everything)."""
    if status is not None and status.upper() not in TaskStatus.__members__:
        raise typer.BadParameter(f"unknown status {status!r}", param_hint="--status")
    with open_database() as db, errors_to_exit():
        rows = [task_view(r) for r in _queue(db).list(status=status, tenant=tenant, limit=limit)]
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no tasks")
        return
    table = tasks_table(rows, wide=wide)
    if wide:
        print_whole(console, table)
    else:
        console.print(table)


def dagster_runs(queue: object, task_id: int) -> list[dict]:
    """The Dagster runs that worked on the task, each with its page in the Dagster UI (KBINDEX_DAGSTER_URL)."""
    from resources.settings import dagster_ui_url

    base = dagster_ui_url()
    return [{"run_id": r["run_id"], "attempt": r["attempt"], "url": f"{base}/runs/{r['run_id']}"}
            for r in queue.dagster_runs(task_id)]  # type: ignore[attr-defined]


@app.command("task")
def task_command(task_id: int, as_json: bool = JsonOption) -> None:
    """Show one task: state, progress, attempts, last error and its recent events (--json: everything)."""
    with open_database() as db, errors_to_exit():
        queue = _queue(db)
        view = task_view(queue.get(task_id))
        view["events"] = queue.events(task_id)
        view["dagster_runs"] = dagster_runs(queue, task_id)
    if as_json:
        print_json(view)
        return
    console.print(task_summary(view, view["events"]), highlight=False)


@app.command("cancel")
def cancel_command(task_id: int, as_json: bool = JsonOption) -> None:
    """Cancel a PENDING, RETRY_WAIT or RUNNING task (exit 3 if its state does not allow it)."""
    with open_database(writes=True) as db, errors_to_exit():
        queue = _queue(db)
        queue.cancel(task_id)
        view = task_view(queue.get(task_id))
    print_json(view) if as_json else console.print(f"task {task_id} CANCELLED")


@app.command("retry")
def retry_command(
    task_id: int,
    attempts: int = typer.Option(3, "--attempts", min=1, max=100, help="Attempts to grant."),
    as_json: bool = JsonOption,
) -> None:
    """Send a DEAD or CANCELLED task back to PENDING (same row, attempts kept, more granted; exit 3 otherwise)."""
    with open_database(writes=True) as db, errors_to_exit():
        queue = _queue(db)
        queue.retry(task_id, extra_attempts=attempts)
        view = task_view(queue.get(task_id))
    print_json(view) if as_json else console.print(f"task {task_id} PENDING again (max attempts {view['max_attempts']})")


@app.command("stats")
def stats_command(as_json: bool = JsonOption) -> None:
    """Queue health: due now, oldest due age, running, leases expiring/expired, retry-waiting, dead by code."""
    from resources.profiles import migration_progress

    with open_database() as db, errors_to_exit():
        stats = _queue(db).stats()
        stats["migrations"] = migration_progress(db)
    if as_json:
        print_json(stats)
        return
    table = Table("measure", "value")
    for key, value in stats.items():
        if key != "migrations":
            table.add_row(key, str(value))
    console.print(table)
    for m in stats["migrations"]:
        eta = "unknown" if m["eta_seconds"] is None else f"{m['eta_seconds']:.0f}s"
        console.print(
            f"migration to [bold]{m['profile']}[/]: {m['done']}/{m['total']} ({m['percent']}%), "
            f"{m['rate_per_minute']:.1f}/min, ETA {eta}, failures {m['failures_by_code'] or 'none'}",
            highlight=False,
        )


@app.command("watch")
def watch_command(
    task_id: int | None = typer.Argument(None, help="One task; all active tasks when omitted."),
    interval: float = typer.Option(0.5, "--interval", min=0.1),
    timeout: float = typer.Option(0.0, "--timeout", help="Give up after this many seconds (0: never)."),
) -> None:
    """Live progress bars until the watched tasks are terminal (Ctrl-C leaves them running; watch again to resume)."""
    deadline = time.monotonic() + timeout if timeout > 0 else None
    with open_database() as db, errors_to_exit():
        queue = _queue(db)
        ids = [task_id] if task_id is not None else [
            t["task_id"] for s in ("RUNNING", "PENDING", "RETRY_WAIT") for t in queue.list(status=s, limit=200)
        ]
        if not ids:
            console.print("no active tasks")
            return
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                   TextColumn("{task.fields[state]}"), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            bars = {i: progress.add_task(f"task {i}", total=100, state="") for i in ids}
            final: dict[int, dict] = {}
            while len(final) < len(ids):
                for i in ids:
                    if i in final:
                        continue
                    view = task_view(queue.get(i))
                    state = view["status"] + (f" {view['stage']}" if view.get("stage") else "")
                    if view.get("error_code"):
                        state += f" {view['error_code']}"
                    progress.update(bars[i], completed=view["percent"], state=state,
                                    description=f"{view['document_id'][:40]} v{view['version_number']}")
                    if TaskStatus(view["status"]) in TERMINAL:
                        final[i] = view
                if deadline and time.monotonic() > deadline:
                    break
                time.sleep(interval)
    failed = [v for v in final.values() if v["status"] != "SUCCEEDED"]
    for v in failed:
        console.print(f"task {v['task_id']}: {v['status']} {v.get('error_code') or ''} {v.get('error_message') or ''}")
    if len(final) < len(ids):
        raise typer.Exit(1)
    raise typer.Exit(1 if failed else 0)
