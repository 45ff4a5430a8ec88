"""`kbindex publish PATH... --tenant T [--document-id ID] [--meta K=V] [--allow PRINCIPAL] [--manifest FILE]`,
`kbindex delete DOCUMENT_ID --tenant T` and `kbindex erase DOCUMENT_ID --tenant T --yes`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import Progress

from pipelines.cli.app import EXIT_ERROR, EXIT_USAGE, app, console, err_console, errors_to_exit, open_database, print_json, JsonOption
from pipelines.domain.errors import InvalidMetadata, InvalidRequest, KbindexError

if TYPE_CHECKING:
    from resources.publisher import PublishResult


def iter_files(paths: list[Path], document_id: str | None) -> list[tuple[Path, str]]:
    """(file, document id) pairs: directories recurse; the id defaults to the path relative to the argument."""
    pairs: list[tuple[Path, str]] = []
    for root in paths:
        if root.is_dir():
            files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
            pairs.extend((f, f.relative_to(root).as_posix()) for f in files)
        elif root.is_file():
            pairs.append((root, root.name))
        else:
            raise InvalidRequest(f"no such file or directory: {root.name}")
    if document_id is not None:
        if len(pairs) != 1:
            raise InvalidRequest("--document-id needs exactly one file")
        pairs = [(pairs[0][0], document_id)]
    return pairs


@app.command("publish")
def publish_command(
    paths: list[Path] = typer.Argument(..., help="Files or directories (recursive)."),
    tenant: str = typer.Option(..., "--tenant", help="Tenant that owns the documents."),
    document_id: str | None = typer.Option(None, "--document-id", help="Document id (one file only)."),
    meta: list[str] = typer.Option(
        [], "--meta", help="Metadata key=value (a number, true/false, a date YYYY-MM-DD, or text; a key repeated "
        "makes a list). Part of the version: new metadata on the same bytes is a new version, indexed without "
        "re-embedding."),
    allow: list[str] = typer.Option(
        [], "--allow", help="Principal that may read the version (group:NAME, user:NAME); repeat for several. "
        "Without --allow the whole tenant may read it."),
    manifest: Path | None = typer.Option(
        None, "--manifest", help="A JSON file giving documents their own metadata and/or allow list, keyed by "
        'document id: {"a/b.md": {"metadata": {"title": "B"}, "allow": ["user:alice"]}}. A key an entry sets '
        "(null: none) replaces --meta/--allow for that document."),
    as_json: bool = JsonOption,
) -> None:
    """Publish document versions: store bytes, create each version and its PENDING index task."""
    from pipelines.domain.manifest import read_manifest
    from pipelines.domain.metadata import canonical_allow, metadata_from_args
    from resources.blob_store import BlobStore
    from resources.chunk_copy import fast_publish_for
    from resources.publisher import Publisher, PublishRequest, batched
    from resources.settings import Settings

    with errors_to_exit():
        pairs = iter_files(paths, document_id)
        metadata = metadata_from_args(meta)
        allowed = canonical_allow(allow) if allow else None
        overrides = read_manifest(_read_manifest(manifest) if manifest else None, {doc_id for _, doc_id in pairs},
                                  keyed_by="each document id (a file's path relative to the directory argument)")
    failures = 0
    with open_database(writes=True) as db, errors_to_exit():
        publisher = Publisher(db, BlobStore(Settings.from_env().blob_url), fast=fast_publish_for(db))
        with Progress(console=err_console, transient=True, disable=as_json or len(pairs) < 5) as progress:
            bar = progress.add_task("publishing", total=len(pairs))
            # Batches (publish_many): a directory's documents become due together, so the claiming sensor plans
            # them as a few big runs at once instead of a first small run and the rest a daemon loop later.
            for batch in batched(pairs, lambda pair: _size(pair[0])):
                refused: dict[int, KbindexError] = {
                    i: own.error for i, (_, doc_id) in enumerate(batch)
                    if (own := overrides.get(doc_id)) is not None and own.error is not None}
                read = [None if i in refused else _read(path) for i, (path, _) in enumerate(batch)]
                readable = [i for i, data in enumerate(read) if data is not None]
                requests = []
                for i in readable:
                    own = overrides.get(batch[i][1])
                    file_metadata, file_allow = own.apply(metadata, allowed) if own else (metadata, allowed)
                    requests.append(PublishRequest(batch[i][1], read[i], batch[i][0].name, metadata=file_metadata,
                                                   allow=file_allow))
                outcomes: dict[int, PublishResult | KbindexError] = {
                    **refused, **dict(zip(readable, publisher.publish_many(tenant, requests), strict=True))}
                for i, (path, doc_id) in enumerate(batch):
                    result = outcomes.get(i) or InvalidRequest(f"cannot read {path.name}: it vanished or is not "
                                                               "readable; check the file and publish it again")
                    if isinstance(result, KbindexError):
                        failures += 1
                        row = {"tenant": tenant, "document_id": doc_id, "error_code": result.code,
                               "message": result.message}
                        print_json(row) if as_json else err_console.print(
                            f"[red]{result.code}[/] {doc_id}: {result.message}")
                        continue
                    _print_published(result, as_json)
                progress.advance(bar, len(batch))
    if failures:
        raise typer.Exit(EXIT_ERROR)


def _read_manifest(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMetadata(f"the manifest {path.name} is not UTF-8 text") from exc
    except OSError as exc:
        raise InvalidRequest(f"cannot read the manifest {path.name}: {exc.strerror or exc}; check the path") from exc


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # _read finds it unreadable


def _print_published(result: PublishResult, as_json: bool) -> None:
    row = {
        "tenant": result.tenant_id,
        "document_id": result.document_id,
        "version": result.version,
        "task_id": result.task_id,
        "status": result.status,
        "created": result.created,
        "requeued": result.requeued,
        "metadata": result.metadata,
        "allow": result.allow,
    }
    if as_json:
        print_json(row)
    else:
        verb = "published" if result.created else "re-queued" if result.requeued else "unchanged"
        console.print(f"{verb} {result.document_id} v{result.version} task {result.task_id} {result.status}",
                      highlight=False)


@app.command("delete")
def delete_command(
    document_id: str = typer.Argument(..., help="The document to delete."),
    tenant: str = typer.Option(..., "--tenant", help="Tenant that owns the document."),
    as_json: bool = JsonOption,
) -> None:
    """Delete a document: a tombstone version and its PENDING task(s). Search serves the previous version until
    the tombstone is published, then returns nothing of it. Deleting again, or what was never published, says so."""
    from resources.blob_store import BlobStore
    from resources.chunk_copy import fast_publish_for
    from resources.publisher import Publisher
    from resources.settings import Settings

    with open_database(writes=True) as db, errors_to_exit():
        publisher = Publisher(db, BlobStore(Settings.from_env().blob_url), fast=fast_publish_for(db))
        result = publisher.delete(tenant, document_id)
    if as_json:
        print_json(result.to_dict())
    else:
        console.print(result.message, highlight=False, soft_wrap=True)


@app.command("erase")
def erase_command(
    document_id: str = typer.Argument(..., help="The document to erase."),
    tenant: str = typer.Option(..., "--tenant", help="Tenant that owns the document."),
    yes: bool = typer.Option(False, "--yes", help="Really erase: it cannot be undone."),
    vacuum: bool = typer.Option(False, "--vacuum", help="Then VACUUM the touched tables (reads each whole table)."),
    as_json: bool = JsonOption,
) -> None:
    """Erase a document: delete it, then purge every stored copy of every version (chunks, vectors, lexical rows,
    run artifacts, bytes no other document shares) and print a receipt. Cannot be undone: needs --yes."""
    if not yes:
        err_console.print(
            f"erase would delete {document_id} (tenant {tenant}) and purge every stored copy of every version of it: "
            "chunks and vectors, lexical rows and postings, run artifacts and its stored bytes (unless another "
            "document has the same bytes). It cannot be undone. Run again with --yes to erase.",
            highlight=False, soft_wrap=True,
        )
        raise typer.Exit(EXIT_USAGE)
    from resources.artifact_store import ArtifactStore
    from resources.blob_store import BlobStore
    from resources.eraser import Eraser
    from resources.settings import Settings

    settings = Settings.from_env()
    with open_database(writes=True) as db, errors_to_exit():
        receipt = Eraser(db, BlobStore(settings.blob_url), ArtifactStore(settings.artifacts_dir or settings.home / "artifacts")).erase(
            tenant, document_id, vacuum=vacuum)
    if as_json:
        print_json(receipt.to_dict())
        return
    console.print(receipt.message, highlight=False, soft_wrap=True)
    for item in receipt.not_removed:
        what = item.get("content_hash", "")[:12] or f"task {item.get('task_id')}"
        console.print(f"  not removed: {item['kind']} {what}: {item['why']}", highlight=False, soft_wrap=True)
