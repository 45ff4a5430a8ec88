"""The stop file `kbindex dev` creates before it signals Dagster: only the Dagster it started looks for it."""

from __future__ import annotations

import stat

from pipelines.stopping import STOP_FILE_ENV, request_stop, stop_check, stop_requested


def test_without_the_variable_nothing_is_ever_stopping(monkeypatch, tmp_path):
    monkeypatch.delenv(STOP_FILE_ENV, raising=False)
    (tmp_path / "dagster-stopping").touch()  # another kbindex dev's file is none of this process's business
    assert not stop_requested()
    assert stop_check() is None


def test_the_named_file_appearing_is_the_stop(monkeypatch, tmp_path):
    path = tmp_path / "dagster-stopping"
    monkeypatch.setenv(STOP_FILE_ENV, str(path))
    check = stop_check()
    assert check is not None and not check()
    assert request_stop(path)
    assert check() and stop_requested()
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


def test_a_stop_file_that_cannot_be_made_does_not_stop_the_stop(tmp_path):
    assert request_stop(tmp_path / "no-such-dir" / "dagster-stopping") is False
