"""`kbindex dev`: embedded PostgreSQL + migrations + sample corpus + Dagster UI/daemon, one command."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import typer

from pipelines.cli.app import app, console, errors_to_exit

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "sample_corpus"
SAMPLE_TENANT = "demo"


def psycopg2_url(url: str) -> str:
    """Dagster's storage needs an explicit psycopg2 URL (SQLAlchemy 2.1 maps postgresql:// to psycopg 3)."""
    scheme, sep, rest = url.partition("://")
    return "postgresql+psycopg2://" + rest.replace(":@", "@", 1) if sep else url


def dagster_environment(home: Path, url: str) -> dict[str, str]:
    """Environment for the Dagster processes: same database server, DAGSTER_HOME under KBINDEX_HOME."""
    from resources import local_postgres

    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    pg_url = os.environ.get("DAGSTER_PG_URL")
    if not pg_url:
        admin = local_postgres.with_database(url, "postgres")
        local_postgres.ensure_database(admin, "dagster")
        pg_url = psycopg2_url(local_postgres.with_database(url, "dagster"))
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(dagster_home),
        DAGSTER_PG_URL=pg_url,
        KBINDEX_HOME=str(home),
        KBINDEX_DATABASE_URL=url,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    return env


def _report_sample_progress(url: str, stop: threading.Event) -> None:
    """Print once the sample corpus is searchable (or what failed), so a newcomer knows when to search."""
    from resources.database import Database

    with Database(url, max_size=1) as db:
        while not stop.wait(2.0):
            rows = db.fetch_all("index_task_tenant_summary", {"tenant_id": SAMPLE_TENANT})
            counts = {r["status"]: r["n"] for r in rows}
            open_ = sum(n for s, n in counts.items() if s in ("PENDING", "RUNNING", "RETRY_WAIT"))
            if counts and open_ == 0:
                console.print(
                    f"[green]sample corpus indexed[/]: {counts.get('SUCCEEDED', 0)} searchable, "
                    f"{counts.get('DEAD', 0)} failed.  Try:  kbindex search \"how should docstrings be written\" --tenant {SAMPLE_TENANT}"
                )
                return


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _stop_group(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to dagster dev's process group, SIGKILL after 30 s: no webserver or code server outlives us."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is still there
    except ProcessLookupError:
        pass
    return proc.wait()


@app.command("dev")
def dev_command(
    port: int = typer.Option(3000, help="Dagster UI port."),
    host: str = typer.Option("127.0.0.1", help="Dagster UI host."),
    sample: bool = typer.Option(True, "--sample/--no-sample", help="Publish the sample corpus to tenant 'demo'."),
) -> None:
    """Start everything for local use: embedded PostgreSQL, migrations, Dagster UI + daemon with the sensor on."""
    from resources.blob_store import BlobStore
    from resources.database import Database
    from resources.embedding_service import start_service
    from resources.migrations import migrate
    from resources.publisher import Publisher
    from resources.settings import Settings, resolve_database_url

    settings = Settings.from_env()
    with errors_to_exit():
        with console.status("starting PostgreSQL…"):
            url = resolve_database_url(settings)
        migrate(url, on_apply=lambda v: console.print(f"applied migration {v}"))
        env = dagster_environment(settings.home, url)
        if sample:
            with Database(url, max_size=2) as db:
                publisher = Publisher(db, BlobStore(settings.blob_url))
                files = sorted(p for p in SAMPLE_CORPUS.iterdir() if p.is_file() and p.name != "ATTRIBUTION.md")
                for path in files:
                    publisher.publish(SAMPLE_TENANT, path.name, path.read_bytes(), path.name)
            console.print(f"published {len(files)} sample documents to tenant '{SAMPLE_TENANT}'")
    console.print(
        f"Dagster UI: http://{host}:{port}  (sensor 'claim_index_tasks' is on; runs appear under Runs)\n"
        f"Search:     kbindex search \"QUERY\" --tenant {SAMPLE_TENANT}\n"
        f"Progress:   kbindex tasks   |   kbindex stats   |   Ctrl-C stops Dagster (`kbindex db stop` stops PostgreSQL)"
    )
    stop = threading.Event()
    if sample:
        threading.Thread(target=_report_sample_progress, args=(url, stop), daemon=True).start()
    # SIGTERM (systemd, docker stop, kill) shuts down like Ctrl-C: Dagster and the service stop with us.
    signal.signal(signal.SIGTERM, _interrupt)
    # The warm model for small runs; runs load their own until it answers (it never blocks start-up).
    service = start_service(settings.home, env, wait=False, log=settings.home / "embedder.log")
    env["KBINDEX_EMBED_SERVICE"] = str(settings.home)
    cmd = [sys.executable, "-m", "dagster", "dev", "-m", "pipelines.definitions", "-h", host, "-p", str(port)]
    # cwd = DAGSTER_HOME: dagster dev warns about (and ignores) a dagster.yaml in the working folder.
    # Its own process group, so stopping it reaches the webserver, daemon and code servers too.
    proc = subprocess.Popen(cmd, env=env, cwd=env["DAGSTER_HOME"], start_new_session=True)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        code = _stop_group(proc)
    finally:
        stop.set()
        service.terminate()
        try:
            service.wait(timeout=10)
        except subprocess.TimeoutExpired:
            service.kill()
        time.sleep(0.1)
    raise typer.Exit(code if code and code > 0 else 0)
