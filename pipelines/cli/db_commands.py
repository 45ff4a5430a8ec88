"""`kbindex db start|stop|url` and `kbindex migrate`."""

from __future__ import annotations

import typer

from pipelines.cli.app import app, console, database_url, db_app, err_console, errors_to_exit, print_json, JsonOption


@db_app.command("start")
def db_start(as_json: bool = JsonOption) -> None:
    """Start the embedded PostgreSQL (idempotent) and print its URL."""
    from resources import local_postgres
    from resources.settings import Settings

    settings = Settings.from_env()
    if settings.database_url:
        err_console.print("KBINDEX_DATABASE_URL is set: using that server, nothing to start.")
        url = settings.database_url
    else:
        with errors_to_exit(), console.status("starting PostgreSQL…"):
            url = local_postgres.start(settings.home)
    print_json({"url": url}) if as_json else console.print(url, highlight=False, soft_wrap=True)


@db_app.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL."""
    from resources import local_postgres
    from resources.settings import Settings

    settings = Settings.from_env()
    stopped = local_postgres.stop(settings.home)
    console.print("stopped" if stopped else "not running")


@db_app.command("url")
def db_url(as_json: bool = JsonOption) -> None:
    """Print the database URL in use (exit 1 if the embedded server is not running)."""
    with errors_to_exit():
        try:
            url = database_url(start=False)
        except RuntimeError:
            err_console.print("the embedded PostgreSQL is not running\n  next: `kbindex db start`")
            raise typer.Exit(1) from None
    print_json({"url": url}) if as_json else console.print(url, highlight=False, soft_wrap=True)


@app.command("migrate")
def migrate_command() -> None:
    """Apply pending SQL migrations (safe to run twice, and from two processes at once)."""
    from resources.migrations import migrate
    from resources.settings import resolve_database_url

    with errors_to_exit():
        url = resolve_database_url()
        applied = migrate(url, on_apply=lambda v: console.print(f"applied {v}"))
    console.print("up to date" if not applied else f"{len(applied)} migration(s) applied")
