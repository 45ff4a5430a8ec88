"""`kbindex embed-service`: keep the embedding model warm for this machine's small runs."""

from __future__ import annotations

from pipelines.cli.app import app, console, errors_to_exit


@app.command("embed-service")
def embed_service_command() -> None:
    """Serve the packaged model on a socket under KBINDEX_HOME until stopped (Ctrl-C).

    Dagster runs of a few versions embed through it when KBINDEX_EMBED_SERVICE names the same folder
    (`kbindex dev` starts one and sets it), so a single publish never waits for a model load.
    """
    from resources.embedding_service import serve, socket_path
    from resources.settings import Settings

    settings = Settings.from_env()
    with errors_to_exit():
        console.print(
            f"embedding service on {socket_path(settings.home)}; give Dagster runs "
            f"KBINDEX_EMBED_SERVICE={settings.home}  (Ctrl-C stops it)"
        )
        try:
            serve(settings.home)
        except KeyboardInterrupt:
            pass
