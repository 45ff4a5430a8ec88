"""`kbindex embed-service`: keep the embedding model warm for every run of this machine."""

from __future__ import annotations

import typer

from pipelines.cli.app import app, console, errors_to_exit


@app.command("embed-service")
def embed_service_command(
    workers: int = typer.Option(0, min=0, help="Worker processes, each with its own model "
                                               "(0: KBINDEX_EMBED_WORKERS, else one per core)."),
) -> None:
    """Serve the packaged model on a socket under KBINDEX_HOME until stopped (Ctrl-C).

    Dagster runs embed through it when KBINDEX_EMBED_SERVICE names the same folder (`kbindex dev`
    starts one and sets it), so no run waits for a model load or imports torch.
    """
    from resources.embedding_service import default_workers, serve, socket_path
    from resources.settings import Settings

    settings = Settings.from_env()
    count = workers or default_workers()
    with errors_to_exit():
        console.print(
            f"embedding service on {socket_path(settings.home)} with {count} worker(s); give Dagster runs "
            f"KBINDEX_EMBED_SERVICE={settings.home}  (Ctrl-C stops it)"
        )
        try:
            serve(settings.home, workers=count)
        except KeyboardInterrupt:
            pass
