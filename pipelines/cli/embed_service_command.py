"""`kbindex embed-service`: keep the embedding model warm for every run of this machine."""

from __future__ import annotations

import os

import typer

from pipelines.cli.app import app, console, errors_to_exit


@app.command("embed-service")
def embed_service_command(
    workers: int = typer.Option(0, min=0, help="Worker processes, each with its own model "
                                               "(0: KBINDEX_EMBED_WORKERS, else one per core)."),
    listen: str = typer.Option("", help="Also listen on TCP at HOST:PORT, same key (default "
                                        "KBINDEX_EMBED_SERVICE_LISTEN; none: Unix socket only). A wildcard "
                                        "host needs KBINDEX_EMBED_SERVICE_LISTEN_ANY=1."),
) -> None:
    """Serve the packaged model on a socket under KBINDEX_HOME until stopped (Ctrl-C).

    Dagster runs embed through it when KBINDEX_EMBED_SERVICE names the same folder (`kbindex dev`
    starts one and sets it), so no run waits for a model load or imports torch. With --listen, runs on
    other hosts reach it as KBINDEX_EMBED_SERVICE=tcp://HOST:PORT, given the same key
    (KBINDEX_EMBED_SERVICE_KEY, or a copy of the key file named by KBINDEX_EMBED_SERVICE_KEY_FILE).
    """
    from pipelines.domain.service_address import LISTEN_ANY_ENV, join_host_port, parse_listen
    from resources.embedding_service import default_workers, serve, socket_path
    from resources.settings import Settings, embed_service_listen

    settings = Settings.from_env()
    count = workers or default_workers()
    with errors_to_exit():
        try:
            address = (parse_listen(listen, allow_any=os.environ.get(LISTEN_ANY_ENV, "").strip() in ("1", "true", "yes"))
                       if listen else embed_service_listen())
        except ValueError as exc:
            console.print(str(exc))
            raise typer.Exit(2) from None
        where = f" and tcp://{join_host_port(*address)}" if address else ""
        console.print(
            f"embedding service on {socket_path(settings.home)}{where} with {count} worker(s); give Dagster runs "
            f"KBINDEX_EMBED_SERVICE={settings.home if not address else 'tcp://' + join_host_port(*address)}  "
            "(Ctrl-C stops it)"
        )
        try:
            serve(settings.home, workers=count, listen=address)
        except KeyboardInterrupt:
            pass
