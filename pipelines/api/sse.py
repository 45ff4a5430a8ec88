"""Server-Sent Events of index tasks: every open stream of the process shares one LISTEN connection.

The task_event table is the source of truth; a notification only says "look again". One
``EventHub`` per API process:

1. holds the only ``LISTEN kbindex_task_event`` connection (opened when the first stream is admitted,
   closed when the last one ends), so open streams cost no database connection of their own: the
   server's ``max_connections`` is shared with Dagster, the run workers and the API pool;
2. on a notification asks once, for every open stream's task together, which of them have an event
   newer than that stream has sent (``api_task_event_heads``), and wakes only those streams;
3. admits streams with a per-tenant cap (429) and a process cap (503), counted *before* the stream
   starts, so a burst of concurrent requests cannot all pass the check.

Each stream (``TaskStream.messages``) sends every event with ``event_id > last`` as ``id: <event_id>``
(a resumed stream has no gaps and no duplicates), reading through the API's connection pool; it
waits for a wake-up, or ``poll_seconds`` at most (a safety net if a notification is lost), and ends
after a terminal transition once nothing newer exists.

PostgreSQL away (a partition, a restart): the LISTEN connection has the API role's bounds, so a silent one
errors within about 5 s; the listener wakes every stream and reconnects every second (each try bounded by
``connect_timeout``), and once it LISTENs again wakes every stream once more. A stream whose read fails
stays open (keep-alive comments go on) and reads again at the next wake-up: after the database is back it
sends exactly the events it missed, in order. A client that reconnected meanwhile (``Last-Event-ID``) gets
503 until then, and the same events after.

A stream opened by a principal-scoped token (``visible``: the caller's read scope as SQL parameters) reads
its events in one statement with the check that the caller may still read the task's version
(``api_task_events_visible``): when a pointer flip narrows the document's allow list past the caller, the
stream ends without another event, and reconnecting answers 404.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
from anyio import CapacityLimiter, to_thread

from pipelines.api.errors import ServiceUnavailable, TooManyRequests
from pipelines.api.views import event_json, is_terminal_event
from pipelines.domain.errors import IndexWriteFailed
from resources.database import Database, connection_params
from sql import queries

log = logging.getLogger(__name__)

CHANNEL = "kbindex_task_event"
APPLICATION_NAME = "kbindex-api-sse"
RECONNECT_SECONDS = 1.0


class TaskStream:
    """One admitted stream: its task, what it has sent, and the event that wakes it."""

    def __init__(self, hub: EventHub, tenant_id: str, task_id: int, last: int,
                 visible: dict[str, Any] | None = None) -> None:
        self.hub, self.tenant_id, self.task_id, self.last = hub, tenant_id, task_id, last
        self.visible = visible
        self.wake = asyncio.Event()
        self.closed = False

    def close(self) -> None:
        """Give the admission back (idempotent: the response and the generator may both call it)."""
        if not self.closed:
            self.closed = True
            self.hub._release(self)

    async def messages(self, poll_seconds: float) -> AsyncIterator[dict[str, Any]]:
        """SSE messages (dicts for sse-starlette) after ``last``, until a terminal transition."""
        try:
            await self.hub._listening()  # LISTEN before the first read: nothing committed later is missed
            while True:
                self.wake.clear()
                try:
                    rows = await self.hub._read(self.task_id, self.last, self.tenant_id, self.visible)
                except IndexWriteFailed as exc:  # the database is away: keep the stream, read at the next wake-up
                    log.warning("an event stream could not read its events (%s); it waits and reads again", exc.code)
                    rows = []
                if rows is None:  # the caller may no longer read the task's version: nothing more of it
                    return
                for row in rows:
                    self.last = row["event_id"]
                    yield {
                        "id": str(row["event_id"]),
                        "event": row["kind"],
                        "data": json.dumps(event_json(row), ensure_ascii=False),
                    }
                if rows and is_terminal_event(rows[-1]):
                    return
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=poll_seconds)
                except TimeoutError:
                    pass
        finally:
            self.close()


class EventHub:
    """Admission and wake-ups of every event stream of one API process (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        *,
        max_streams: int = 200,
        max_streams_per_tenant: int = 20,
        connect: Callable[[], Any] | None = None,
    ) -> None:
        self.db = db
        self.max_streams = max_streams
        self.max_streams_per_tenant = max_streams_per_tenant
        self.streams: set[TaskStream] = set()
        self.per_tenant: Counter[str] = Counter()
        self._connect = connect or (
            lambda: psycopg.AsyncConnection.connect(db.url, autocommit=True, application_name=APPLICATION_NAME,
                                                    **connection_params(db.url, "api"))
        )
        self._listener: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self._reads = CapacityLimiter(4)  # stream reads never take more than 4 pool connections at once

    # -- admission --------------------------------------------------------------------------

    def admit(self, tenant_id: str, task_id: int, last: int, visible: dict[str, Any] | None = None) -> TaskStream:
        """Count the stream now (no await between check and count) or refuse it: 429 for the tenant, 503 for all.
        ``visible``: the read scope's SQL parameters of a principal-scoped caller (None: the whole tenant)."""
        if self.per_tenant[tenant_id] >= self.max_streams_per_tenant:
            raise TooManyRequests(
                f"this tenant already has {self.max_streams_per_tenant} open event streams; close one or try again shortly"
            )
        if len(self.streams) >= self.max_streams:
            raise ServiceUnavailable("too many open event streams; try again shortly")
        stream = TaskStream(self, tenant_id, task_id, last, visible)
        self.streams.add(stream)
        self.per_tenant[tenant_id] += 1
        return stream

    def _release(self, stream: TaskStream) -> None:
        self.streams.discard(stream)
        self.per_tenant[stream.tenant_id] -= 1
        if self.per_tenant[stream.tenant_id] <= 0:
            del self.per_tenant[stream.tenant_id]
        if not self.streams and self._listener is not None:
            self._listener.cancel()  # the last stream ended: give the LISTEN connection back
            self._listener, self._ready = None, None

    # -- reads and wake-ups -----------------------------------------------------------------

    async def _read(self, task_id: int, after: int, tenant_id: str = "",
                    visible: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
        return await to_thread.run_sync(self._read_sync, task_id, after, tenant_id, visible, limiter=self._reads)

    def _read_sync(self, task_id: int, after: int, tenant_id: str = "",
                   visible: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
        """The events after ``after``; None when a scoped caller (``visible``) may no longer read the task."""
        if visible is None:
            return self.db.fetch_all("task_events", {"task_id": task_id, "after_event_id": after})
        rows = self.db.fetch_all("api_task_events_visible", {
            **visible, "task_id": task_id, "after_event_id": after, "tenant_id": tenant_id})
        if not rows or not rows[0]["visible"]:
            return None
        return [r for r in rows if r["event_id"] is not None]

    async def _listening(self) -> None:
        """Start the shared listener if none runs, and wait until it has LISTENed (or failed once)."""
        if self._listener is None or self._listener.done():
            self._ready = asyncio.Event()
            self._listener = asyncio.create_task(self._listen(self._ready))
        assert self._ready is not None
        try:
            await asyncio.wait_for(self._ready.wait(), timeout=5.0)
        except TimeoutError:
            log.warning("the event listener is not ready; streams poll until it is")

    async def _listen(self, ready: asyncio.Event) -> None:
        """The one LISTEN connection: on each notification wake the streams with newer events; reconnect on loss."""
        while True:
            conn, listening = None, False
            try:
                conn = await self._connect()
                await conn.execute(queries["listen_task_event"])
                listening = True
                ready.set()
                self._wake(None)  # anything committed while (re)connecting
                gen = conn.notifies()
                async for _ in gen:
                    await asyncio.sleep(0.02)  # coalesce a burst of notifications into one look
                    await self._wake_changed()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a lost connection: wake everyone (they re-read) and reconnect
                if listening:  # not at every failed reconnection: the streams' reads would fail the same way
                    log.warning("the event listener lost its connection; reconnecting", exc_info=True)
                    self._wake(None)
                ready.set()
                await asyncio.sleep(RECONNECT_SECONDS)
            finally:
                if conn is not None:
                    try:
                        await asyncio.shield(conn.close())
                    except Exception:  # noqa: BLE001 - closing a dead connection
                        log.debug("closing the SSE listen connection failed", exc_info=True)

    async def _wake_changed(self) -> None:
        open_streams = list(self.streams)
        if not open_streams:
            return
        task_ids = sorted({s.task_id for s in open_streams})
        heads = await to_thread.run_sync(self._heads_sync, task_ids, limiter=self._reads)
        for s in open_streams:
            if heads.get(s.task_id, 0) > s.last:
                s.wake.set()

    def _heads_sync(self, task_ids: list[int]) -> dict[int, int]:
        rows = self.db.fetch_all("api_task_event_heads", {"task_ids": task_ids})
        return {r["task_id"]: r["event_id"] for r in rows}

    def _wake(self, task_id: int | None) -> None:
        for s in list(self.streams):
            if task_id is None or s.task_id == task_id:
                s.wake.set()
