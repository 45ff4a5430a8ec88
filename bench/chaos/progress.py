"""Noticing a chaos round that stops making progress and recovers on its own.

A round that times out reports where Dagster waited (its unfinished runs, PostgreSQL's busy sessions, dagster
dev's stacks). A stall that ends before the round's time limit used to leave no trace at all: the round passed,
slower. The full suite once ran `test_chaos_migration_small` in 256 s against its usual ~80-90 s, with no
report. ``ProgressWatch`` says when no task has finished for ``stall_seconds`` while some are unfinished, once per
stall, so the round can take the same snapshot while the stall is happening, and it keeps the longest such gap.
"""

from __future__ import annotations

from dataclasses import dataclass

STALL_SECONDS = 60.0
"""No task finished for this long while some wait: a stall worth a snapshot. A healthy small round's longest
gap is well under it (the report's ``longest_without_progress_seconds``); a lease is 20 s there."""


@dataclass
class ProgressWatch:
    stall_seconds: float = STALL_SECONDS
    finished: int = -1
    since: float | None = None
    in_stall: bool = False
    longest: float = 0.0

    def see(self, now: float, finished: int, unfinished: int) -> float | None:
        """Feed one poll (``finished``: tasks in a terminal state so far). Returns the gap's length when a new
        stall begins (once per stall), else None. Idle time with nothing unfinished is not a stall."""
        if finished != self.finished or unfinished == 0 or self.since is None:
            self.finished, self.in_stall = finished, False
            self.since = now if unfinished else None  # the clock runs only while something waits
            return None
        gap = now - self.since
        self.longest = max(self.longest, gap)
        if gap >= self.stall_seconds and not self.in_stall:
            self.in_stall = True
            return gap
        return None


def keep_stalled_report(report: dict, shown: str) -> str | None:
    """A round that stalled (``report["stalls"]``) and still passed: its whole report, snapshots included, written
    to a new file kept after the run; a one-line summary naming the file, for a warning. None without a stall."""
    import tempfile
    from pathlib import Path

    stalls = report.get("stalls") or []
    if not stalls:
        return None
    folder = Path(tempfile.mkdtemp(prefix="kbindex-chaos-stall-"))
    (folder / "report.txt").write_text(shown)
    gaps = ", ".join(f"{s['without_progress_seconds']:.0f} s at {s['at_seconds']:.0f} s" for s in stalls)
    return f"the chaos round stalled (no task finished for {gaps}) and recovered; snapshots: {folder / 'report.txt'}"
