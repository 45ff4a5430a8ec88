"""One `kbindex dev` per KBINDEX_HOME: the second is refused with DEV_ALREADY_RUNNING and the holder's pid."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipelines.cli.dev_lock import LOCK_NAME, hold_dev_lock
from pipelines.domain.errors import DevAlreadyRunning


def test_a_second_holder_is_refused_until_the_first_lets_go(tmp_path):
    first = hold_dev_lock(tmp_path)
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    with pytest.raises(DevAlreadyRunning, match=f"pid {os.getpid()}") as refused:
        hold_dev_lock(tmp_path)
    assert refused.value.code == "DEV_ALREADY_RUNNING" and "KBINDEX_HOME" in str(refused.value)
    first.close()
    hold_dev_lock(tmp_path).close()  # released: the next one takes it


def test_the_lock_of_a_killed_holder_is_free_at_once(tmp_path):
    """The kernel drops a flock with its holder: a kbindex dev killed with SIGKILL does not block the next."""
    code = ("import sys, time; from pathlib import Path; from pipelines.cli.dev_lock import hold_dev_lock; "
            "held = hold_dev_lock(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DevAlreadyRunning, match=f"pid {holder.pid}"):
            hold_dev_lock(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    hold_dev_lock(tmp_path).close()
