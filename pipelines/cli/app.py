"""The ``kbindex`` typer app, shared options and the one place errors become exit codes.

Exit codes (DESIGN.md): 0 success, 1 error, 2 usage, 3 conflict (an illegal transition).
Every listing command takes ``--json``. Command modules register themselves on ``app``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from pipelines.domain.errors import IllegalTransition, InvalidRequest, KbindexError, TaskNotFound
from resources.private_files import HomeNotOwned
from resources.settings import HomeNotFound

app = typer.Typer(
    name="kbindex",
    help="Keep a RAG knowledge base searchable while documents change.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The embedded PostgreSQL under KBINDEX_HOME.", no_args_is_help=True)
app.add_typer(db_app, name="db")

console = Console()
err_console = Console(stderr=True)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CONFLICT = 0, 1, 2, 3

JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON.")


def _default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=_default, ensure_ascii=False)


def print_json(obj: Any) -> None:
    sys.stdout.write(dumps(obj) + "\n")
    sys.stdout.flush()


HINTS = {
    "INDEX_WRITE_FAILED": "is PostgreSQL running? `kbindex db start`, or check KBINDEX_DATABASE_URL",
    "TASK_NOT_FOUND": "list tasks with `kbindex tasks`",
    "ILLEGAL_TRANSITION": "see the task's state with `kbindex task ID`",
}


def fail(exc: KbindexError) -> typer.Exit:
    """Print a KbindexError as ``error CODE: message`` plus what to do next; return the matching exit."""
    hint = None if "profile" in exc.data else HINTS.get(exc.code)
    err_console.print(f"[bold red]error[/] {exc.code}: {exc.message}" + (f"\n  next: {hint}" if hint else ""))
    if isinstance(exc, IllegalTransition):
        return typer.Exit(EXIT_CONFLICT)
    if isinstance(exc, InvalidRequest):
        return typer.Exit(EXIT_USAGE)
    return typer.Exit(EXIT_ERROR)


@contextmanager
def errors_to_exit() -> Iterator[None]:
    try:
        yield
    except (KbindexError,) as exc:
        raise fail(exc) from None
    except (HomeNotFound, HomeNotOwned) as exc:  # one line, never wrapped: the path (and whose it is) is the point
        code = "HOME_NOT_OWNED" if isinstance(exc, HomeNotOwned) else "HOME_NOT_FOUND"
        err_console.print(f"[bold red]error[/] {code}: {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_ERROR) from None


def database_url(*, start: bool = True, writes: bool = False) -> str:
    """The configured server's URL; the embedded one under KBINDEX_HOME is started on demand.

    Only a command that sets a home up or ``writes`` may create one (a new KBINDEX_HOME and PostgreSQL in it).
    A command that only reads gets HOME_NOT_FOUND instead: `kbindex task 1` typed in the wrong folder says so
    and creates nothing, rather than starting an empty database there.
    """
    from resources.settings import resolve_database_url

    return resolve_database_url(start=start, create=writes)


@contextmanager
def open_database(*, start: bool = True, writes: bool = False) -> Iterator[Any]:
    """A Database on the configured server (see ``database_url`` for ``writes``)."""
    from resources.database import Database

    with errors_to_exit():
        try:
            url = database_url(start=start, writes=writes)
        except RuntimeError as exc:
            raise InvalidRequest(str(exc)) from exc
        from resources.migrations import migrate, pending

        if pending(url):  # idempotent and advisory-locked: bring an older database up to date first
            migrate(url, on_apply=lambda v: err_console.print(f"applied migration {v}"))
        db = Database(url, min_size=1, max_size=4)
        try:
            yield db
        finally:
            db.close()


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        app(standalone_mode=True)
    except TaskNotFound as exc:  # pragma: no cover - commands use errors_to_exit
        raise SystemExit(fail(exc).exit_code) from None
