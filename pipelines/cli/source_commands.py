"""`kbindex source add|list|sync|remove`: folders and buckets whose files a tenant's documents follow.

Only ``add`` may create a KBINDEX_HOME: the others need a source, so a home that does not exist is HOME_NOT_FOUND.
"""

from __future__ import annotations

import typer
from rich.table import Table

from pipelines.cli.app import EXIT_ERROR, JsonOption, app, console, err_console, errors_to_exit, open_database, print_json

source_app = typer.Typer(help="Sources: a folder or bucket (fsspec URL) whose files a sensor keeps in the index.",
                         no_args_is_help=True)
app.add_typer(source_app, name="source")


def _sources(db):
    from resources.blob_store import BlobStore
    from resources.chunk_copy import fast_publish_for
    from resources.publisher import Publisher
    from resources.settings import Settings
    from resources.source_sync import SourceSync

    return SourceSync(db, Publisher(db, BlobStore(Settings.from_env().blob_url), fast=fast_publish_for(db)))


@source_app.command("add")
def add_command(
    name: str = typer.Argument(..., help="Source name: lower-case letters, digits, '_', '.', '-'."),
    tenant: str = typer.Option(..., "--tenant", help="Tenant whose documents the source's files become."),
    url: str = typer.Option(..., "--url", help="Any fsspec URL: a local folder, s3://bucket/prefix, ..."),
    glob: str = typer.Option("**", "--glob", help="Which files, relative to the URL (`**/*.md`; default: all)."),
    max_delete_share: float = typer.Option(0.2, "--max-delete-share",
                                           help="A pass that would delete more than this share deletes nothing."),
    prefix: str = typer.Option("", "--prefix",
                               help="Put before each relative path to make the document id (`hr/`): needed when "
                                    "another source of the tenant could have the same relative paths."),
    as_json: bool = JsonOption,
) -> None:
    """Register a source. The sensor syncs it on its interval; `kbindex source sync NAME` syncs it now.

    Refused with SOURCE_OVERLAP (exit 2) if another source of the tenant could name the same documents."""
    with open_database(writes=True) as db, errors_to_exit():
        source = _sources(db).add(name, tenant, url, glob, max_delete_share, id_prefix=prefix)
    if as_json:
        print_json(source.to_dict())
    else:
        ids = f", document ids {source.id_prefix}PATH" if source.id_prefix else ""
        console.print(f"added source {source.name}: {source.url} ({source.glob}{ids}) -> tenant {source.tenant_id}; "
                      f"next: `kbindex source sync {source.name}`", highlight=False, soft_wrap=True)


@source_app.command("list")
def list_command(as_json: bool = JsonOption) -> None:
    """Sources with their tenant, location, ledger size, failing files and last pass."""
    with open_database() as db, errors_to_exit():
        sources = _sources(db).list()
    if as_json:
        print_json([s.to_dict() for s in sources])
        return
    table = Table("name", "tenant", "url", "glob", "files", "failing", "passes", "last pass")
    for s in sources:
        last = "never" if s.last_pass is None else f"{s.last_pass_at:%Y-%m-%d %H:%M:%S}: " + _summary(s.last_pass)
        glob = f"{s.glob} (ids {s.id_prefix}PATH)" if s.id_prefix else s.glob
        table.add_row(s.name, s.tenant_id, s.url, glob, f"{s.files:,}", _failing(s), str(s.passes), last)
    console.print(table)


def _failing(source) -> str:
    """``3 (DOCUMENT_TOO_LARGE 2, SOURCE_FILE_UNREADABLE 1)``: files left alone until they change."""
    if not source.failing:
        return "0"
    codes = ", ".join(f"{code} {n:,}" for code, n in sorted((source.failing_codes or {}).items()))
    return f"{source.failing:,} ({codes})"


def _summary(report: dict) -> str:
    from pipelines.domain.source_sync import PassCounts

    return PassCounts(**{k: v for k, v in report.items() if k in PassCounts.__dataclass_fields__}).summary()


@source_app.command("sync")
def sync_command(
    name: str = typer.Argument(..., help="The source to sync now."),
    allow_mass_delete: bool = typer.Option(False, "--allow-mass-delete",
                                           help="Delete even if the listing is empty or more than the share vanished."),
    rehash: bool = typer.Option(False, "--rehash",
                                help="Also read and hash every file whose size and stamp did not move: finds a change "
                                     "that kept both (costs a read of the whole source)."),
    retry_failed: bool = typer.Option(False, "--retry-failed",
                                      help="Also try again every file that failed and has not changed since "
                                           "(after fixing its permissions or the tenant's quota)."),
    as_json: bool = JsonOption,
) -> None:
    """One pass now: publish new and changed files, delete documents whose files are gone."""
    with open_database() as db, errors_to_exit():
        sync = _sources(db)
        sync.get(name)  # unknown name: an error before any progress line

        def progress(stage: str, done: int, total: int) -> None:
            if as_json:
                return
            if stage == "listed":
                err_console.print(f"{name}: listed {total:,} files", highlight=False)
            elif done == total or done % 100 == 0:
                err_console.print(f"\r{name}: {stage} {done:,}/{total:,}", end="" if done < total else "\n",
                                  highlight=False)

        counts = sync.sync(name, allow_mass_delete=allow_mass_delete, on_progress=progress, rehash=rehash,
                           retry_failed=retry_failed)
    if as_json:
        print_json(counts.to_dict())
    else:
        console.print(f"{name}: {counts.summary()}", highlight=False, soft_wrap=True)
    if counts.list_error or counts.failed or counts.skipped:
        raise typer.Exit(EXIT_ERROR)


@source_app.command("remove")
def remove_command(name: str = typer.Argument(..., help="The source to forget."), as_json: bool = JsonOption) -> None:
    """Forget a source and its ledger. Its documents stay searchable: delete them with `kbindex delete` if meant."""
    with open_database() as db, errors_to_exit():
        removed = _sources(db).remove(name)
    if as_json:
        print_json({"name": name, "removed": removed})
    else:
        console.print(f"removed source {name}" if removed else f"no source named {name}: nothing to remove",
                      highlight=False)
