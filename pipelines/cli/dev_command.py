"""`kbindex dev`: embedded PostgreSQL + migrations + sample corpus + Dagster UI/daemon, one command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import typer

from pipelines import event_batching
from pipelines.cli.app import app, console, errors_to_exit
from pipelines.cli.dev_lock import hold_dev_lock
from pipelines.cli.dev_status import DevStatus, StatusReader, show_status
from pipelines.cli.dev_stop import stop_all
from pipelines.stopping import STOP_FILE_ENV, request_stop
from resources.local_databases import LocalDatabases, prepare_local_databases, psycopg2_url
from resources.private_files import make_private_dirs, open_private, private_home, write_private

__all__ = ["dagster_environment", "dev_command", "psycopg2_url"]  # psycopg2_url: tests and benches import it here

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "sample_corpus"
SAMPLE_TENANT = "demo"


def dagster_environment(home: Path, local: LocalDatabases) -> dict[str, str]:
    """Environment for the Dagster processes: the prepared databases, DAGSTER_HOME under KBINDEX_HOME."""
    dagster_home = make_private_dirs(home / "dagster")
    write_private(dagster_home / "dagster.yaml", (PROJECT_ROOT / "dagster.yaml").read_bytes())
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(dagster_home),
        DAGSTER_PG_URL=local.dagster_url,
        KBINDEX_HOME=str(home),
        KBINDEX_DATABASE_URL=local.kbindex_url,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    return event_batching.apply(env)  # the daemon writes each run's planned events (issue #14)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@app.command("dev")
def dev_command(
    port: int = typer.Option(3000, help="Dagster UI port."),
    host: str = typer.Option("127.0.0.1", help="Dagster UI host."),
    sample: bool = typer.Option(True, "--sample/--no-sample", help="Publish the sample corpus to tenant 'demo'."),
) -> None:
    """Start everything for local use: embedded PostgreSQL, migrations, Dagster UI + daemon with the sensor on.

    Dagster's own output goes to KBINDEX_HOME/logs/dagster.log; the terminal keeps a short live status.
    """
    from resources.blob_store import BlobStore
    from resources.database import Database
    from resources.embedding_service import start_service
    from resources.publisher import Publisher, PublishRequest
    from resources.settings import Settings

    settings = Settings.from_env()
    with errors_to_exit():
        private_home(settings.home)
        dev_lock = hold_dev_lock(settings.home)  # held until this process exits: one kbindex dev per home
        with console.status("starting PostgreSQL…"):
            local = prepare_local_databases(on_apply=lambda v: console.print(f"applied migration {v}"))
        env = dagster_environment(settings.home, local)
        if sample:
            with Database(local.kbindex_url, max_size=2) as db:
                publisher = Publisher(db, BlobStore(settings.blob_url))
                files = sorted(p for p in SAMPLE_CORPUS.iterdir() if p.is_file() and p.name != "ATTRIBUTION.md")
                publisher.publish_all(SAMPLE_TENANT, [  # due together: one run
                    PublishRequest(path.name, path.read_bytes(), path.name) for path in files])
            console.print(f"published {len(files)} sample documents to tenant '{SAMPLE_TENANT}'")
        with Database(local.kbindex_url, max_size=1) as db:  # the service warms the model runs will ask for
            active = db.fetch_one("index_profile_active")
        if active and not str(active["model"]).startswith("http:"):
            env.setdefault("KBINDEX_EMBED_SERVICE_PRELOAD", str(active["model"]))
    logs = make_private_dirs(settings.home / "logs")  # 0700, the logs 0600: they quote documents and errors
    status = DevStatus(ui_url=f"http://{host}:{port}", log_path=logs / "dagster.log",
                       sample_tenant=SAMPLE_TENANT if sample else None)
    # SIGTERM (systemd, docker stop, kill) and SIGHUP (the terminal closed) shut down like Ctrl-C: Dagster and the
    # service stop with us. Dagster runs in its own session, so a hang-up never reaches it: without this, closing
    # the terminal killed kbindex dev and left Dagster running with nobody to stop it.
    # Ctrl-C is ours even when SIGINT came in ignored (started with `&` from a script, or under nohup): Dagster
    # maps SIGTERM to its SIGINT handler, so a `dagster dev` that inherited an ignored SIGINT ignored our stop too
    # and was killed after the 12 s grace, every time. A handler, unlike SIG_IGN, is not inherited by Dagster.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    # The warm model every run embeds through; runs load their own until it answers (it never blocks start-up).
    service = start_service(settings.home, env, wait=False, log=logs / "embedder.log")
    env["KBINDEX_EMBED_SERVICE"] = str(settings.home)
    # Created just before the stop: a claiming tick waiting for a publish ends its wait (pipelines/stopping.py).
    stop_file = settings.home / "dagster-stopping"
    stop_file.unlink(missing_ok=True)  # left by a kbindex dev killed while it stopped
    env[STOP_FILE_ENV] = str(stop_file)
    cmd = [sys.executable, "-m", "dagster", "dev", "-m", "pipelines.definitions", "-h", host, "-p", str(port)]
    # cwd = DAGSTER_HOME: dagster dev warns about (and ignores) a dagster.yaml in the working folder.
    # Its own process group, so stopping it reaches the webserver, daemon and code servers too.
    # umask 077: what Dagster writes under DAGSTER_HOME (storage, compute logs) is the owner's alone.
    with open_private(status.log_path, "ab") as log:
        log.write(f"\n==== kbindex dev started {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, env=env, cwd=env["DAGSTER_HOME"], start_new_session=True, umask=0o077,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    stop = threading.Event()
    board = threading.Thread(target=_show_status, args=(status, local.kbindex_url, stop), daemon=True)
    board.start()
    try:
        proc.wait()
    except KeyboardInterrupt:
        status.stopping = True
    finally:
        # Dagster's whole group and the service at once, one shared grace, SIGKILL only past it (dev_stop.py).
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abandon the stop half-way
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        request_stop(stop_file)
        report = stop_all(proc, service)
        stop_file.unlink(missing_ok=True)
        with open_private(status.log_path, "a") as log:
            log.write(f"==== {report.line()} ====\n")
        status.dagster_exit, status.stopped_in, status.killed = report.dagster_exit, report.seconds, report.killed
        stop.set()
        board.join(timeout=3)  # it draws the final state; a database call stuck past this is not worth waiting for
    dev_lock.close()
    code = report.dagster_exit
    raise typer.Exit(code if code > 0 else 0)


def _show_status(status: DevStatus, url: str, stop: threading.Event) -> None:
    from resources.database import Database

    with Database(url, max_size=1) as db:
        show_status(console, status, StatusReader(db), stop)
