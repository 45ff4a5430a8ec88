"""Task events over Server-Sent Events, against a real uvicorn server on 127.0.0.1.

Transitions are driven with TaskQueue while the stream is open; the stream must deliver each
event with ``id: <event_id>``, resume after a dropped connection with exactly the missed events
(``Last-Event-ID``), send keep-alive comments, and end after a terminal transition.
"""

from __future__ import annotations

import json
import time

import httpx
import psycopg
import pytest

from pipelines.api.sse import APPLICATION_NAME
from tests.api.conftest import ACME, claim_task, publish, serve

TIMEOUT = httpx.Timeout(10.0, read=8.0)


class EventReader:
    """Parses an SSE response line by line; ``comments`` collects keep-alive lines."""

    def __init__(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        self.lines = response.iter_lines()
        self.comments: list[str] = []

    def next(self) -> dict | None:
        """The next event (id, event, data as JSON), or None when the server ended the stream."""
        fields: dict[str, str] = {}
        for line in self.lines:
            if line == "":
                if "data" in fields:
                    return {"id": int(fields["id"]), "event": fields.get("event"), "data": json.loads(fields["data"])}
                continue
            if line.startswith(":"):
                self.comments.append(line)
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        return None


@pytest.fixture
def http(live_url):
    with httpx.Client(base_url=live_url, timeout=TIMEOUT) as client:
        yield client


def test_stream_follows_transitions_live_and_ends_after_terminal(http, queue):
    task_id = publish(http, "guide.md", b"# Guide").json()["task_id"]
    with http.stream("GET", f"/tasks/{task_id}/events", headers=ACME) as response:
        assert response.headers["cache-control"] == "no-store"
        reader = EventReader(response)
        pending = reader.next()
        assert (pending["event"], pending["data"]["to_status"], pending["data"]["percent"]) == ("transition", "PENDING", 0)

        lease = claim_task(queue, task_id)
        running = reader.next()
        assert (running["data"]["from_status"], running["data"]["to_status"], running["data"]["attempt"]) == ("PENDING", "RUNNING", 1)

        queue.progress(lease, "parse", 1, 1)
        parse = reader.next()
        assert (parse["event"], parse["data"]["stage"], parse["data"]["percent"]) == ("progress", "parse", 10.0)

        queue.progress(lease, "embed", 5, 10)
        embed = reader.next()
        assert (embed["data"]["stage"], embed["data"]["completed"], embed["data"]["total"]) == ("embed", 5, 10)
        assert embed["data"]["percent"] == pytest.approx(52.5)

        queue.complete(lease, chunk_count=0)
        done = reader.next()
        assert (done["data"]["to_status"], done["data"]["percent"], done["data"]["terminal"]) == ("SUCCEEDED", 100.0, True)
        assert reader.next() is None  # the server ended the stream

    seen = [pending, running, parse, embed, done]
    assert [e["id"] for e in seen] == [e["event_id"] for e in queue.events(task_id)]
    assert [e["id"] for e in seen] == sorted({e["id"] for e in seen})


def test_resume_with_last_event_id_gets_exactly_the_missed_events(http, queue, db_url):
    task_id = publish(http, "handbook/ch1.md", b"# Chapter 1").json()["task_id"]
    with http.stream("GET", f"/tasks/{task_id}/events", headers=ACME) as response:
        reader = EventReader(response)
        first = reader.next()
        lease = claim_task(queue, task_id)
        second = reader.next()
        assert second["data"]["to_status"] == "RUNNING"
    # The connection is dropped. The server must notice and let go of its LISTEN connection.
    deadline = time.monotonic() + 5
    while _sse_connections(db_url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sse_connections(db_url) == 0

    # Work goes on while nobody listens.
    queue.progress(lease, "parse", 1, 1)
    queue.progress(lease, "chunk", 4, 4)
    queue.progress(lease, "embed", 2, 4)
    queue.fail(lease, "EMBEDDING_TIMEOUT", "the embedder did not answer in time")

    missed = [e for e in queue.events(task_id) if e["event_id"] > second["id"]]
    assert len(missed) == 4
    with http.stream("GET", f"/tasks/{task_id}/events", headers={**ACME, "Last-Event-ID": str(second["id"])}) as response:
        reader = EventReader(response)
        replay = [reader.next() for _ in missed]
        assert [e["id"] for e in replay] == [e["event_id"] for e in missed]  # no gap, no duplicate
        assert [e["data"]["to_status"] for e in replay] == ["RUNNING", "RUNNING", "RUNNING", "RETRY_WAIT"]
        assert replay[-1]["data"]["error_code"] == "EMBEDDING_TIMEOUT"
        # RETRY_WAIT is not terminal: the stream stays open and delivers the next claim live.
        retry_lease = claim_task_when_due(queue, task_id)
        again = reader.next()
        assert (again["data"]["to_status"], again["data"]["attempt"]) == ("RUNNING", 2)
        assert again["id"] > replay[-1]["id"]
        queue.cancel(task_id)
        cancelled = reader.next()
        assert (cancelled["data"]["to_status"], cancelled["data"]["terminal"]) == ("CANCELLED", True)
        assert reader.next() is None
    assert retry_lease.attempt == 2

    # Resuming with ?after= (what a first connection can use) replays from there too.
    with http.stream("GET", f"/tasks/{task_id}/events", params={"after": first["id"]}, headers=ACME) as response:
        reader = EventReader(response)
        ids = []
        while (event := reader.next()) is not None:
            ids.append(event["id"])
    assert ids == [e["event_id"] for e in queue.events(task_id, first["id"])]

    # Terminal and nothing newer: 204, which tells an EventSource to stop reconnecting.
    response = http.get(f"/tasks/{task_id}/events", headers={**ACME, "Last-Event-ID": str(cancelled["id"])})
    assert response.status_code == 204


def claim_task_when_due(queue, task_id: int):
    """The failed attempt waits out a jittered backoff (at most 2 s here); claim as soon as it is due."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        claimed = queue.claim("test-worker", limit=1)
        if claimed:
            assert claimed[0].lease.task_id == task_id
            return claimed[0].lease
        time.sleep(0.05)
    raise AssertionError("the task never became due")


def _sse_connections(db_url: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            (APPLICATION_NAME,),
        ).fetchone()
    return row[0]


def test_keep_alive_comments_while_idle(make_app):
    app = make_app(ping_seconds=0.2)
    for base in serve(app):
        with httpx.Client(base_url=base, timeout=TIMEOUT) as http:
            task_id = publish(http, "idle.md", b"idle").json()["task_id"]
            with http.stream("GET", f"/tasks/{task_id}/events", headers=ACME) as response:
                reader = EventReader(response)
                assert reader.next()["data"]["to_status"] == "PENDING"
                lines = []
                for line in reader.lines:
                    lines.append(line)
                    if line.startswith(":"):
                        break
                assert lines and lines[-1].startswith(": ping")


def test_event_stream_requires_the_owner(http):
    task_id = publish(http, "x.md", b"x").json()["task_id"]
    assert http.get(f"/tasks/{task_id}/events").status_code == 401
    assert http.get(f"/tasks/{task_id}/events", headers={"Authorization": "Bearer tok-globex"}).status_code == 404
    bad = http.get(f"/tasks/{task_id}/events", headers={**ACME, "Last-Event-ID": "abc"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_REQUEST"
