"""`kbindex dev` is stopping Dagster: a file it creates just before its SIGTERM, which a claiming tick's wait ends on.

A claiming tick that finds nothing due waits up to KBINDEX_CLAIM_WAIT_SECONDS for a publish's NOTIFY inside the
code server's sensor RPC (pipelines/sensors.py). A stopping code server finishes the RPCs in flight and the daemon
joins its sensor thread, so every stop waited that wait out: `kbindex dev` stopped in 5-11 s on 2 cores and went
past its 12 s grace (SIGKILL) on a loaded CI machine. A signal handler cannot tell the tick: Dagster loads the code
inside a block that puts its own SIGINT/SIGTERM handlers back afterwards. So `kbindex dev` names a file in the
environment Dagster inherits and creates it before it signals; only Dagster it started looks for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

STOP_FILE_ENV = "KBINDEX_STOP_FILE"


def stop_requested() -> bool:
    """True once the `kbindex dev` that started this Dagster has begun to stop it (one stat: cheap to poll)."""
    path = os.environ.get(STOP_FILE_ENV)
    return bool(path) and os.path.exists(path)


def stop_check() -> Callable[[], bool] | None:
    """What a wait should poll: ``stop_requested`` under `kbindex dev`, nothing elsewhere (no polling at all)."""
    return stop_requested if os.environ.get(STOP_FILE_ENV) else None


def request_stop(path: Path) -> bool:
    """Tell the ticks of the Dagster started with ``STOP_FILE_ENV=path`` to stop waiting; False if the file could
    not be made (the stop goes on: the ticks then wait out their wait, as before)."""
    try:
        path.touch(mode=0o600)
    except OSError:
        return False
    return True
