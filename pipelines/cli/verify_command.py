"""`kbindex verify [--json] [--claim-interval SECONDS]`: check DESIGN.md's invariants against the database.

Exit 0 when every check holds (warnings allowed), 1 on any violation or error.
"""

from __future__ import annotations

import typer
from rich.table import Table

from pipelines.cli.app import EXIT_ERROR, JsonOption, app, console, dumps, errors_to_exit, open_database, print_json


@app.command("verify")
def verify_command(
    claim_interval: float = typer.Option(
        30.0, "--claim-interval", min=0.0, help="Seconds a RUNNING task may sit past its lease before it counts as stuck."
    ),
    retention_days: float | None = typer.Option(
        None, "--retention-days", min=0.0,
        help="Chunks of versions superseded longer ago than this are a violation: retention is not keeping up "
        "(give its window plus its schedule interval; default: retained chunks are only a warning).",
    ),
    examples: int = typer.Option(5, "--examples", min=1, max=1000, help="Offending rows shown per check."),
    as_json: bool = JsonOption,
) -> None:
    """Check every invariant against the database; exit 1 and report each violation."""
    from resources.verifier import verify

    with open_database() as db, errors_to_exit():
        report = verify(
            db,
            claim_interval=claim_interval,
            retention_seconds=None if retention_days is None else retention_days * 86400.0,
            examples=examples,
        )
    if as_json:
        print_json(report.to_dict())
    else:
        _print_report(report)
    if not report.ok:
        raise typer.Exit(EXIT_ERROR)


def _print_report(report) -> None:
    failed = {v.check: v for v in report.violations + report.warnings}
    table = Table("check", "result", "rows")
    for name in report.checked:
        found = failed.get(name)
        if found is None:
            table.add_row(name, "[green]ok[/]", "0")
        elif found.severity == "violation":
            table.add_row(name, "[bold red]VIOLATION[/]", str(found.count))
        else:
            table.add_row(name, "[yellow]warning[/]", str(found.count))
    console.print(table)
    for found in report.violations + report.warnings:
        console.print(f"[bold]{found.severity} {found.check}[/]: {found.description} ({found.count} in all)", highlight=False)
        for example in found.examples:
            console.print(f"  {dumps(example)}", highlight=False, markup=False)
    if report.ok:
        console.print(f"[green]verify: {len(report.checked)} checks, no violations[/]"
                      + (f", {len(report.warnings)} warning(s)" if report.warnings else ""))
    else:
        console.print(f"[bold red]verify: {len(report.violations)} of {len(report.checked)} checks violated[/]")
