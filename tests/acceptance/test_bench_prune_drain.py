"""The CI-sized round of bench/scale/prune_drain.py: under a real ``dagster dev``, the daemon's prune sensor
finds the keys past the lineage window on its first tick and one prune_lineage_keys run deletes exactly
those, leaving the keys inside the window, in Dagster and in kbindex's record alike."""

from __future__ import annotations

import pytest

from bench.scale.prune_drain import run

pytestmark = pytest.mark.slow


def test_the_daemon_prunes_the_keys_past_the_window_and_keeps_the_rest(pg_server_url, tmp_path, monkeypatch):
    for name in ("KBINDEX_DATABASE_URL", "KBINDEX_BLOB_URL", "KBINDEX_ARTIFACTS", "KBINDEX_HOME"):
        monkeypatch.setenv(name, "")  # run() points these at its round; restored after the test
    drain = run(pg_server_url, tmp_path, old=60, live=25, minutes=3)

    assert drain.left == 25 and drain.drained == 60  # kbindex's record: exactly the old keys forgotten
    assert drain.dagster_left == 25  # and Dagster's keys: the same ones deleted
    assert [r.status for r in drain.runs] == ["SUCCESS"]  # one run, started by the sensor's first tick
    assert drain.runs[0].started_after < 120


def test_the_prune_sensor_is_on_by_default():
    from pipelines.definitions import defs

    sensor = defs.get_repository_def().get_sensor_def("prune_lineage_keys_when_due")
    assert sensor.default_status.value == "RUNNING" and sensor.job_name == "prune_lineage_keys"
