"""Run start-up and run-process CPU: Dagster's DefaultRunLauncher vs kbindex's WarmRunLauncher, side by side.

``python -m bench.launcher [--runs 6]`` starts a throwaway PostgreSQL and, for each launcher, a fresh
Dagster instance stored in it (the project's dagster.yaml, plus the warm ``run_launcher`` block on the
warm side) with a gRPC code server for bench/launcher_probe.py, as ``dagster dev`` has. It launches
``--runs`` one-step runs one after another through ``instance.launch_run`` (what the daemon's run queue
calls) and reads what the step recorded: start-up = launch call to the first step's wall clock; run
CPU = the run process's own user+system seconds at its first step (imports, instance, run set-up).
Each side's first run is shown apart and left out of its medians (one-time start-up; the warm one starts the fork server).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql as pgsql

from bench import exit_on_sigterm

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def measure(admin_url: str, launcher: str, runs: int, workdir: Path) -> dict:
    import dagster as dg
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import ModuleTarget

    from bench.dagster_dev import write_dagster_yaml
    from resources.local_databases import psycopg2_url
    from resources.local_postgres import with_database

    name = f"bench_launcher_{launcher}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    home = workdir / launcher
    out = home / "out"
    out.mkdir(parents=True)
    write_dagster_yaml(home, launcher=launcher)
    os.environ.update(DAGSTER_HOME=str(home), DAGSTER_PG_URL=psycopg2_url(with_database(admin_url, name)))
    rows = []
    with dg.DagsterInstance.get() as instance:
        target = ModuleTarget(module_name="bench.launcher_probe", attribute="defs",
                              working_directory=str(PROJECT_ROOT), location_name="probe")
        with WorkspaceProcessContext(instance, target) as context:
            workspace = context.create_request_context()
            location = workspace.get_code_location("probe")
            remote_job = next(iter(location.get_repositories().values())).get_full_job("warm_job")
            from bench.launcher_probe import defs

            job_def = defs.resolve_job_def("warm_job")
            for _ in range(runs):
                run = instance.create_run_for_job(
                    job_def=job_def, remote_job_origin=remote_job.get_remote_origin(),
                    job_code_origin=remote_job.get_python_origin(),
                    run_config={"ops": {"warm_probe": {"config": {"out": str(out)}}}})
                launched = time.time()
                instance.launch_run(run.run_id, workspace)
                deadline = time.monotonic() + 120
                while not (done := instance.get_run_by_id(run.run_id)).is_finished:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{launcher}: run {run.run_id} did not finish")
                    time.sleep(0.05)
                if done.status != dg.DagsterRunStatus.SUCCESS:
                    raise RuntimeError(f"{launcher}: run {run.run_id} ended {done.status}")
                probe = json.loads((out / f"{run.run_id}.json").read_text())
                rows.append({"startup_s": probe["wall"] - launched, "cpu_s": probe["cpu"]})
        if launcher == "warm":
            from pipelines import warm_launcher

            server = warm_launcher.request(instance.run_launcher.socket_path(), {"op": "ping"}, 5)["pid"]
            os.kill(server, 15)  # it leaves once its last child is reaped: wait, so PostgreSQL outlives it
            deadline = time.monotonic() + 30
            while warm_launcher.process_state(server) not in (None,) and time.monotonic() < deadline:
                if (warm_launcher.process_state(server) or ("Z",))[0] == "Z":
                    break
                time.sleep(0.1)
    import psutil

    for child in psutil.Process().children(recursive=True):  # the code server, should it outlive its context
        try:
            if "grpc" in " ".join(child.cmdline()):
                child.kill()
        except psutil.Error:
            pass
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
    steady = rows[1:] if len(rows) > 1 else rows  # both sides alike: the first run pays one-time start-up
    return {"first": rows[0], "startup_median_s": statistics.median(r["startup_s"] for r in steady),
            "cpu_median_s": statistics.median(r["cpu_s"] for r in steady), "runs": len(rows)}


def render(sides: dict[str, dict]) -> str:
    d, w = sides["default"], sides["warm"]
    lines = [f"{'launcher':<10}{'runs':>6}{'start-up median s':>20}{'run CPU median s':>19}{'first run start-up s':>23}"]
    for name, s in sides.items():
        lines.append(f"{name:<10}{s['runs']:>6}{s['startup_median_s']:>20.3f}{s['cpu_median_s']:>19.3f}"
                     f"{s['first']['startup_s']:>23.3f}")
    lines.append(f"default / warm: start-up {d['startup_median_s'] / w['startup_median_s']:.1f}x, "
                 f"run CPU before the first step {d['cpu_median_s'] / max(w['cpu_median_s'], 1e-3):.1f}x "
                 "(both medians leave out each side's first run: the warm one starts the fork server)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.launcher", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from bench import server_url

    with server_url() as admin_url:
        with tempfile.TemporaryDirectory(prefix="kbindex-bench-launcher-") as tmp:
            sides = {name: measure(admin_url, name, args.runs, Path(tmp)) for name in ("default", "warm")}
    print(render(sides))
    print(json.dumps(sides, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
