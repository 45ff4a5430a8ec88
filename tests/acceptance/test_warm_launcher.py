"""The warm run launcher (pipelines/warm_launcher.py, issue #34 part 2), chosen by a dagster.yaml block.

Each test writes the project's dagster.yaml plus the warm ``run_launcher`` block into a temporary
DAGSTER_HOME (Dagster storage on the test PostgreSQL), launches runs of a one-asset job
(bench/launcher_probe.py) and checks what the default launcher gives: a run forked from
the fork server succeeds and materializes; terminate kills its process and the run ends CANCELED; a
process SIGKILLed mid-run fails its run (reaped by the fork server, and seen by run monitoring's
health check when the fork server cannot reap it); changed code gets a fresh fork server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.launcher.base import WorkerStatus
from dagster._daemon.monitoring.run_monitoring import monitor_started_run
from psycopg import sql as pgsql

from bench.dagster_dev import write_dagster_yaml
from pipelines import warm_launcher
from resources.local_databases import psycopg2_url

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFS = PROJECT_ROOT / "bench" / "launcher_probe.py"


@pytest.fixture
def instance(pg_server_url, tmp_path, monkeypatch):
    name = f"warm_dg_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    base, _, query = pg_server_url.partition("?")
    monkeypatch.setenv("DAGSTER_PG_URL", psycopg2_url(base.rpartition("/")[0] + f"/{name}" + (f"?{query}" if query else "")))
    home = tmp_path / "dagster_home"
    home.mkdir()
    write_dagster_yaml(home, launcher="warm")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    inst = dg.DagsterInstance.get()
    assert isinstance(inst.run_launcher, warm_launcher.WarmRunLauncher)
    try:
        yield inst
    finally:
        server = _server_pid(inst)
        if server:
            os.kill(server, signal.SIGTERM)
            _wait(lambda: warm_launcher.process_state(server) is None or warm_launcher.process_state(server)[0] == "Z",
                  30, "the fork server to stop")
        inst.dispose()
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def _server_pid(instance) -> int | None:
    try:
        return warm_launcher.request(instance.run_launcher.socket_path(), {"op": "ping"}, 5)["pid"]
    except OSError:
        return None


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def _launch(instance, out: Path, block: bool = False) -> dg.DagsterRun:
    recon = ReconstructableRepository.for_module("bench.launcher_probe", "defs",
                                                 working_directory=str(PROJECT_ROOT)).get_reconstructable_job("warm_job")
    run = instance.create_run_for_job(
        job_def=recon.get_definition(), job_code_origin=recon.get_python_origin(),
        run_config={"ops": {"warm_probe": {"config": {"out": str(out), "block": block}}}})
    instance.launch_run(run.run_id, workspace=None)
    return run


def _finished(instance, run, timeout: float = 60) -> dg.DagsterRun:
    return _wait(lambda: (r := instance.get_run_by_id(run.run_id)).is_finished and r, timeout, f"run {run.run_id} to finish")


def _probe(out: Path, run) -> dict:
    return _wait(lambda: (p := out / f"{run.run_id}.json").exists() and p.stat().st_size and json.loads(p.read_text()),
                 60, "the run's step to start")


def test_runs_are_forked_from_one_warm_fork_server_and_materialize(instance, tmp_path):
    first = _launch(instance, tmp_path)
    assert _finished(instance, first).status == dg.DagsterRunStatus.SUCCESS
    server = _server_pid(instance)
    second = _launch(instance, tmp_path)
    assert _finished(instance, second).status == dg.DagsterRunStatus.SUCCESS
    assert _server_pid(instance) == server  # the same warm parent served both
    for run in (first, second):
        probe = json.loads((tmp_path / f"{run.run_id}.json").read_text())
        assert probe["ppid"] == server != os.getpid()  # forked by the fork server, not spawned by us
        tags = instance.get_run_by_id(run.run_id).tags
        assert tags[warm_launcher.PID_TAG] == str(probe["pid"]) and tags[warm_launcher.SERVER_TAG] == str(server)
        # The run went through `dagster api execute_run`'s body: its "Started process" event names this pid.
        messages = [e.message for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)]
        assert f"Started process for run (pid: {probe['pid']})." in messages, messages
        materialized = instance.fetch_materializations(dg.AssetKey("warm_probe"), limit=10).records
        assert run.run_id in {m.run_id for m in materialized}


def test_terminate_kills_the_run_process_and_the_run_ends_canceled(instance, tmp_path):
    run = _launch(instance, tmp_path, block=True)
    pid = _probe(tmp_path, run)["pid"]
    assert instance.run_launcher.terminate(run.run_id)
    assert _finished(instance, run).status == dg.DagsterRunStatus.CANCELED
    _wait(lambda: not warm_launcher._alive(pid, None), 30, "the run process to end")
    assert not instance.run_launcher.terminate(run.run_id)  # already finished


def test_a_stopped_run_process_is_killed_by_terminate(instance, tmp_path):
    """The hung-run release terminates a SIGSTOPped run: SIGTERM could never be handled, SIGKILL is sent."""
    run = _launch(instance, tmp_path, block=True)
    pid = _probe(tmp_path, run)["pid"]
    os.kill(pid, signal.SIGSTOP)
    assert instance.run_launcher.terminate(run.run_id)
    # At once, not after the grace (10 s): a stopped process would never handle the SIGTERM.
    _wait(lambda: not warm_launcher._alive(pid, None), 5, "the stopped run process to be killed")
    assert _finished(instance, run).status == dg.DagsterRunStatus.CANCELED


def test_a_run_process_killed_mid_run_fails_its_run(instance, tmp_path):
    run = _launch(instance, tmp_path, block=True)
    pid = _probe(tmp_path, run)["pid"]
    os.kill(pid, signal.SIGKILL)
    assert _finished(instance, run).status == dg.DagsterRunStatus.FAILURE  # reaped by the fork server
    messages = [e.message for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)]
    assert any("killed by signal 9" in m for m in messages), messages


def test_run_monitoring_fails_a_run_whose_process_died_while_the_fork_server_could_not_see_it(instance, tmp_path):
    run = _launch(instance, tmp_path, block=True)
    pid = _probe(tmp_path, run)["pid"]
    server = _server_pid(instance)
    record = instance.get_run_records(dg.RunsFilter(run_ids=[run.run_id]))[0]
    assert instance.run_launcher.check_run_worker_health(record.dagster_run).status == WorkerStatus.RUNNING
    os.kill(server, signal.SIGSTOP)  # the fork server cannot reap or report
    try:
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: warm_launcher.process_state(pid)[0] == "Z", 10, "the run process to die")
        health = instance.run_launcher.check_run_worker_health(record.dagster_run)
        assert health.status == WorkerStatus.FAILED, health
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
        import logging

        monitor_started_run(instance, None, record, logging.getLogger("test"))  # the daemon's monitoring step
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
    finally:
        os.kill(server, signal.SIGCONT)


def test_changed_code_gets_a_fresh_fork_server(instance, tmp_path):
    first = _launch(instance, tmp_path)
    assert _finished(instance, first).status == dg.DagsterRunStatus.SUCCESS
    old = _server_pid(instance)
    now = time.time() + 1
    os.utime(DEFS, (now, now))  # as an edit would: the loaded module's file is newer than the server
    second = _launch(instance, tmp_path)
    assert _finished(instance, second).status == dg.DagsterRunStatus.SUCCESS
    new = _server_pid(instance)
    assert new != old and json.loads((tmp_path / f"{second.run_id}.json").read_text())["ppid"] == new
    _wait(lambda: warm_launcher.process_state(old) is None or warm_launcher.process_state(old)[0] == "Z", 30,
          "the old fork server to leave")


def test_a_run_left_starting_that_the_fork_server_never_forked_is_a_lost_launch(instance, tmp_path):
    """What a launch that failed while PostgreSQL was away leaves: a run marked STARTING, never forked. The
    launcher tells it apart from a run the fork server did fork (finished, or alive before it tagged itself),
    with or without a fork server listening; and the claiming sensor fails it once it is old enough."""
    from dagster._core.events import DagsterEvent, DagsterEventType

    import pipelines.sensors as sensors

    launcher = instance.run_launcher
    forked = _finished(instance, _launch(instance, tmp_path))
    recon = ReconstructableRepository.for_module("bench.launcher_probe", "defs",
                                                 working_directory=str(PROJECT_ROOT)).get_reconstructable_job("warm_job")
    lost = instance.create_run_for_job(job_def=recon.get_definition(), job_code_origin=recon.get_python_origin(),
                                       run_config={"ops": {"warm_probe": {"config": {"out": str(tmp_path)}}}})
    instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.PIPELINE_STARTING.value,
                                               job_name=lost.job_name), run_id=lost.run_id)
    lost = instance.get_run_by_id(lost.run_id)
    assert lost.status == dg.DagsterRunStatus.STARTING
    untagged = forked.with_tags({k: v for k, v in forked.tags.items() if k != warm_launcher.PID_TAG})
    assert launcher.launch_was_lost(lost) and not launcher.launch_was_lost(untagged)

    runs = [sensors.LeasedRun(lost, None, time.time() - sensors.LOST_LAUNCH_SECONDS + 5)]
    assert sensors.fail_lost_launches(instance, runs) == []  # too young: a launch may still be on its way
    runs = [sensors.LeasedRun(lost, None, time.time() - sensors.LOST_LAUNCH_SECONDS - 1)]
    assert sensors.fail_lost_launches(instance, runs) == [lost.run_id]
    assert instance.get_run_by_id(lost.run_id).status == dg.DagsterRunStatus.FAILURE

    os.kill(_server_pid(instance), signal.SIGTERM)  # no fork server at all: nothing here will fork it either
    _wait(lambda: _server_pid(instance) is None, 30, "the fork server to stop")
    assert launcher.launch_was_lost(lost)


def test_a_client_that_leaves_before_its_answer_does_not_stop_the_fork_server(instance, tmp_path):
    """A request whose client gave up while the server was busy (the claiming sensor's 10-s ``knows``, the
    launcher's 5-s ping) is answered to a closed socket. That answer once raised BrokenPipeError out of the
    server's loop: the server died and the launch queued behind the request got a reset (seen over a slow link
    in bench.chaos --network). Frozen while two clients ask and leave, the server then answers the next."""
    first = _finished(instance, _launch(instance, tmp_path))  # a server is up, with a run behind it
    assert first.status == dg.DagsterRunStatus.SUCCESS
    path, server = instance.run_launcher.socket_path(), _server_pid(instance)
    os.kill(server, signal.SIGSTOP)
    try:
        for message in ({"op": "ping"}, {"op": "knows", "run_id": first.run_id}):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:  # ask, and leave without the answer
                conn.connect(str(path))
                conn.sendall(json.dumps(message).encode() + b"\n")
    finally:
        os.kill(server, signal.SIGCONT)
    assert warm_launcher.request(path, {"op": "knows", "run_id": first.run_id}, 10) == {"known": True}
    assert _server_pid(instance) == server  # the same server, still serving
    assert _finished(instance, _launch(instance, tmp_path)).status == dg.DagsterRunStatus.SUCCESS
