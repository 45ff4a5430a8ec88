"""Server-Sent Events of one task, read from the task_event table and woken by LISTEN/NOTIFY.

The table is the source of truth; a notification only says "look again". Each stream:

1. opens its own psycopg async connection and runs ``LISTEN kbindex_task_event`` *before* the
   first read, so nothing committed after that read can be missed;
2. sends every event with ``event_id > last`` (the ``Last-Event-ID`` of a reconnecting client),
   each as ``id: <event_id>``: a resumed stream has no gaps and no duplicates;
3. waits for a notification, or ``poll_seconds`` at most (a safety net if one is lost), and reads again;
4. ends after a terminal transition (SUCCEEDED, DEAD, CANCELLED) once nothing newer exists.

Keep-alive comments (``: ping``) are sent by sse-starlette every ``ping_seconds``. One database
connection per open stream; ``max_streams`` bounds them (503 beyond it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pipelines.api.views import event_json, is_terminal_event
from sql import queries

log = logging.getLogger(__name__)

CHANNEL = "kbindex_task_event"
APPLICATION_NAME = "kbindex-api-sse"


async def task_event_stream(
    db_url: str, task_id: int, after_event_id: int, *, poll_seconds: float = 5.0
) -> AsyncIterator[dict[str, Any]]:
    """SSE messages (dicts for sse-starlette) for ``task_id`` after ``after_event_id``, until terminal."""
    last = after_event_id
    conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True, application_name=APPLICATION_NAME)
    try:
        await conn.execute(queries["api_listen_task_event"])
        while True:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(queries["task_events"], {"task_id": task_id, "after_event_id": last})
                rows = await cur.fetchall()
            for row in rows:
                last = row["event_id"]
                yield {
                    "id": str(row["event_id"]),
                    "event": row["kind"],
                    "data": json.dumps(event_json(row), ensure_ascii=False),
                }
            if rows and is_terminal_event(rows[-1]):
                return
            # Wait for any task's events to commit (or the poll interval), then read again.
            async for _ in conn.notifies(timeout=poll_seconds, stop_after=1):
                pass
    finally:
        try:
            await asyncio.shield(conn.close())
        except Exception:  # noqa: BLE001 - closing a dead connection
            log.debug("closing the SSE listen connection failed", exc_info=True)
