"""The `kbindex dev` status block: what it says, when it prints, and how it survives what is not up yet."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from rich.console import Console

from pipelines.cli.dev_status import DevStatus, StatusReader, dagster_run_counts, show_status, status_lines
from pipelines.domain.errors import IndexWriteFailed


def _status(**kw) -> DevStatus:
    return DevStatus(ui_url="http://127.0.0.1:3000", log_path=Path("/h/logs/dagster.log"), sample_tenant="demo", **kw)


def _text(s: DevStatus) -> str:
    return "\n".join(f"{label}: {text}" for label, text in status_lines(s))


def test_the_search_hint_appears_only_once_every_sample_task_is_settled():
    indexing = _status(ui_up=True, sample={"SUCCEEDED": 3, "RUNNING": 2})
    assert "3 of 5 documents searchable so far" in _text(indexing)
    assert "kbindex search" not in _text(indexing)

    done = _status(ui_up=True, sample={"SUCCEEDED": 4, "DEAD": 1})
    assert "searchable: 4 sample documents in tenant 'demo', 1 failed. Try:" in _text(done)
    assert 'kbindex search "how should docstrings be written" --tenant demo' in _text(done)


def test_the_block_names_the_url_the_log_and_what_is_not_up_yet():
    starting = _text(_status())
    assert "Dagster UI: http://127.0.0.1:3000  (starting…)" in starting
    assert "Dagster log: /h/logs/dagster.log" in starting
    assert "runs: -" in starting and "tasks: none yet" in starting
    up = _text(_status(ui_up=True, runs=(2, 1), tasks={"RUNNING": 4, "SUCCEEDED": 7}))
    assert "runs: 2 in flight, 1 queued" in up and "tasks: RUNNING 4  SUCCEEDED 7" in up
    stopped = _text(_status(ui_up=True, dagster_exit=1))
    assert "(Dagster stopped, exit 1)" in stopped and "stop: PostgreSQL keeps running" in stopped


def test_without_the_sample_it_says_how_to_publish_and_search():
    text = _text(DevStatus(ui_url="http://h:1", log_path=Path("/l")))
    assert "searchable: publish with `kbindex publish DIR --tenant T`" in text


def test_run_counts_are_none_while_the_webserver_does_not_answer():
    assert dagster_run_counts("http://127.0.0.1:9", timeout=0.5) is None


class _BrokenDb:
    def fetch_one(self, name, params=None):
        raise IndexWriteFailed("connection refused")

    fetch_all = fetch_one


class _Db:
    def fetch_one(self, name, params=None):
        assert name == "task_stats"
        return {"pending": 2, "running": 1, "succeeded": 5, "dead": 0}

    def fetch_all(self, name, params=None):
        assert name == "index_task_tenant_summary" and params == {"tenant_id": "demo"}
        return [{"status": "SUCCEEDED", "n": 5}]


def test_a_database_error_is_shown_not_raised_and_clears_when_it_answers_again():
    s = _status()
    StatusReader(_BrokenDb(), run_counts=lambda url: None)(s)
    assert s.database_error == "connection refused" and not s.ui_up
    assert "tasks: database not answering: connection refused" in _text(s)

    StatusReader(_Db(), run_counts=lambda url: (1, 0))(s)
    assert s.database_error is None and s.ui_up and s.runs == (1, 0)
    assert s.tasks == {"PENDING": 2, "RETRY_WAIT": 0, "RUNNING": 1, "SUCCEEDED": 5, "DEAD": 0, "CANCELLED": 0}
    assert s.sample == {"SUCCEEDED": 5}


def test_plain_output_prints_each_line_again_only_when_it_changes_and_ends_with_the_final_state():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    s = _status()
    stop = threading.Event()
    refreshes = iter([{"RUNNING": 1}, {"RUNNING": 1}, {"RUNNING": 1}, {"SUCCEEDED": 1}])

    def refresh(status: DevStatus) -> None:
        status.ui_up, status.runs = True, (0, 0)
        status.sample = next(refreshes, None) or status.sample
        if status.sample == {"SUCCEEDED": 1}:
            status.dagster_exit = 0
            stop.set()

    show_status(console, s, refresh, stop, interval=0.01)
    lines = out.getvalue().splitlines()
    assert sum("Dagster log:" in line for line in lines) == 1
    assert sum("0 of 1 documents searchable so far" in line for line in lines) == 1
    assert any('kbindex search "how should docstrings be written" --tenant demo' in line for line in lines)
    assert "Dagster UI: http://127.0.0.1:3000  (Dagster stopped, exit 0)" in lines
    assert len(lines) == 10  # six lines, then only the four that changed
