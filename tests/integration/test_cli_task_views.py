"""`kbindex tasks` and `kbindex task ID` read well in an 80-column terminal; `--wide` and `--json` keep the rest.

The CLI runs as a subprocess with COLUMNS=80, as a person's terminal would run it, against a real database
holding one task in every status, with 20-character tenant and document ids.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from pipelines.cli.app import dumps
from pipelines.cli.task_commands import task_view
from pipelines.cli.task_views import format_time
from pipelines.domain.task_states import Stage

TENANT = "tenant-abcdefghijklm"  # 20 characters
DOCS = {status: f"{status.lower().replace('_', '-')}-handbook-2024"[:20].ljust(20, "x") for status in
        ("PENDING", "RUNNING", "RETRY_WAIT", "DEAD", "SUCCEEDED", "CANCELLED")}
PARSE_MESSAGE = "could not parse page 3: bad xref table"


def kbindex(db_url: str, *args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KBINDEX_DATABASE_URL": db_url, "COLUMNS": str(columns), "LINES": "50"}
    env.pop("FORCE_COLOR", None)
    return subprocess.run([sys.executable, "-c", "from pipelines.cli import main; main()", *args],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def tasks(publish_task, queue) -> dict[str, int]:
    """One task per status: status -> task_id."""
    ids = {status: publish_task(TENANT, doc).task_id for status, doc in DOCS.items()}
    running = queue.claim_task(ids["RUNNING"], "worker-1")
    queue.progress(running.lease, Stage.EMBED, 120, 300)
    queue.fail(queue.claim_task(ids["RETRY_WAIT"], "worker-1").lease, "EMBEDDING_TIMEOUT", "no answer in 30s")
    dead = queue.claim_task(ids["DEAD"], "worker-1")
    queue.progress(dead.lease, Stage.PARSE, 0, 1)
    queue.fail(dead.lease, "PARSE_ERROR", PARSE_MESSAGE)
    done = queue.claim_task(ids["SUCCEEDED"], "worker-1")
    queue.progress(done.lease, Stage.PUBLISH, 7, 7)
    queue.complete(done.lease, chunk_count=7)
    queue.cancel(ids["CANCELLED"])
    return ids


def _row(out: str, doc: str) -> str:
    (line,) = [line.rstrip() for line in out.splitlines() if doc in line]
    return line


def test_tasks_fit_80_columns_without_cutting_ids_or_statuses(db_url: str, tasks: dict[str, int]) -> None:
    result = kbindex(db_url, "tasks")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert out.splitlines()[0].split() == ["id", "tenant", "document", "ver", "status", "detail"]
    for status, doc in DOCS.items():
        assert _row(out, doc).split()[:5] == [str(tasks[status]), TENANT, doc, "1", status]
    assert "embed 45%" in _row(out, DOCS["RUNNING"])
    assert _row(out, DOCS["DEAD"]).endswith("PARSE_ERROR")
    assert _row(out, DOCS["SUCCEEDED"]).endswith("7 chunks")
    # A code longer than the room left wraps inside its cell, whole: nothing is lost.
    assert "RETRY_WAITEMBEDDING_TIMEOUT" in re.sub(r"\s", "", out)


def test_tasks_wide_shows_every_column_one_line_per_task(db_url: str, tasks: dict[str, int]) -> None:
    result = kbindex(db_url, "tasks", "--wide")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "…" not in out, out
    assert out.splitlines()[0].split() == ["id", "tenant", "document", "ver", "type", "profile", "status",
                                           "progress", "attempts", "error", "updated"]
    assert sum(TENANT in line for line in out.splitlines()) == len(DOCS)  # never wrapped, even past 80 columns
    running = _row(out, DOCS["RUNNING"])
    assert "minilm-v1" in running and "embed 45% (120/300)" in running and "1/5" in running
    assert "EMBEDDING_TIMEOUT" in _row(out, DOCS["RETRY_WAIT"])
    assert _row(out, DOCS["SUCCEEDED"]).split()[7] == "done"  # the progress column: its outcome


def test_tasks_json_is_unchanged_and_ignores_wide(db_url: str, queue, tasks: dict[str, int]) -> None:
    expected = json.loads(dumps([task_view(r) for r in queue.list()]))
    for args in (["tasks", "--json"], ["tasks", "--json", "--wide"]):
        result = kbindex(db_url, *args)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == expected
    assert {"task_id", "status", "stage", "attempts", "error_code", "percent", "can_cancel", "can_retry"} <= set(
        expected[0])


def test_tasks_with_no_match_says_so(db_url: str, tasks: dict[str, int]) -> None:
    result = kbindex(db_url, "tasks", "--tenant", "nobody")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no tasks"


def test_task_summary_of_a_dead_task(db_url: str, queue, tasks: dict[str, int]) -> None:
    task_id = tasks["DEAD"]
    result = kbindex(db_url, "task", str(task_id))
    assert result.returncode == 0, result.stderr
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    assert "…" not in result.stdout and max(map(len, lines)) <= 80, result.stdout
    assert lines[0] == f"task {task_id}"
    assert lines[1].split() == ["document", TENANT, "/", DOCS["DEAD"], "v1"]
    by_label = {line.split()[0]: line for line in lines[1:] if line and not line.startswith(" ")}
    assert by_label["state"].split()[:2] == ["state", "DEAD"]
    assert by_label["outcome"].split() == ["outcome", "failed", "in", "parse", "(0", "of", "1", "done)"]
    assert "progress" not in by_label  # a finished task has an outcome, not a percent
    assert by_label["attempts"].split() == ["attempts", "1", "of", "5"]
    error_at = lines.index(by_label["error"])
    assert lines[error_at].split() == ["error", "PARSE_ERROR"]
    assert lines[error_at + 1].strip() == PARSE_MESSAGE  # the message on its own line, nothing glued to it
    assert by_label["next"].split() == ["next", "kbindex", "retry", str(task_id)]
    # Recent events: time, attempt, from, to, stage, code; the progress tick is left to --json.
    events = queue.events(task_id)
    header_at = lines.index("recent events") + 1
    assert lines[header_at].split() == ["time", "attempt", "from", "to", "stage", "code"]
    transitions = [e for e in events if e["kind"] == "transition"]
    assert len(transitions) == 3 and len(events) == 4
    rows = [line.split() for line in lines[header_at + 2:header_at + 5]]
    assert rows[0][2:] == ["0", "-", "PENDING"]  # published: no attempt yet
    assert rows[1][2:] == ["1", "PENDING", "RUNNING"]
    assert rows[2][2:] == ["1", "RUNNING", "DEAD", "parse", "PARSE_ERROR"]
    assert " ".join(rows[2][:2]) == format_time(transitions[2]["created_at"])
    assert lines[header_at + 5] == "showing 3 of 3 transitions and 0 of 1 progress ticks (--json: all)"


def test_task_summary_of_a_succeeded_task(db_url: str, queue, publish_task) -> None:
    """Publishing begins at 0 of 1 and complete() leaves that counter: the summary says `done`, not `(0/1)`."""
    task_id = publish_task(TENANT, "finished-handbook").task_id
    claimed = queue.claim_task(task_id, "worker-1")
    queue.progress(claimed.lease, Stage.PUBLISH, 0, 1)
    queue.complete(claimed.lease, chunk_count=7)
    result = kbindex(db_url, "task", str(task_id))
    assert result.returncode == 0, result.stderr
    out = "\n".join(line.rstrip() for line in result.stdout.splitlines())
    assert re.search(r"^state\s+SUCCEEDED\s+finished \d{4}-", out, re.M), out
    assert re.search(r"^outcome\s+done$", out, re.M) and re.search(r"^chunks\s+7$", out, re.M), out
    assert not re.search(r"^progress", out, re.M) and "0/1" not in out and "100%" not in out, out


def test_task_summary_of_a_running_task(db_url: str, tasks: dict[str, int]) -> None:
    task_id = tasks["RUNNING"]
    result = kbindex(db_url, "task", str(task_id))
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout and max(len(line) for line in result.stdout.splitlines()) <= 80, result.stdout
    out = "\n".join(line.rstrip() for line in result.stdout.splitlines())
    assert re.search(r"^state\s+RUNNING\s+leased to worker-1 until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", out, re.M), out
    assert re.search(r"^progress\s+embed 45% \(120/300\)$", out, re.M), out
    assert re.search(r"^attempts\s+1 of 5$", out, re.M), out
    assert not re.search(r"^error", out, re.M)
    assert re.search(rf"^next\s+kbindex cancel {task_id}", out, re.M), out
    assert out.endswith("\nshowing 2 of 2 transitions and 0 of 1 progress ticks (--json: all)")


def test_task_json_is_unchanged(db_url: str, queue, tasks: dict[str, int]) -> None:
    task_id = tasks["DEAD"]
    expected = json.loads(dumps({**task_view(queue.get(task_id)), "events": queue.events(task_id)}))
    result = kbindex(db_url, "task", str(task_id), "--json")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown.pop("dagster_runs") == []  # added (the runs that worked on it); nothing else changed
    assert shown == expected


def test_task_not_found_is_an_error(db_url: str) -> None:
    result = kbindex(db_url, "task", "999999")
    assert result.returncode == 1
    assert "TASK_NOT_FOUND" in result.stderr and result.stdout == ""
