"""The code location loads the way `dagster dev` and the daemon load it (one Definitions per module)."""

import subprocess
import sys


def test_dagster_validates_the_code_location(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "pipelines.definitions"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,  # not the project root: its dagster.yaml wants DAGSTER_PG_URL (kbindex dev sets it)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "passed validation" in done.stdout + done.stderr
