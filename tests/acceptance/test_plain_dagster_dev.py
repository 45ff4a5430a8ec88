"""Plain `dagster dev` where a Dagster user runs it: the project's files, nothing set, the sensor on.

It runs in a temporary copy of the project root's dagster.yaml, workspace.yaml and pyproject.toml (the
package itself is installed), so the embedded PostgreSQL it starts on demand lands in that folder's
./.kbindex and not in the developer's own. A published document must come out searchable: that proves
the storage, the code location's database and the claiming sensor all came up without configuration.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest

from bench.dagster_dev import free_port, spawn_in_own_session
from resources import local_postgres

pytestmark = pytest.mark.slow

PROJECT_ROOT = Path(__file__).resolve().parents[2]
UNSET = ("DAGSTER_HOME", "DAGSTER_PG_URL", "KBINDEX_HOME", "KBINDEX_DATABASE_URL", "KBINDEX_BLOB_URL",
         "KBINDEX_ARTIFACTS", "KBINDEX_EMBED_SERVICE")
SENSOR_QUERY = ('{ sensorOrError(sensorSelector: {repositoryName: "__repository__", repositoryLocationName: "kbindex",'
                ' sensorName: "claim_index_tasks"}) { ... on Sensor { sensorState { status } } } }')


def _graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())["data"]


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            break
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # code servers that outlived dagster dev
    except ProcessLookupError:
        pass


@pytest.mark.timeout(420)
def test_plain_dagster_dev_comes_up_on_the_embedded_default_with_the_sensor_on():
    root = Path(tempfile.mkdtemp(prefix="kbpdd-"))  # short: PostgreSQL's socket path has a length limit
    for name in ("dagster.yaml", "workspace.yaml", "pyproject.toml"):
        shutil.copyfile(PROJECT_ROOT / name, root / name)
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    port = free_port()
    log = root / "dagster.log"
    with open(log, "wb") as out:
        proc = spawn_in_own_session([sys.executable, "-m", "dagster", "dev", "-p", str(port)], cwd=root, env=env,
                                    stdout=out, stderr=subprocess.STDOUT)  # stoppable even if pytest ignores SIGINT
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"dagster dev exited with {proc.returncode}\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"the Dagster UI never answered\n{log.read_text()[-3000:]}")
        assert "DagsterInvalidConfigError" not in log.read_text()
        assert _graphql(port, SENSOR_QUERY)["sensorOrError"]["sensorState"]["status"] == "RUNNING"

        url = local_postgres.running_url(root / ".kbindex")
        assert url is not None, "the embedded PostgreSQL is not under ./.kbindex"
        with psycopg.connect(url, autocommit=True) as conn:  # the fast fake model; the real one is not the point
            conn.execute("UPDATE index_profile SET model = 'fake-384' WHERE is_active")
        doc = root / "note.md"
        doc.write_text("# Plain dagster dev\n\nIt starts PostgreSQL on demand and indexes this note.\n")
        publish = subprocess.run([sys.executable, "-c", "from pipelines.cli import main; main()", "publish",
                                  str(doc), "--tenant", "plain"], cwd=root, env=env, capture_output=True, text=True,
                                 timeout=120)
        assert publish.returncode == 0, publish.stdout + publish.stderr

        status = None
        while time.monotonic() < deadline + 120:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute("SELECT status FROM index_task WHERE tenant_id = 'plain'").fetchone()
            status = row[0] if row else None
            if status in ("SUCCEEDED", "DEAD"):
                break
            time.sleep(1)
        assert status == "SUCCEEDED", f"task {status}\n{log.read_text()[-3000:]}"
    finally:
        _stop_group(proc)
        subprocess.run([sys.executable, "-c", "from pipelines.cli import main; main()", "db", "stop"], cwd=root,
                       env=env, capture_output=True, timeout=90)
        shutil.rmtree(root, ignore_errors=True)
