"""The terminal views of tasks (pipelines/cli/task_views.py), rendered at 80 columns without a database."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

from rich.console import Console

from pipelines.cli.task_commands import task_view
from pipelines.cli.task_views import RECENT_EVENTS, print_whole, task_summary, tasks_table

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _task(**fields) -> dict:
    row = dict(task_id=7, tenant_id="acme", document_id="policy", version_number=2, task_type="INDEX",
               profile="minilm-v1", status="PENDING", attempts=0, max_attempts=5, stage=None, completed=0, total=0,
               error_code=None, error_message=None, chunk_count=None, lease_owner=None, lease_until=None,
               next_attempt_at=NOW, created_at=NOW, updated_at=NOW, started_at=None, finished_at=None)
    return task_view({**row, **fields})


def _render(renderable, width: int = 80, wide: bool = False) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False)
    print_whole(console, renderable) if wide else console.print(renderable)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def _event(n: int, to_status: str, kind: str = "transition") -> dict:
    return dict(event_id=n, kind=kind, attempt=n, from_status="RUNNING", to_status=to_status, stage=None,
                error_code=None, created_at=NOW + timedelta(seconds=n))


def test_ids_and_messages_are_data_not_markup() -> None:
    task = _task(document_id="[/x] [bold]odd", status="DEAD", error_code="PARSE_ERROR",
                 error_message="bad [red]xref[/red] near [/]")
    assert "[/x] [bold]odd" in _render(tasks_table([task]))
    assert "[/x] [bold]odd" in _render(tasks_table([task], wide=True), wide=True)
    assert "bad [red]xref[/red] near [/]" in _render(task_summary(task, []))


def test_summary_shows_when_a_waiting_task_runs_again() -> None:
    task = _task(status="RETRY_WAIT", attempts=2, error_code="EMBEDDING_TIMEOUT", error_message="no answer",
                 next_attempt_at=NOW + timedelta(minutes=1))
    out = _render(task_summary(task, []))
    assert "RETRY_WAIT  next attempt at " in out
    assert "attempts  2 of 5" in out
    assert "error     EMBEDDING_TIMEOUT\n          no answer" in out
    assert "next      kbindex cancel 7" in out


def test_summary_lists_only_the_last_transitions_and_says_so() -> None:
    events = [_event(n, "RETRY_WAIT") for n in range(1, RECENT_EVENTS + 4)]
    out = _render(task_summary(_task(status="RETRY_WAIT"), events))
    shown = [line.split()[2] for line in out.splitlines() if line.endswith("RETRY_WAIT") and line[:4].isdigit()]
    assert shown == [str(n) for n in range(4, RECENT_EVENTS + 4)]  # attempts of the newest 8, oldest first
    assert out.endswith(f"showing {RECENT_EVENTS} of {RECENT_EVENTS + 3} transitions (--json: all)")
    ticks = _render(task_summary(_task(), [_event(1, "PENDING"), _event(2, "RUNNING", kind="progress")]))
    assert ticks.endswith("showing 1 of 1 transitions and 0 of 1 progress ticks (--json: all)")
    assert "(--json: all)" not in _render(task_summary(_task(), [_event(1, "PENDING")]))


def test_wide_list_is_printed_whole_past_the_terminal_width() -> None:
    out = _render(tasks_table([_task(document_id="d" * 60, error_code="EMBEDDING_INVALID_RESPONSE")], wide=True),
                  wide=True)
    (row,) = [line for line in out.splitlines() if "d" * 60 in line]
    assert len(row) > 80 and "EMBEDDING_INVALID_RESPONSE" in row and "…" not in out


def _line(out: str, label: str) -> str | None:
    return next((line for line in out.splitlines() if line.split()[:1] == [label]), None)


def test_a_finished_task_shows_its_outcome_not_a_progress_fraction() -> None:
    # complete() leaves the publish stage's counter where it was when publishing began: 0 of 1.
    done = _task(status="SUCCEEDED", attempts=1, stage="publish", completed=0, total=1, chunk_count=7, finished_at=NOW)
    dead = _task(status="DEAD", attempts=1, stage="parse", completed=0, total=1, error_code="PARSE_ERROR",
                 error_message="bad xref", finished_at=NOW)
    cancelled = _task(status="CANCELLED", attempts=1, stage="embed", completed=120, total=300, finished_at=NOW)
    never = _task(status="CANCELLED", finished_at=NOW)
    for task, outcome in ((done, "outcome   done"), (dead, "outcome   failed in parse (0 of 1 done)"),
                          (cancelled, "outcome   cancelled in embed (120 of 300 done)"),
                          (never, "outcome   cancelled before it started")):
        out = _render(task_summary(task, []))
        assert _line(out, "outcome") == outcome, out
        assert _line(out, "progress") is None and "%" not in out, out
    wide = _render(tasks_table([done, dead], wide=True), wide=True)
    assert "done" in wide and "failed in parse" in wide and "%" not in wide and "0/1" not in wide, wide


def test_a_running_task_keeps_its_progress_line() -> None:
    out = _render(task_summary(_task(status="RUNNING", attempts=1, stage="embed", completed=120, total=300), []))
    assert _line(out, "progress") == "progress  embed 45% (120/300)" and _line(out, "outcome") is None, out


def test_a_delete_says_so_in_the_list_the_wide_list_and_the_summary() -> None:
    pending = _task(version_kind="tombstone")
    done = _task(task_id=8, version_kind="tombstone", status="SUCCEEDED", chunk_count=0, finished_at=NOW)
    content = _task(task_id=9, status="SUCCEEDED", chunk_count=3, finished_at=NOW)
    assert (pending["kind"], content["kind"]) == ("delete", "index")
    short = _render(tasks_table([pending, done, content])).splitlines()
    assert short[2].split()[-1] == "delete" and short[3].split()[-1] == "deleted" and short[4].endswith("3 chunks")
    assert "INDEX delete" in _render(tasks_table([pending], wide=True), wide=True)
    summary = _render(task_summary(done, [_event(1, "SUCCEEDED")]))
    assert "policy v2 (tombstone: deletes the document)" in summary
    assert "deleted: search no longer returns the document" in summary
