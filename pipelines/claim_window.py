"""The claiming sensors' shared wait inside one daemon loop (issue #34: publish -> searchable, back to back).

Dagster's sensor daemon evaluates its sensors one after another, once a loop, and starts a loop at most every
5 s. A claiming tick ends when it claims, so with one claiming sensor the next publish waited for the next loop:
published back to back (each when the one before became searchable, ~1.5 s later) a publish waited ~3 s of
the loop for its claim (bench.pipeline's latency phase, p50 4.39 s). So there are several claiming sensors
(``KBINDEX_CLAIM_SENSORS``). The first of them to tick in a loop opens a window of ``KBINDEX_CLAIM_WAIT_SECONDS``;
a tick that claims hands what is left of the window to the next claiming sensor, which the daemon evaluates
right after the first one's runs are stored. A tick that comes after the window has ended returns at once: the
loop's first claiming tick already did a tick's work, and an idle loop lasts as long as with one sensor.

The code server evaluates every tick, so the loop is recognised in its memory: a sensor that has already
ticked in the current window starts the next one (it is a new loop). Pure: the caller passes the clock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

# A window older than this is from an earlier loop whatever ticked in it (a daemon restart, a stopped sensor).
STALE_SECONDS = 30.0


@dataclass(frozen=True)
class WindowEntry:
    """What one tick got from the window: when its wait must end, and whether it opened the window."""

    deadline: float
    opened: bool

    def ended(self, now: float) -> bool:
        """A later tick of the loop that came after the window ended: it has nothing to wait for."""
        return not self.opened and now >= self.deadline


@dataclass
class _Window:
    start: float
    end: float
    ticked: set[str] = field(default_factory=set)


class ClaimWindow:
    """The current loop's wait window, shared by the claiming sensors of this process; thread-safe."""

    def __init__(self, stale_seconds: float = STALE_SECONDS) -> None:
        self._stale = stale_seconds
        self._window: _Window | None = None
        self._lock = threading.Lock()

    def enter(self, sensor: str, now: float, wait_seconds: float) -> WindowEntry:
        """Join the current window as ``sensor`` at ``now``, or open a new one of ``wait_seconds`` when this
        sensor already ticked in it (a new daemon loop) or it is stale."""
        with self._lock:
            w = self._window
            if w is None or sensor in w.ticked or now - w.start > self._stale:
                self._window = _Window(now, now + max(0.0, wait_seconds), {sensor})
                return WindowEntry(self._window.end, opened=True)
            w.ticked.add(sensor)
            return WindowEntry(w.end, opened=False)
