"""`kbindex api [--host --port]`: the HTTP API and status page under uvicorn."""

from __future__ import annotations

import typer

from pipelines.cli.app import app, console, errors_to_exit


@app.command("api")
def api_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port."),
    tokens: str | None = typer.Option(
        None, "--tokens", help="Bearer-token file (JSON or TOML); default $KBINDEX_API_TOKENS."
    ),
    migrate_first: bool = typer.Option(True, "--migrate/--no-migrate", help="Apply pending migrations first."),
) -> None:
    """Serve the HTTP API and the status page (DB from KBINDEX_DATABASE_URL or the embedded server)."""
    import uvicorn

    from pipelines.api import create_app
    from resources.migrations import migrate
    from resources.settings import resolve_database_url

    with errors_to_exit():
        url = resolve_database_url()
        if migrate_first:
            migrate(url)
        api = create_app(url, tokens_file=tokens)
    console.print(f"kbindex API on http://{host}:{port}/  (OpenAPI: /docs)")
    uvicorn.run(api, host=host, port=port, log_level="info", proxy_headers=False)
